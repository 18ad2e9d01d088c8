"""What the studies' command lines share: an argument parser whose errors are one line, the photos
of a folder, writing an output file (one line when it cannot be written), a teacher checkpoint
on its own, and a model's params at another input size. The studies (compounding, window_share,
key_pooling) use them.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

import jax
import numpy as np

from linvit_jax import build
from linvit_jax.evaluation import photo_eval
from linvit_jax.models import vit
from linvit_jax.models import vit_checkpoint
from linvit_jax.runtime import errors
from linvit_jax.runtime.errors import UserError


class StudyError(UserError, ValueError):
  """Inputs a study cannot use (a bad folder, size or argument); one line."""


class Parser(argparse.ArgumentParser):
  """argparse's parser with one-line errors."""

  def error(self, message: str) -> NoReturn:
    self.exit(2, f"error: {message} (--help lists the arguments)\n")


def photo_paths(folder: str) -> list[str]:
  """Every photo of `folder` (photo_eval.scan's order)."""
  if not os.path.isdir(folder):
    raise StudyError(f"--photos {folder!r} is not a folder")
  index = photo_eval.scan(folder)
  return [index.path(i) for i in range(len(index.files))]


def write(path: str, what: str, write_to: Any) -> None:
  """`write_to(path)`; an OSError as one line naming the argument `what`."""
  try:
    write_to(path)
  except OSError as e:
    raise StudyError(f"{what} {path!r}: cannot write it ({e.strerror or e})") from None


def write_json(results: Mapping[str, Any], path: str) -> None:
  with open(path, "w") as f:
    json.dump(results, f, indent=1)


def load_teacher(init: str, res: int) -> tuple[Any, Any, str]:
  """(model, params, values pp) of a teacher checkpoint alone, as convert_folder reads it: the
  architecture its checkpoint decides (exact GELU unless the source declares one), softmax
  attention, params at `res` px, and its declared normalisation (else ImageNet's) after decode."""
  record = build.read_checkpoint(init)
  fields = vit_checkpoint.model_config_from_init({"gelu_approximate": False}, record)
  fields.pop("variant")
  teacher = vit.Model(**fields, attention="softmax")
  channels = vit_checkpoint.input_channels(record)
  images = np.zeros((1, res, res, channels), np.float32)
  shapes = jax.eval_shape(teacher.init, jax.random.PRNGKey(0), images)
  params = vit_checkpoint.load_vit_params(shapes["params"], record, fields)
  norm = build.norm_op(vit_checkpoint.infer_vit_config(record).get("preprocessing"), False, init)
  pp = f"decode|{norm}"
  if channels != 3:
    pp = build.decode_channels(pp, channels, "--teacher", init)
  return teacher, params, pp


def size_at(res: int, factor: float, patch: Sequence[int]) -> int:
  """--res × a --factors entry in px, which must be a whole multiple of the patch."""
  size = res * factor
  if size != int(size) or int(size) % patch[0] or int(size) % patch[1]:
    raise StudyError(f"--res {res} × {factor} = {size}: not a multiple of the patch {tuple(patch)}")
  return int(size)


def params_at(params: Any, patch: Sequence[int], trained: Sequence[int], size: int) -> Any:
  """`params` with the position table resampled from the training grid (`trained` px; the
  table's square grid when it is not that grid's) to `size` px's, as load_student does."""
  grid = (size // patch[0], size // patch[1])
  old = (trained[0] // patch[0], trained[1] // patch[1])
  table = np.shape(params.get("pos_embedding", np.zeros((1, 0, 1))))[1]
  return vit_checkpoint.with_posemb_grid(params, grid, old if old[0] * old[1] == table else None)


def run_and_report(
    args: argparse.Namespace,
    run: Callable[[argparse.Namespace], Mapping[str, Any]],
    plot: Callable[[Mapping[str, Any], str], Any] | None,
    format_table: Callable[[Mapping[str, Any]], str],
) -> int:
  """A study's CLI after parsing: run it, write --out (JSON) and --plot (a study without a plot
  passes None and has no --plot), print its table and what it wrote; a UserError is one line
  and exit status 2 (errors.say)."""
  plot_path = getattr(args, "plot", "") if plot else ""
  try:
    results = run(args)
    if args.out:
      write(args.out, "--out", functools.partial(write_json, results))
    if plot_path:
      write(plot_path, "--plot", functools.partial(plot, results))
  except UserError as e:
    return errors.say(e)
  print(format_table(results))
  for path in (args.out, plot_path):
    if path:
      print(f"wrote {path}")
  return 0
