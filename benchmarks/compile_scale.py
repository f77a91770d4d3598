"""Compile time at scale (issue 47): each case in a new process, cold (an empty kernel and graph
cache) then warm (the same cache), with peak RSS; the large architectures are built on the meta
device and compiled without weights (`compile_only`).

    PYTHONPATH=src python benchmarks/compile_scale.py --cases gpt2,llama-8b,llama-70b --runs 3

Cases:
  gpt2          GPT2Model(GPT2Config(use_cache=False)) with random weights, b1 x 128,
                novaforge.compile(model, freeze=True) and its first call
  llama-8b      LlamaModel of the Llama-3.1-8B architecture (32 layers, hidden 4096, 32/8 heads,
                FFN 14336, vocab 128256, use_cache=False), meta, compile_only, b1 x 128
  llama-8b-lm   LlamaForCausalLM of the same, default config (use_cache=True)
  llama-70b     the 70B architecture (80 layers, hidden 8192, 64/8 heads, FFN 28672)
Per case and state, the medians over runs of: the process's wall time, import time, compile time
(novaforge's own `total_s`), capture / passes / codegen seconds, peak RSS. `--no-replicate` sets
NOVAFORGE_REPLICATE_LAYERS=0 (every layer traced) for an A/B.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ARCHS = {
    "8b": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
               intermediate_size=14336, vocab_size=128256),
    "70b": dict(hidden_size=8192, num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
                intermediate_size=28672, vocab_size=128256),
}

CHILD = r"""
import json, resource, sys, time
t0 = time.perf_counter()
import torch, transformers as tf, novaforge
t_import = time.perf_counter() - t0
case, arch = sys.argv[1], json.loads(sys.argv[2])
ids = torch.randint(0, 1000, (1, 128), generator=torch.Generator().manual_seed(0))
t1 = time.perf_counter()
with torch.no_grad():
    if case == "gpt2":
        torch.manual_seed(0)
        model = tf.GPT2Model(tf.GPT2Config(use_cache=False)).eval()
        t1 = time.perf_counter()
        compiled = novaforge.compile(model, freeze=True)
        compiled(ids)
        stats = compiled.stats()
    else:
        lm = case.endswith("-lm")
        cfg = tf.LlamaConfig(**arch, max_position_embeddings=8192, **({} if lm else {"use_cache": False}))
        with torch.device("meta"):
            model = (tf.LlamaForCausalLM if lm else tf.LlamaModel)(cfg).eval()
        t1 = time.perf_counter()
        stats = novaforge.compile(model).compile_only(ids)
        assert all(p.device.type == "meta" for p in model.parameters())
t2 = time.perf_counter()
times = stats.times
print(json.dumps({"import_s": t_import, "compile_wall_s": t2 - t1, "total_s": times["total_s"],
                  "capture_s": times["capture_s"], "passes_s": times["passes_s"], "codegen_s": times["codegen_s"],
                  "layers_replayed": times.get("layers_replayed", 0), "graph_cache_hit": "graph_cache_hit" in times,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def run_case(case: str, cache: str, env: dict[str, str]) -> dict:
    arch = ARCHS.get(case.split("-")[1], {}) if case.startswith("llama") else {}
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", CHILD, case, json.dumps(arch)], capture_output=True, text=True,
                         env={**env, "NOVAFORGE_CACHE_DIR": cache}, check=False)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"{case} failed:\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["process_s"] = wall
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="gpt2,llama-8b,llama-8b-lm,llama-70b")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--no-replicate", action="store_true")
    ap.add_argument("--json", help="write the medians here")
    a = ap.parse_args()
    env = dict(os.environ)
    env.setdefault("PYTHONPATH", os.path.join(os.path.dirname(__file__), "..", "src"))
    if a.no_replicate:
        env["NOVAFORGE_REPLICATE_LAYERS"] = "0"
    print(f"load average before: {os.getloadavg()}")
    rows = []
    for case in a.cases.split(","):
        per_state: dict[str, list[dict]] = {"cold": [], "warm": []}
        for _ in range(a.runs):
            with tempfile.TemporaryDirectory() as cache:
                per_state["cold"].append(run_case(case, cache, env))
                per_state["warm"].append(run_case(case, cache, env))
        for state, results in per_state.items():
            med = {k: statistics.median(r[k] for r in results)
                   for k in ("process_s", "import_s", "compile_wall_s", "total_s", "capture_s", "passes_s",
                             "codegen_s", "peak_rss_mb")}
            med["layers_replayed"] = results[0]["layers_replayed"]
            med["graph_cache_hit"] = all(r["graph_cache_hit"] for r in results)
            rows.append({"case": case, "state": state, **med})
    print(f"load average after: {os.getloadavg()}")
    print(f"| case | state | process s | import s | compile s (wall) | novaforge total_s | capture | passes | codegen "
          f"| peak RSS MB | layers replayed | graph cache hit |\n|{'---|' * 12}")
    for r in rows:
        print(f"| {r['case']} | {r['state']} | {r['process_s']:.2f} | {r['import_s']:.2f} | {r['compile_wall_s']:.2f} "
              f"| {r['total_s']:.2f} | {r['capture_s']:.2f} | {r['passes_s']:.2f} | {r['codegen_s']:.2f} "
              f"| {r['peak_rss_mb']:.0f} | {r['layers_replayed']} | {r['graph_cache_hit']} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
