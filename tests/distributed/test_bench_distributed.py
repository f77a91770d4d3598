"""`novaforge bench --nproc N --parallel STYLE` (bench/distributed.py): usage errors exit 2 before
anything is launched, and the table renders results and failures. (A launch itself, through
torchrun, costs ~35 s for gpt-tiny: docs/distributed.md gives the command; not run here.)"""

from __future__ import annotations

from novaforge.bench import cli
from novaforge.bench.distributed import render


def test_distributed_usage_errors_exit_2():
    assert cli.main(["--workload", "gpt-tiny", "--nproc", "2"]) == 2  # no --parallel
    assert cli.main(["--workload", "gpt-tiny", "--parallel", "fsdp"]) == 2  # one process
    assert cli.main(["--workload", "gpt2", "--nproc", "2", "--parallel", "ddp"]) == 2  # not a training workload
    assert cli.main(["--workload", "gpt-tiny", "--nproc", "2", "--parallel", "tp", "--runner", "onnxruntime"]) == 2


def test_distributed_table_shows_each_rank_and_failures():
    text = render([{"workload": "gpt-tiny", "runner": "novaforge", "parallel": "fsdp", "nproc": 2,
                    "tokens_per_s": 1234.0, "ranks": [{"peak_rss_mib": 450.0}, {"peak_rss_mib": 452.0}]},
                   {"workload": "gpt-tiny", "runner": "eager", "parallel": "fsdp", "nproc": 2, "error": "boom"}])
    assert "1234" in text and "450, 452" in text
    assert "failed" in text and "boom" in text
