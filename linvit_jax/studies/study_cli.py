"""What the studies' command lines share: an argument parser whose errors are one line, the photos
of a folder, writing an output file (one line when it cannot be written), and a model's params
at another input size. studies/compounding.py and studies/window_share.py use them.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

import numpy as np

from linvit_jax.evaluation import photo_eval
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
    plot: Callable[[Mapping[str, Any], str], Any],
    format_table: Callable[[Mapping[str, Any]], str],
) -> int:
  """A study's CLI after parsing: run it, write --out (JSON) and --plot, print its table and what
  it wrote; a UserError is one line and exit status 2 (errors.say)."""
  try:
    results = run(args)
    if args.out:
      write(args.out, "--out", functools.partial(write_json, results))
    if args.plot:
      write(args.plot, "--plot", functools.partial(plot, results))
  except UserError as e:
    return errors.say(e)
  print(format_table(results))
  for path in (args.out, args.plot):
    if path:
      print(f"wrote {path}")
  return 0
