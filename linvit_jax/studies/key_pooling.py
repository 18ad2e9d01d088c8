r"""What pooling one softmax layer's keys costs, measured on the teacher itself: per layer, size and
key grid g, the teacher with that layer's patch keys pooled to at most g×g
(`AttentionSpec.key_grid`, convert_folder's `softmax_key_grid`) against the teacher unchanged.

    python -m linvit_jax.studies.key_pooling --teacher INIT --photos DIR [--res 224] \
        [--factors 2,4] [--grids 16,32] [--layers all] [--max_photos N] [--out key_pooling.json]

A hybrid student keeps a few layers softmax; at a larger size their N² attention is what costs
(at 896 px one softmax layer takes a ViT-S/14 student from about 4.5× to 3.6× its teacher's
speed). Pooling the layer's keys makes it O(N·g²), at a price that depends on how sharp the
layer's attention is over neighbouring patches. This study prices it without training anything:
the hybrid's softmax layer starts as the teacher's layer (and `align` may move it since), so its
cost here is the cost of pooling that layer in a student whose other layers were perfect. Which
layer to keep softmax, and at which g, can then be chosen on measured prices.

Per photo (the whole view, resized to the square size, position tables resampled from the
training grid), the cosine of the pooled teacher's final pooled feature (`cls`) and the mean
cosine of its patch tokens (`patch`) to the teacher's own (layer_swap.cosines_to); per layer the
mean and the lowest over photos. --layers "all" measures every layer alone, and also every layer
pooled at once (layer "every").

Results (plain JSON types):
  {"teacher", "photos", "res", "n_photos",
   "sizes": [{"res", "factor", "grid", "key_grid", "pooled_to", "upsampled",
              "layers": [{"layer", "cls", "cls_min", "patch", "patch_min"}]}]}
  ("cls" keys only when the teacher pools; pooled_to: the pooled grid's side, equal to grid
  when the grid is no wider than key_grid, and nothing is pooled).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from linvit_jax import compare
from linvit_jax.data import inference_pp
from linvit_jax.evaluation import layer_swap
from linvit_jax.evaluation import photo_eval
from linvit_jax.evaluation import photo_tokens
from linvit_jax.models import attention as attn_lib
from linvit_jax.models import attention_ops
from linvit_jax.studies import study_cli

EVERY = "every"  # the row of every layer pooled at once


class KeyPoolingError(study_cli.StudyError):
  """Inputs this study cannot use (a bad layer, grid or size); one line."""


def pooled(model: Any, layers: list[int], key_grid: int) -> Any:
  """`model` (softmax in every layer) with the patch keys of `layers` pooled to key_grid²."""
  specs = [attn_lib.AttentionSpec(kind="softmax")] * model.depth
  for l in layers:
    specs[l] = attn_lib.AttentionSpec(kind="softmax", key_grid=key_grid)
  return model.clone(attention=tuple(specs))


def parse_layers(text: str, depth: int) -> list[int | str]:
  """--layers: "all" (every layer alone, then every layer at once) or a list of indices."""
  if text == "all":
    return [*range(depth), EVERY]
  try:
    layers = [int(x) for x in text.split(",") if x]
  except ValueError:
    raise KeyPoolingError(
        f"--layers {text!r}: expected 'all' or layer indices such as 4,9"
    ) from None
  bad = [l for l in layers if not 0 <= l < depth]
  if bad or not layers:
    raise KeyPoolingError(f"--layers {text!r}: the teacher has layers 0..{depth - 1}")
  return layers


def layer_rows(
    teacher: Any,
    params: Any,
    batches: list[jax.Array],
    references: list[dict[str, jax.Array]],
    layers: list[int | str],
    key_grid: int,
) -> list[dict[str, Any]]:
  """Per entry of `layers`, the pooled teacher's cosines to the teacher's final tokens
  (`references`, one per batch of images), mean and lowest over the images."""
  rows = []
  for layer in layers:
    model = pooled(teacher, list(range(teacher.depth)) if layer == EVERY else [layer], key_grid)
    per_photo: dict[str, list[np.ndarray]] = {}
    for x, ref in zip(batches, references):
      for m, v in layer_swap.cosines_to(model, params, x, ref).items():
        per_photo.setdefault(m, []).append(np.asarray(v))
    row: dict[str, Any] = {"layer": layer}
    for m in ("cls", "patch"):
      if m in per_photo:
        values = np.concatenate(per_photo[m])
        row[m], row[f"{m}_min"] = float(values.mean()), float(values.min())
    rows.append(row)
  return rows


def parse_grids(text: str) -> list[int]:
  """--grids: key grid sides such as "16,32"."""
  try:
    grids = [int(x) for x in text.split(",") if x]
  except ValueError:
    raise KeyPoolingError(f"--grids {text!r}: expected numbers such as 16,32") from None
  if not grids or min(grids) <= 0:
    raise KeyPoolingError(f"--grids {text!r}: expected numbers > 0 such as 16,32")
  return grids


def run(args: argparse.Namespace) -> dict[str, Any]:
  """The study of one teacher on a folder of photos at each --factors × --res and --grids."""
  paths = study_cli.photo_paths(args.photos)[: args.max_photos or None]
  if not paths:
    raise KeyPoolingError(f"--photos {args.photos!r}: no photos in it")
  grids = parse_grids(args.grids)
  factors = compare.parse_factors(args.factors)
  teacher, params, pp = study_cli.load_teacher(args.teacher, args.res)
  layers = parse_layers(args.layers, teacher.depth)
  patch = tuple(teacher.patch_size)
  if patch[0] != patch[1]:  # key_grid pools a square grid
    raise KeyPoolingError(f"--teacher {args.teacher!r}: patch {patch} is not square")
  sizes = []
  for factor in factors:
    size = study_cli.size_at(args.res, factor, patch)
    view = inference_pp.Preprocess(photo_eval.view_pp("whole", size, photo_eval.value_ops(pp)))
    views, upsampled = photo_tokens.decode_views(paths, {"whole": view}, size)
    at = study_cli.params_at(params, patch, (args.res, args.res), size)
    batch = photo_tokens.batch_size(teacher, size)
    images = views["whole"]
    batches = [jnp.asarray(images[i : i + batch]) for i in range(0, len(images), batch)]
    references = [layer_swap.final_tokens(teacher, at, x) for x in batches]
    grid = size // patch[0]
    for key_grid in grids:
      sizes.append(
          {
              "res": size,
              "factor": factor,
              "grid": grid,
              "key_grid": key_grid,
              "pooled_to": attention_ops.pooled_grid_side(grid, key_grid),
              "upsampled": upsampled["whole"],
              "layers": layer_rows(teacher, at, batches, references, layers, key_grid),
          }
      )
      print(format_size(sizes[-1]), flush=True)
  return {
      "teacher": args.teacher,
      "photos": args.photos,
      "res": args.res,
      "n_photos": len(paths),
      "sizes": sizes,
  }


def _fmt(row: Mapping[str, Any], m: str) -> str:
  return f"{row[m]:.4f} ({row[m + '_min']:.4f})" if m in row else "-"


def format_size(block: Mapping[str, Any]) -> str:
  lines = [
      f"{block['res']} px ({block['grid']}² patches), keys pooled to {block['pooled_to']}² "
      f"(key_grid {block['key_grid']}): cosine to the teacher, mean (lowest)",
      "layer  cls               patch",
  ]
  for r in block["layers"]:
    lines.append(f"{str(r['layer']):>5}  {_fmt(r, 'cls'):17s} {_fmt(r, 'patch')}")
  return "\n".join(lines)


def format_table(results: Mapping[str, Any]) -> str:
  head = f"{results['n_photos']} photo(s) of {results['photos']}"
  return "\n".join([head] + [format_size(b) for b in results["sizes"]])


def main(argv: list[str] | None = None) -> int:
  parser = study_cli.Parser(
      prog="python -m linvit_jax.studies.key_pooling",
      description="Per layer, size and key grid: the teacher with one layer's keys pooled "
      "against the teacher.",
  )
  parser.add_argument("--teacher", required=True, help="the teacher: npz, model folder, hub name")
  parser.add_argument("--photos", required=True, help="a folder of photos")
  parser.add_argument("--res", type=int, default=224, help="the training size (px)")
  parser.add_argument("--factors", default="2,4", help="sizes as multiples of --res")
  parser.add_argument("--grids", default="16,32", help="key grids g (pooled to at most g×g)")
  parser.add_argument("--layers", default="all", help="'all' or layer indices such as 4,9")
  parser.add_argument("--max_photos", type=int, default=0, help="the first N photos (0: all)")
  parser.add_argument("--out", default="", help="write the results as JSON here")
  return study_cli.run_and_report(parser.parse_args(argv), run, None, format_table)


if __name__ == "__main__":
  sys.exit(main())
