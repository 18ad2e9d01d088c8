"""Whole ViT-S/14 students against their teacher, images/s at batch 1 (issue 49's ≥ 4× at 896 px):
the default linear student, and the hybrid with one softmax layer attending to every key or to
its patch keys pooled to at most g×g (`AttentionSpec.key_grid`, convert_folder's
`softmax_key_grid`).

    python -m bench.hybrid_speed                        # 224/448/896 px -> bench/results/
    python -m bench.hybrid_speed --px 28,56 --variant Ti/14 --reps 1 --out OUT.json   # a smoke run
    python -m bench.hybrid_speed --table bench/results/hybrid_speed.json   # the markdown table

Random weights (speed depends on the architecture only); the linear layers are the README
student's (hedgehog_exp, centred keys, the depthwise conv of v); `--layer` is the softmax layer
(4: what `softmax_pick=sensitivity` chose on the shared ViT-S/14). Within a size every case runs
round-robin (bench/common.py: time_interleaved, first call excluded) and the ratio to the teacher
is the median of within-round ratios, so it holds on a busy machine; the times themselves mean
something on a quiet one only.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from typing import Any

import jax

from bench import common
from linvit_jax.models import attention as attn_lib
from linvit_jax.models import vit

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINEAR = attn_lib.AttentionSpec(
    kind="linear", feature_map="hedgehog_exp", center_keys=True, conv_v=True
)
# case -> (the softmax layer's key_grid, or None for no softmax layer; "teacher": all softmax)
CASES = {
    "teacher": "teacher",
    "linear": None,
    "hybrid": 0,
    "hybrid_keys32": 32,
    "hybrid_keys16": 16,
}


def specs(case: str, depth: int, layer: int) -> tuple[attn_lib.AttentionSpec, ...]:
  """Each layer's attention for a case."""
  grid = CASES[case]
  if grid == "teacher":
    return (attn_lib.AttentionSpec(kind="softmax"),) * depth
  out = [LINEAR] * depth
  if grid is not None:
    out[layer] = attn_lib.AttentionSpec(kind="softmax", key_grid=grid)
  return tuple(out)


def build(case: str, px: int, dims: dict[str, int], layer: int, batch: int = 1) -> Any:
  """The compiled forward of one whole model at px on `batch` images, as a zero-argument call."""
  model = vit.Model(
      num_classes=None,
      patch_size=(dims["patch"],) * 2,
      width=dims["width"],
      depth=dims["depth"],
      mlp_dim=dims["mlp"],
      num_heads=dims["heads"],
      pool_type="tok",
      posemb="sincos2d",
      attention=specs(case, dims["depth"], layer),
  )
  x = jax.random.normal(jax.random.PRNGKey(0), (batch, px, px, 3))
  params = jax.jit(model.init)(jax.random.PRNGKey(1), x)["params"]
  fwd = jax.jit(lambda p, x: model.apply({"params": p}, x)[0]).lower(params, x).compile()
  return lambda: fwd(params, x)


def time_size(
    px: int, cases: Sequence[str], dims: dict[str, int], layer: int, reps: int, batch: int = 1
) -> list:
  """Rows of one size: per case the median seconds per image and images/s over the teacher's."""
  calls = {case: build(case, px, dims, layer, batch) for case in cases}
  timings = common.time_interleaved(calls, reps=reps)
  rows = []
  for case in cases:
    wall = timings.wall[case]
    teacher = timings.wall.get("teacher")
    rows.append(
        {
            "px": px,
            "tokens": common.tokens_for(px, dims["patch"]),
            "case": case,
            "s": common.median(wall) / batch,
            "times_s": wall,
            "speedup": common.median_ratio(teacher, wall) if teacher else None,
        }
    )
    print(f"{px:5d} px {case:14s} {rows[-1]['s']:8.3f} s", flush=True)
  return rows


def table(result: dict[str, Any]) -> str:
  """The markdown table: a row per size and case."""
  head = "| px | tokens | case | s / image | images/s ÷ teacher's |\n|---|---|---|---|---|\n"
  lines = [
      f"| {r['px']} | {r['tokens']} | {r['case']} | {r['s']:.3f} | {common.fmt(r['speedup'])}× |"
      for r in result["rows"]
  ]
  foot = common.result_footer(result, f"{result['variant']}, softmax layer {result['layer']}")
  return head + "\n".join(lines) + "\n" + foot


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--px", default="224,448,896", help="image sizes (multiples of the patch)")
  parser.add_argument("--variant", default="S/14")
  parser.add_argument("--layer", type=int, default=4, help="the hybrid's softmax layer")
  parser.add_argument("--reps", type=int, default=3)
  parser.add_argument("--batch", type=int, default=1, help="images per forward")
  parser.add_argument("--cases", default=",".join(CASES))
  parser.add_argument("--out", default=os.path.join(REPO, "bench", "results", "hybrid_speed.json"))
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
  dims = common.vit_dims(args.variant)
  if not 0 <= args.layer < dims["depth"]:
    raise SystemExit(f"--layer {args.layer}: the {args.variant} model has {dims['depth']} layers")
  machine = common.machine_summary()
  rows = []
  for px in (int(p) for p in args.px.split(",") if p):
    rows += time_size(px, cases, dims, args.layer, args.reps, args.batch)
  result = {
      "machine": machine,
      "commit": common.git_commit(REPO),
      "date": time.ctime(),
      "variant": args.variant,
      "layer": args.layer,
      "reps": args.reps,
      "batch": args.batch,
      "rows": rows,
  }
  common.save_result(result, args.out, table)
  return result


if __name__ == "__main__":
  main()
