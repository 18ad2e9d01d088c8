"""One attention layer at ViT-S/14 dims (width 384, 6 heads, batch 1), per operator and image size:
what the `window` exact-local hybrid costs next to the plain linear layer it extends (issue 49's
target: ≤ 1.3x the hedgehog_exp layer at 896 px, forward and forward+backward).

    python -m bench.window_speed                      # 224/448/896/1024 px -> bench/results/
    python -m bench.window_speed --px 28,42 --width 32 --heads 2 --reps 1 --out OUT.json
    python -m bench.window_speed --table bench/results/window_speed.json   # the markdown table

Rows: softmax, elu1 linear, hedgehog_exp linear (the default map), hedgehog_exp with window=3 and
window=5. Tokens per size: 1 cls + (px // 14)² patches (257, 1025, 4097, 5330), as
bench/bench_distill_real.py counts them. Forward is the jitted layer; forward+backward is the
gradient of a mean squared output error with respect to the input and every parameter. Within a
size every case runs round-robin (bench/common.py: time_interleaved, first call excluded), so the
ratio column (median of within-round ratios to hedgehog_exp) holds even on a busy machine; the
times themselves mean something on a quiet one only.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from bench import common
from linvit_jax.models import attention as attn_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PATCH = 14
BASELINE = "hedgehog_exp"  # the plain linear layer every ratio divides by
CASES = {
    "softmax": "softmax",
    "elu1": "elu1",
    "hedgehog_exp": "hedgehog_exp",
    "window3": {"kind": "linear", "feature_map": "hedgehog_exp", "window": 3},
    "window5": {"kind": "linear", "feature_map": "hedgehog_exp", "window": 5},
}
MODES = ("fwd", "fwd_bwd")


def build(case: str, tokens: int, width: int, heads: int) -> dict[str, Any]:
  """The compiled forward and forward+backward of one layer (cls + a square grid), as
  zero-argument calls."""
  keys = jax.random.split(jax.random.PRNGKey(0), 3)
  x = jax.random.normal(keys[0], (1, tokens, width))
  target = jax.random.normal(keys[1], (1, tokens, width))
  model = attn_lib.Attention(
      num_heads=heads, spec=attn_lib.parse_spec(CASES[case]), num_prefix_tokens=1
  )
  params = model.init(keys[2], x)["params"]

  def loss(p, x):
    return jnp.mean((model.apply({"params": p}, x) - target) ** 2)

  fwd = jax.jit(lambda p, x: model.apply({"params": p}, x)).lower(params, x).compile()
  fwd_bwd = jax.jit(jax.value_and_grad(loss, argnums=(0, 1))).lower(params, x).compile()
  return {"fwd": lambda: fwd(params, x), "fwd_bwd": lambda: fwd_bwd(params, x)}


def time_size(px: int, cases: Sequence[str], width: int, heads: int, reps: int) -> list[dict]:
  """Rows of one image size: per case and mode, the median ms and the ratio to BASELINE."""
  tokens = common.tokens_for(px, PATCH)
  calls = {}
  for case in cases:
    built = build(case, tokens, width, heads)
    for mode in MODES:
      calls[f"{case}/{mode}"] = built[mode]
  timings = common.time_interleaved(calls, reps=reps)
  rows = []
  for case in cases:
    for mode in MODES:
      wall = timings.wall[f"{case}/{mode}"]
      base = timings.wall.get(f"{BASELINE}/{mode}")
      rows.append(
          {
              "px": px,
              "tokens": tokens,
              "case": case,
              "mode": mode,
              "ms": 1e3 * common.median(wall),
              "times_s": wall,
              f"x_{BASELINE}": common.median_ratio(wall, base) if base else None,
          }
      )
      print(f"{px:5d} px {case:13s} {mode:8s} {rows[-1]['ms']:9.2f} ms", flush=True)
  return rows


def table(result: dict[str, Any]) -> str:
  """The markdown table of a result: a row per size and case, fwd and fwd+bwd side by side."""
  head = (
      f"| px | tokens | case | fwd ms | fwd+bwd ms | fwd × {BASELINE} | fwd+bwd × {BASELINE} |\n"
      "|---|---|---|---|---|---|---|\n"
  )
  by = {(r["px"], r["case"], r["mode"]): r for r in result["rows"]}
  lines = []
  for px, case in dict.fromkeys((r["px"], r["case"]) for r in result["rows"]):
    f, b = by[(px, case, "fwd")], by[(px, case, "fwd_bwd")]
    ratio = lambda r: common.fmt(r[f"x_{BASELINE}"]) + "×"  # noqa: E731
    lines.append(
        f"| {px} | {f['tokens']} | {case} | {f['ms']:.2f} | {b['ms']:.2f} | {ratio(f)} | {ratio(b)} |"
    )
  foot = common.result_footer(result)
  return head + "\n".join(lines) + "\n" + foot


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--px", default="224,448,896,1024", help="image sizes (patch 14)")
  parser.add_argument("--width", type=int, default=384)
  parser.add_argument("--heads", type=int, default=6)
  parser.add_argument("--reps", type=int, default=5)
  parser.add_argument("--cases", default=",".join(CASES))
  parser.add_argument("--out", default=os.path.join(REPO, "bench", "results", "window_speed.json"))
  parser.add_argument("--table", default="", help="print the table of this JSON and exit")
  args = parser.parse_args(argv)
  if args.table:
    result = common.load_result(args.table)
    print(table(result))
    return result
  cases = [c for c in args.cases.split(",") if c]
  unknown = sorted(set(cases) - set(CASES))
  if unknown:
    raise SystemExit(f"unknown case(s) {unknown}; known: {list(CASES)}")
  machine = common.machine_summary()  # the load average before this run adds its own
  rows = []
  for px in (int(p) for p in args.px.split(",") if p):
    rows += time_size(px, cases, args.width, args.heads, args.reps)
  result = {
      "machine": machine,
      "commit": common.git_commit(REPO),
      "date": time.ctime(),
      "shape": {"width": args.width, "heads": args.heads, "patch": PATCH, "batch": 1},
      "reps": args.reps,
      "rows": rows,
  }
  common.save_result(result, args.out, table)
  return result


if __name__ == "__main__":
  main()
