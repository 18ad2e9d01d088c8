r"""Why a window hybrid's exact set loses ground at a larger grid: per layer and resolution, the
teacher's true softmax mass on the keys a window (and sinks) student treats exactly, beside the
student's own share of its exact set.

    python -m linvit_jax.studies.window_share --teacher INIT --photos DIR [--student EXPORT_DIR] \
        [--window W] [--sinks M] [--res 224] [--factors 1,2,4] [--max_photos N] \
        [--out window_share.json] [--plot window_share.png]

The exact set E(i) of a patch query i (models/exact_set.py) is every prefix key (cls,
registers), the w×w patch neighbourhood of i, and the m patch keys of largest centred norm (the
sinks). The neighbourhood is read off the hybrid's own tiling (`neighbourhood`:
grid_tiles.Tiling.band): clipped at the grid's border, not wrapped or shifted (a corner query
has ((w + 1) / 2)² window keys, an edge one (w + 1) / 2 · w), and the query's own patch is in it.
Sinks are chosen as exact_set.sink_indices chooses them, here from the teacher's keys; a sink
inside the window is counted once, in the window.

Per layer, means over images, patch query rows and heads of the teacher's softmax probability
on each part of E(i) (`layer_masses`, one layer's [B,H,N,N] at a time, reduced where made):

  teacher_prefix_mass   the prefix keys
  teacher_window_mass   the window's patches
  teacher_sinks_mass    the sinks outside the window (0 without sinks)
  teacher_exact_mass    E(i): the sum of the three

and `student_share`: evaluate.exact_shares, the mass the student's gate gives E(i) (its α, a
mean over the hybrid rows: the patch rows; with sinks also the prefix rows, P of N of them);
null for a layer without an exact set, or without --student.

The hypothesis it tests: DINOv2 puts much of its mass on the prefix tokens and on nearby
patches; at f× the size the grid has f² as many patches, a fixed w×w window covers an f² times
smaller part of the image, so the teacher's window mass falls, while a gate trained at one size
keeps its old share. Photos are the whole view (photo_eval's "whole": resized to the square
size) at each --res × factor, position tables resampled from the training grid.

The teacher: with --student, its architecture with softmax attention, params from --teacher
(`compare.load_teacher`), and the student's inference pp, window and sinks (a different
--window or --sinks is refused); without, the architecture --teacher's checkpoint decides
(exact GELU unless the source declares one, as convert_folder's default), its declared
normalisation (else ImageNet's), and --window, --sinks, --res as given.

Results (plain JSON types):
  {"teacher", "student" (or null), "photos", "window", "sinks", "res", "factors", "n_photos",
   "resolutions": [{"res", "factor", "grid", "n_photos", "upsampled",
                    "layers": [{"layer", "teacher_window_mass", "teacher_prefix_mass",
                                "teacher_sinks_mass", "teacher_exact_mass", "student_share"}]}]}
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import linvit_jax
from linvit_jax import compare
from linvit_jax.data import inference_pp
from linvit_jax.evaluation import evaluate
from linvit_jax.evaluation import photo_eval
from linvit_jax.evaluation import photo_tokens
from linvit_jax.evaluation import plots
from linvit_jax.models import attention_ops
from linvit_jax.models import exact_set
from linvit_jax.models import grid_tiles
from linvit_jax.models import probe
from linvit_jax.models import vit
from linvit_jax.studies import study_cli

MASSES = ("window", "prefix", "sinks", "exact")


class WindowShareError(study_cli.StudyError):
  """Inputs this study cannot use (a --window the student does not have, a bad size); one line."""


# ------------------------------------------------------------------------------- the teacher's mass


def neighbourhood(side: int, window: int) -> np.ndarray:
  """[M, M] bool, M = side² patches in row-major order: key patch j is in query patch i's w×w
  window, as the hybrid has it: read off grid_tiles' tiles and band (keys outside the grid
  masked, so the window is clipped at the border), padded query slots dropped."""
  tiles = grid_tiles.tiling(side, window)
  t, r, n = tiles.tile, tiles.radius, tiles.per_side
  q_row, q_col = tiles.positions()  # [T, X]
  y_row, y_col = np.divmod(np.arange((t + 2 * r) ** 2), t + 2 * r)
  tile_row, tile_col = np.divmod(np.arange(n * n), n)
  k_row = tile_row[:, None] * t + y_row[None] - r  # [T, Y]: each halo slot's grid row
  k_col = tile_col[:, None] * t + y_col[None] - r
  tile, x, y = np.nonzero(tiles.band())
  real = (q_row[tile, x] < side) & (q_col[tile, x] < side)
  tile, x, y = tile[real], x[real], y[real]
  out = np.zeros((side * side, side * side), bool)
  out[q_row[tile, x] * side + q_col[tile, x], k_row[tile, y] * side + k_col[tile, y]] = True
  return out


@functools.partial(jax.jit, static_argnames=("prefix", "sinks"))
def layer_masses(
    q: jax.Array, k: jax.Array, near: jax.Array | None, *, prefix: int, sinks: int
) -> dict[str, jax.Array]:
  """One softmax layer's attention mass per image [B] (mean over patch query rows and heads) on
  each part of the exact set (MASSES; module doc). q, k [B,N,H,Dh] as the layer sows them;
  `near` [M,M]: `neighbourhood` (None: no window)."""
  probs = attention_ops.softmax_weights(q[:, prefix:], k)  # the patch query rows [B,H,M,N]
  patch = probs[..., prefix:]  # [B,H,M,M]
  zero = jnp.zeros(patch.shape[:3], patch.dtype)
  out = {"prefix": jnp.sum(probs[..., :prefix], -1)}
  out["window"] = (
      zero if near is None else jnp.einsum("bhqk,qk->bhq", patch, near.astype(patch.dtype))
  )
  out["sinks"] = zero
  if sinks:
    idx = jnp.moveaxis(exact_set.sink_indices(k, prefix, sinks), 1, -1)[:, :, None]  # [B,H,1,m]
    on = jnp.take_along_axis(patch, jnp.broadcast_to(idx, (*patch.shape[:3], sinks)), -1)
    if near is not None:  # a sink inside the window is the window's
      on = on * (1 - near[jnp.arange(patch.shape[2])[:, None], idx].astype(on.dtype))
    out["sinks"] = jnp.sum(on, -1)
  out["exact"] = out["prefix"] + out["window"] + out["sinks"]
  return {name: jnp.mean(mass, axis=(1, 2)) for name, mass in out.items()}


@functools.partial(jax.jit, static_argnums=(0,))
def _queries_keys(model: Any, params: Any, images: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Every layer's sown q and k, [L,B,N,H,Dh] each."""
  _, state = model.apply({"params": params}, images, train=False, mutable=["intermediates"])
  sown = probe.sown_per_layer(state["intermediates"])
  return sown["q"], sown["k"]


