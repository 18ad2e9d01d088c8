#!/usr/bin/env bash
# The benchmark tables on one CUDA GPU in at most ~8 minutes, cuDNN flash attention as the softmax
# baseline. Writes gpu_speed.json, gpu_steps.json, RESULTS.md and the plots into OUT_DIR; copy the
# two JSON files into bench/results/ and run `python -m bench.report` to put them in
# bench/RESULTS.md next to the CPU run.
#
#   bash bench/gpu.sh OUT_DIR                  # needs jax with CUDA (see SETUP below)
#   BUDGET_S=300 bash bench/gpu.sh OUT_DIR     # a shorter hard limit for the speed sweep
#   PLAN=smoke bash bench/gpu.sh OUT_DIR       # the same script on CPU at toy size (the tests)
#
# SETUP on a fresh CUDA 12 machine (network needed once):
#   python -m venv .venv && . .venv/bin/activate
#   pip install -U "jax[cuda12]" && pip install -e ".[test]"
#
# What runs (bench/bench_speed.py, plan "gpu"): the issue's grid -- one attention layer and the
# whole ViT-S/16, forward and forward+backward, batch 8 (1 at 1792 px), at 224/448/896/1024/1792 px,
# for softmax, cudnn (jax.nn.dot_product_attention(implementation="cudnn")), chunked softmax and
# every linear feature map -- in bf16 matmuls, the reference being an 8192^3 bf16 matmul timed in
# the same rounds. Each group's operators compile in 8 threads (compiling is most of the time).
set -euo pipefail
OUT=${1:?usage: bash bench/gpu.sh OUT_DIR}
PLAN=${PLAN:-gpu}
cd "$(dirname "$0")/.."
PY=${PY:-python}
BUDGET_S=${BUDGET_S:-390}
mkdir -p "$OUT"

if [ "$PLAN" = gpu ]; then
  "$PY" - <<'PYEOF'
import jax
assert jax.default_backend() == "gpu", f"jax sees no GPU (backend {jax.default_backend()}); see SETUP"
print("devices:", jax.devices())
PYEOF
fi

# Let several compiled programs and memory_analysis coexist instead of grabbing 75% up front.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
start=$(date +%s)
# Partial results are saved after every group, so a timeout still leaves a usable JSON.
timeout "$BUDGET_S" "$PY" -m bench.bench_speed --plan "$PLAN" --compile-workers 8 --no-probes \
  --max-gb 120 --case-budget-s 60 --out "$OUT/gpu_speed.json" \
  || echo "bench_speed stopped early (rc=$?): partial table"
timeout 90 "$PY" -m bench.bench_steps --plan "$PLAN" --out "$OUT/gpu_steps.json" \
  || echo "bench_steps stopped early (rc=$?)"
"$PY" -m bench.report --results "$OUT" --out "$OUT" --notes ""
echo "gpu.sh done in $(( $(date +%s) - start ))s: $OUT"
