#!/usr/bin/env bash
# The benchmark tables on one CUDA GPU in at most ~8 minutes, cuDNN flash attention as the softmax
# baseline. Run from anywhere; writes bench/results/gpu_{speed,steps}.json, then bench/RESULTS.md
# (CPU and GPU sections) and bench/gpu_*.png.
#
#   bash bench/gpu.sh                  # needs jax with CUDA (see SETUP below)
#   BUDGET_S=300 bash bench/gpu.sh     # a shorter hard limit for the speed sweep
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
cd "$(dirname "$0")/.."
PY=${PY:-python}
BUDGET_S=${BUDGET_S:-390}

"$PY" - <<'EOF'
import jax
assert jax.default_backend() == "gpu", f"jax sees no GPU (backend {jax.default_backend()}); see SETUP"
print("devices:", jax.devices())
EOF

# Let several compiled programs and memory_analysis coexist instead of grabbing 75% up front.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
start=$(date +%s)
# Partial results are saved after every group, so a timeout still leaves a usable JSON.
timeout "$BUDGET_S" "$PY" -m bench.bench_speed --plan gpu --compile-workers 8 \
  --max-gb 120 --case-budget-s 60 || echo "bench_speed stopped early (rc=$?): partial table"
timeout 90 "$PY" -m bench.bench_steps --plan gpu || echo "bench_steps stopped early (rc=$?)"
"$PY" -m bench.report
echo "gpu.sh done in $(( $(date +%s) - start ))s"
