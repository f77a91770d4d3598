"""The `novaforge` command line (also `python -m novaforge`).

    novaforge demo     compile a real model, compare with eager, print the compile report
    novaforge report   the same as one self-contained HTML page (tables, kernel graph, plots)
    novaforge cache    info | verify | clear [--older-than DAYS]: the on-disk kernel cache;
                       install-gemm: build this machine's GEMM library into the environment
    novaforge bench    benchmarks against eager, torch.compile, ONNX Runtime, OpenVINO (see --help)
    novaforge ops      the lowering table (which ATen ops become IR primitives, which go extern)
    novaforge fuzz     differential fuzzing against eager (--seeds N --backend cpu|triton; see --help)
    novaforge bisect   the pass and decision that make a model's compiled result differ (FILE.py[:NAME])
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="novaforge", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["demo", "report", "cache", "bench", "ops", "fuzz", "bisect"],
                        help="what to run")
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd == "bench":
        from .bench.cli import main as bench_main

        return bench_main(rest)
    if cmd == "demo":
        from .report.demo import main as demo_main

        return demo_main(rest)
    if cmd == "report":
        from .report.html_report import main as report_main

        return report_main(rest)
    if cmd == "cache":
        from .cache.admin import main as cache_main

        return cache_main(rest)
    if cmd == "ops":
        from .report.ops_table import main as ops_main

        return ops_main(rest)
    if cmd in ("fuzz", "bisect"):
        from .bisect import main as bisect_main
        from .fuzz.runner import main as fuzz_main

        return (fuzz_main if cmd == "fuzz" else bisect_main)(rest)
    parser.error(f"unknown command {cmd!r}")
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
