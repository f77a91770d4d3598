#!/usr/bin/env bash
# The CPU benchmark set of shared/ANCHORS.md, one results file per line under benchmarks/results/.
# Long: the peers' compile/convert alone is minutes per model; pass extra options through, e.g.
#   benchmarks/cpu_suite.sh --nf-backend cpu
set -euo pipefail
cd "$(dirname "$0")/.."
BENCH=${BENCH:-novaforge bench}
for model in gpt2 bert llama; do
    $BENCH --workload "$model" --runner all --batch 1,8 "$@"
done
$BENCH --workload gpt-42m --runner all "$@"
$BENCH --workload matmul --runner all "$@"