def teacher_masses(
    model: Any,
    params: Any,
    images: np.ndarray,
    window: int,
    sinks: int = 0,
    batch_size: int = 8,
) -> list[dict[str, float]]:
  """Per layer of the softmax `model`, its attention mass on the exact set of a student with
  `window` and `sinks` ({m: mean over images} for m in MASSES); `params` with position tables at
  the images' grid. One forward per batch of `batch_size` images (the last one padded, so it
  compiles once) sows every layer's q and k; each layer's probabilities are then made and
  reduced by one jitted call, so one layer's [B,H,N,N] is held at a time."""
  if not len(images):
    raise WindowShareError("no images to measure")
  grid = (images.shape[1] // model.patch_size[0], images.shape[2] // model.patch_size[1])
  side = grid_tiles.grid_side(grid[0] * grid[1], "window") if window else 0
  near = jnp.asarray(neighbourhood(side, window)) if window else None
  batch_size = max(1, min(batch_size, len(images)))
  sums = None
  for start in range(0, len(images), batch_size):
    chunk = np.asarray(images[start : start + batch_size], np.float32)
    n = len(chunk)
    padded = np.concatenate([chunk, np.zeros((batch_size - n, *chunk.shape[1:]), chunk.dtype)])
    q, k = _queries_keys(model, params, jnp.asarray(padded))
    part = []
    for layer in range(q.shape[0]):
      masses = layer_masses(q[layer], k[layer], near, prefix=model.num_prefix_tokens, sinks=sinks)
      part.append({m: float(np.sum(np.asarray(v)[:n])) for m, v in masses.items()})
    sums = part if sums is None else [{m: s[m] + p[m] for m in MASSES} for s, p in zip(sums, part)]
  return [{m: s[m] / len(images) for m in MASSES} for s in sums]


def student_shares(
    model: Any, params: Any, images: np.ndarray, batch_size: int = 8
) -> list[float | None]:
  """evaluate.exact_shares over every image in batches of `batch_size`, each batch's mean
  weighted by its size (None for a layer without an exact set)."""
  parts = []
  for start in range(0, len(images), max(1, batch_size)):
    chunk = np.asarray(images[start : start + batch_size], np.float32)
    parts.append((len(chunk), evaluate.exact_shares(model, params, chunk)))
  count = sum(n for n, _ in parts)
  return [
      None if share is None else sum(n * shares[l] for n, shares in parts) / count
      for l, share in enumerate(parts[0][1])
  ]


def layer_rows(
    masses: list[Mapping[str, float]], shares: list[float | None] | None
) -> list[dict[str, Any]]:
  """The per-layer rows of the results from `teacher_masses` and `student_shares` (or None)."""
  shares = shares or [None] * len(masses)
  return [
      {"layer": l, **{f"teacher_{m}_mass": row[m] for m in MASSES}, "student_share": share}
      for l, (row, share) in enumerate(zip(masses, shares))
  ]


# ---------------------------------------------------------------------------------------- the CLI


@dataclasses.dataclass(frozen=True)
class _Models:
  """What a run measures: the teacher at `trained` px, the student export or None, the values
  pp, the exact set (window, sinks) and the base size."""

  teacher: Any
  teacher_params: Any
  student: Any
  trained: tuple[int, int]
  pp: str
  window: int
  sinks: int
  res: int


def exact_set_of(model: Any) -> tuple[int, int]:
  """(window, sinks) of a student's layers with an exact set, (0, 0) when none has one; layers
  with different ones are refused (one window per study)."""
  pairs = {(s.window, s.sinks) for s in vit.layer_specs(model) if s.window or s.sinks}
  if len(pairs) > 1:
    raise WindowShareError(f"the student's layers have different exact sets {sorted(pairs)}")
  return pairs.pop() if pairs else (0, 0)


def _with_student(args: argparse.Namespace) -> _Models:
  student = linvit_jax.load_student(args.student)
  window, sinks = exact_set_of(student.model)
  for name, given, own in (("window", args.window, window), ("sinks", args.sinks, sinks)):
    if given is not None and given != own:
      raise WindowShareError(
          f"--{name} {given}: the student's export has {name} {own}; leave --{name} out"
      )
  res = args.res or (student.training_size[0] if student.training_size else 0)
  if not res:
    raise WindowShareError(f"student '{args.student}' records no input size: pass --res")
  teacher, teacher_params = compare.load_teacher(args.teacher, student, res)
  trained = tuple(student.training_size or (res, res))
  pp = compare.student_pp(student)
  return _Models(teacher, teacher_params, student, trained, pp, window, sinks, res)


def _teacher_only(args: argparse.Namespace) -> _Models:
  if args.window is None or not args.res:
    raise WindowShareError("without --student, pass --window and --res")
  if args.window < 0 or (args.window and args.window % 2 == 0) or (args.sinks or 0) < 0:
    raise WindowShareError(
        f"--window {args.window} --sinks {args.sinks}: expected an odd window (0: none) and "
        "sinks >= 0"
    )
  teacher, params, pp = study_cli.load_teacher(args.teacher, args.res)
  res = (args.res, args.res)
  return _Models(teacher, params, None, res, pp, args.window, args.sinks or 0, args.res)


def _at_size(models: _Models, paths: list[str], factor: float) -> dict[str, Any]:
  """The results' row of one resolution."""
  patch = tuple(models.teacher.patch_size)
  size = study_cli.size_at(models.res, factor, patch)
  pp = photo_eval.view_pp("whole", size, photo_eval.value_ops(models.pp))
  views, upsampled = photo_tokens.decode_views(paths, {"whole": inference_pp.Preprocess(pp)}, size)
  images, batch = views["whole"], photo_tokens.batch_size(models.teacher, size)
  at = functools.partial(study_cli.params_at, patch=patch, trained=models.trained, size=size)
  masses = teacher_masses(
      models.teacher, at(models.teacher_params), images, models.window, models.sinks, batch
  )
  shares = None
  if models.student is not None:
    shares = student_shares(models.student.model, at(models.student.params), images, batch)
  return {
      "res": size,
      "factor": factor,
      "grid": [size // patch[0], size // patch[1]],
      "n_photos": len(paths),
      "upsampled": upsampled["whole"],
      "layers": layer_rows(masses, shares),
  }


def run(args: argparse.Namespace) -> dict[str, Any]:
  """The study of one teacher (and student) on a folder of photos at each --factors × --res."""
  paths = study_cli.photo_paths(args.photos)[: args.max_photos or None]
  if not paths:
    raise WindowShareError(f"--photos {args.photos!r}: no photos in it")
  factors = compare.parse_factors(args.factors)
  models = _with_student(args) if args.student else _teacher_only(args)
  where = {"teacher": args.teacher, "student": args.student or None, "photos": args.photos}
  return {
      **where,
      "window": models.window,
      "sinks": models.sinks,
      "res": models.res,
      "factors": list(factors),
      "n_photos": len(paths),
      "resolutions": [_at_size(models, paths, f) for f in factors],
  }


def _fmt(value: float | None) -> str:
  return "    -  " if value is None else f"{value:7.4f}"


def format_table(results: Mapping[str, Any]) -> str:
  """Per resolution, one line per layer: the teacher's masses and the student's share."""
  lines = [
      f"window {results['window']}, sinks {results['sinks']}, {results['n_photos']} photo(s); "
      "teacher softmax mass on the exact set (window, prefix, sinks, all) and the student's share"
  ]
  for block in results["resolutions"]:
    lines.append(f"{block['res']} px ({block['grid'][0]}×{block['grid'][1]} patches)")
    lines.append("layer  window  prefix   sinks   exact  student")
    for r in block["layers"]:
      values = [r[f"teacher_{m}_mass"] for m in MASSES] + [r["student_share"]]
      lines.append(f"{r['layer']:5d} " + " ".join(_fmt(v) for v in values))
  return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
  parser = study_cli.Parser(
      prog="python -m linvit_jax.studies.window_share",
      description="Per layer and resolution, the teacher's softmax mass on a window student's "
      "exact key set, beside the student's share of it.",
  )
  parser.add_argument("--teacher", required=True, help="the teacher: npz, model folder, hub name")
  parser.add_argument("--photos", required=True, help="a folder of photos")
  parser.add_argument("--student", default="", help="an export with window/sinks (optional)")
  parser.add_argument("--window", type=int, default=None, help="w (default: the student's)")
  parser.add_argument("--sinks", type=int, default=None, help="m (default: the student's, or 0)")
  parser.add_argument("--res", type=int, default=0, help="base size (default: the training size)")
  parser.add_argument("--factors", default="1,2,4", help="sizes as multiples of --res")
  parser.add_argument("--max_photos", type=int, default=0, help="the first N photos (0: all)")
  parser.add_argument("--out", default="", help="write the results as JSON here")
  parser.add_argument("--plot", default="", help="draw the per-layer masses as a PNG here")
  return study_cli.run_and_report(
      parser.parse_args(argv), run, plots.plot_window_share, format_table
  )


if __name__ == "__main__":
  sys.exit(main())
