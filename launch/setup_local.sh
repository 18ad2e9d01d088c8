#!/usr/bin/env bash
# Sets up this machine for linvit_jax: the embedded dataset (Debian package) and a virtualenv in
# .venv with the package and its test extras. Safe to run again: each step is skipped when done.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist >/dev/null
  else
    echo "Fashion-MNIST is missing: run 'sudo apt-get update && sudo apt-get install -y dataset-fashion-mnist'" >&2
    exit 1
  fi
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
if ! .venv/bin/python -c "import linvit_jax, jax, flax, optax, orbax.checkpoint, tensorflow_datasets, safetensors, pytest, xdist" 2>/dev/null; then
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e '.[test]'
fi
