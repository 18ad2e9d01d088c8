"""One attention layer's forward and forward+backward, per feature map: where a linear layer's
time goes on this machine (the distillation step trains 12 of these, teacher-forced).

    python -m bench.bench_feature_map_layer                      # ViT-S/14 at 224 px, batch 8
    python -m bench.bench_feature_map_layer --tokens 65 --batch 2 --reps 3 --out OUT.json

Cases (all at ViT-S width, 6 heads, a cls token; loss = mean squared output error):

  softmax            the teacher's operator
  elu1               a fixed map, 64 features per head
  hedgehog_exp       the default map, per-head projection folded into q/k, 128 features
  hedgehog_exp_w32   the same at num_features=32 (64 features)
  pair_no_exp        hedgehog_exp's shapes with φ = [z, −z]: no exp, no normalisation
  single_exp_64      φ = exp(z): one half, no normalisation

The last two replace `HedgehogExp.features` for their case only, to split the map's cost into
its width (128 vs 64 features) and its elementwise work (exp, the max shift, the per-query
normalisations). Cases run round-robin (bench/common.py); compare within one run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from bench import common
from linvit_jax.models import attention as attn_lib
from linvit_jax.models import feature_maps

_REPLACED_FEATURES = {
    "pair_no_exp": lambda z, is_query=True: jnp.concatenate([z, -z], axis=-1),
    "single_exp_64": lambda z, is_query=True: jnp.exp(z),
}
CASES = {
    "softmax": "softmax",
    "elu1": "elu1",
    "hedgehog_exp": "hedgehog_exp",
    "hedgehog_exp_w32": {"kind": "linear", "feature_map": "hedgehog_exp", "num_features": 32},
    "pair_no_exp": "hedgehog_exp",
    "single_exp_64": "hedgehog_exp",
}


@contextlib.contextmanager
def _features(case: str):
  """HedgehogExp.features replaced for a decomposition case (traced inside, restored after)."""
  original = feature_maps.HedgehogExp.__dict__["features"]  # the staticmethod object itself
  if case in _REPLACED_FEATURES:
    feature_maps.HedgehogExp.features = staticmethod(_REPLACED_FEATURES[case])
  try:
    yield
  finally:
    feature_maps.HedgehogExp.features = original


def build(case: str, batch: int, tokens: int, width: int, heads: int) -> dict[str, Any]:
  """The jitted forward and forward+backward of one layer, compiled, with their arguments."""
  keys = jax.random.split(jax.random.PRNGKey(0), 3)
  x = jax.random.normal(keys[0], (batch, tokens, width))
  target = jax.random.normal(keys[1], (batch, tokens, width))
  model = attn_lib.Attention(
      num_heads=heads, spec=attn_lib.parse_spec(CASES[case]), num_prefix_tokens=1
  )
  with _features(case):
    params = model.init(keys[2], x)["params"]

    def loss(p, x):
      return jnp.mean((model.apply({"params": p}, x) - target) ** 2)

    fwd = jax.jit(lambda p, x: model.apply({"params": p}, x)).lower(params, x).compile()
    fwd_bwd = jax.jit(jax.value_and_grad(loss)).lower(params, x).compile()
  return {"fwd": lambda: fwd(params, x), "fwd_bwd": lambda: fwd_bwd(params, x)}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--tokens", type=int, default=257, help="1 + patches (257: 224 px, /14)")
  parser.add_argument("--width", type=int, default=384)
  parser.add_argument("--heads", type=int, default=6)
  parser.add_argument("--reps", type=int, default=20)
  parser.add_argument("--cases", default=",".join(CASES))
  parser.add_argument("--out", default="")
  args = parser.parse_args(argv)
  names = [c for c in args.cases.split(",") if c]
  unknown = sorted(set(names) - set(CASES))
  if unknown:
    raise SystemExit(f"unknown case(s) {unknown}; known: {list(CASES)}")
  calls = {}
  for name in names:
    built = build(name, args.batch, args.tokens, args.width, args.heads)
    calls[f"{name}/fwd"], calls[f"{name}/fwd_bwd"] = built["fwd"], built["fwd_bwd"]
  timings = common.time_interleaved(calls, reps=args.reps)
  rows = []
  for name in names:
    fwd = common.median(timings.wall[f"{name}/fwd"])
    fwd_bwd = common.median(timings.wall[f"{name}/fwd_bwd"])
    rows.append({"case": name, "fwd_ms": 1e3 * fwd, "fwd_bwd_ms": 1e3 * fwd_bwd})
    print(f"{name:18s} fwd {1e3 * fwd:8.2f} ms   fwd+bwd {1e3 * fwd_bwd:8.2f} ms", flush=True)
  result = {
      "machine": common.machine_summary(),
      "shape": {k: getattr(args, k) for k in ("batch", "tokens", "width", "heads", "reps")},
      "rows": rows,
  }
  if args.out:
    with open(args.out, "w") as f:
      json.dump(result, f, indent=1)
  return result


if __name__ == "__main__":
  main()
