"""The timing loop (warm-up, runs, time budget), strict JSON, machine facts."""

from __future__ import annotations

import json
import math
import time

from novaforge.bench import results as res
from novaforge.bench.measure import current_rss_mb, median, peak_rss_mb, time_calls


def _counting(sleep_s: float = 0.0):
    calls = []

    def call():
        if sleep_s:
            time.sleep(sleep_s)
        calls.append(len(calls))
        return len(calls)

    return call, calls


def test_warmup_then_runs_each_result_seen():
    call, calls = _counting()
    seen = []
    t = time_calls(call, sync=lambda: None, warmup=2, runs=5, budget_s=60, on_result=seen.append)
    assert t.warmup == 2 and len(t.times_ms) == 5 and not t.capped
    assert len(calls) == 7 and seen == [1, 2, 3, 4, 5, 6, 7]
    assert all(x >= 0 for x in t.times_ms)


def test_budget_caps_after_min_runs_and_says_so():
    call, _ = _counting(0.02)
    t = time_calls(call, sync=lambda: None, warmup=5, runs=50, budget_s=0.01, min_runs=3)
    assert len(t.times_ms) == 3 and t.capped
    assert t.warmup == 1  # warm-up also stops once a quarter of the budget is spent
    assert min(t.times_ms) >= 15


def test_energy_reader_gives_joules_per_call():
    call, _ = _counting()
    counter = iter([100.0, 130.0])
    t = time_calls(call, sync=lambda: None, warmup=0, runs=3, budget_s=60, energy=lambda: next(counter))
    assert t.energy_j == [10.0]


def test_median():
    assert median([3, 1, 2]) == 2
    assert median([4, 1, 2, 3]) == 2.5
    assert math.isnan(median([]))


def test_memory_readings_are_positive():
    assert peak_rss_mb() > 10
    assert 10 < current_rss_mb() <= peak_rss_mb() + 1


def test_results_json_is_strict():
    payload = {"a": float("nan"), "b": [float("inf"), 1.5, (1, 2)], "c": {3: {"x"}}, "d": None}
    text = res.dumps(payload)
    back = json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    assert back == {"a": None, "b": [None, 1.5, [1, 2]], "c": {"3": ["x"]}, "d": None}


def test_machine_and_versions():
    m = res.machine()
    assert m["cores_available"] >= 1 and m["cpu"]
    v = res.versions()
    assert "torch" in v and "novaforge" in v and "python" in v


def _fake_rapl(root, packages: dict[str, tuple[int, int]]) -> None:
    for name, (uj, wrap) in packages.items():
        d = root / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "energy_uj").write_text(f"{uj}\n")
        (d / "max_energy_range_uj").write_text(f"{wrap}\n")


def test_rapl_reader_sums_packages_unwraps_and_skips_subdomains(tmp_path):
    from novaforge.bench.measure import rapl_domains, rapl_energy_reader

    _fake_rapl(tmp_path, {"intel-rapl:0": (1_000_000, 10_000_000), "intel-rapl:1": (9_000_000, 10_000_000),
                          "intel-rapl:0:0": (5, 10_000_000)})  # a sub-domain (cores) is part of package 0
    assert [p.rsplit("/", 1)[1] for p, _ in rapl_domains(str(tmp_path))] == ["intel-rapl:0", "intel-rapl:1"]
    read = rapl_energy_reader(str(tmp_path))
    assert read() == 0.0
    (tmp_path / "intel-rapl:0" / "energy_uj").write_text("3500000\n")  # +2.5 J
    (tmp_path / "intel-rapl:1" / "energy_uj").write_text("500000\n")  # wrapped: +1.5 J
    assert math.isclose(read(), 4.0)
    (tmp_path / "intel-rapl:0" / "energy_uj").write_text("4000000\n")
    assert math.isclose(read(), 4.5)


def test_no_counter_says_so_and_estimates_nothing(tmp_path, monkeypatch):
    from novaforge.bench import measure

    assert measure.rapl_energy_reader(str(tmp_path / "absent")) is None
    monkeypatch.setattr(measure, "POWERCAP", str(tmp_path / "absent"))
    reader, what = measure.energy_counter("cpu")
    assert reader is None and what.startswith("none:") and "not estimated" in what
    _fake_rapl(tmp_path / "absent", {"intel-rapl:0": (7, 100)})
    reader, what = measure.energy_counter("cpu")
    assert reader is not None and what.startswith("RAPL")


def test_table_names_the_energy_counter():
    from novaforge.bench.table import render

    text = render({"rows": [], "options": {}, "energy_counter": "none: no RAPL counter"})
    assert "energy: none: no RAPL counter" in text
