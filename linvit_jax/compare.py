r"""An exported student against its teacher on photos it never saw (evaluation/photo_eval.py).

    python -m linvit_jax.compare --student WORKDIR --teacher INIT --photos DIR \
        [--val_photos DIR | --holdout 0.2 [--seen]] [--res 224] [--factors 1,2,4] [--out results.json]

The teacher is the student's own architecture with softmax attention, read from INIT at the
student's training size. Without --val_photos, the folder is split by image_folder's val / test
hash rule; with --holdout F, --photos is the run's own training folder and only its held-out
photos are used (test@F and val@F, as the run split them): the in-source figures beside a run's
cross-source ones (eval_folder=). --seen with --holdout F tests on the photos the run trained on
(train@F): the fit, beside the in-source and cross-source figures. Prints photo_eval's table
(fidelity, the dense measure, crop retrieval); --out writes its JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, NoReturn

import jax
import numpy as np

import linvit_jax
from linvit_jax.artifacts import export_format
from linvit_jax.evaluation import feature_cache
from linvit_jax.evaluation import photo_eval
from linvit_jax.models import vit
from linvit_jax.runtime import errors
from linvit_jax.runtime.errors import UserError


def load_teacher(init: str, student: Any, res: int) -> tuple[Any, Any]:
  """The student's own architecture with softmax attention, its params read from `init` (any
  source `vit.load` reads) at the student's training size (else res)."""

  fields = {**export_format.model_fields(student.config), "attention": "softmax"}
  model = vit.Model(**fields)
  h, w = student.training_size or (res, res)
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), np.zeros((1, h, w, student.channels)))
  return model, vit.load(shapes["params"], init, fields)


def student_pp(student: Any) -> str:
  """The student's own inference pp string; an old export that records none gets ImageNet's
  mean/std (the run's default)."""
  try:
    return student._pp_string()
  except export_format.ExportError:
    return "decode|vgg_value_range"


class _Parser(argparse.ArgumentParser):

  def error(self, message: str) -> NoReturn:
    self.exit(2, f"error: {message} (--help lists the arguments)\n")


def parse_factors(text: str) -> tuple[float, ...]:
  """--factors: sizes as positive multiples of a base size, e.g. "1,2,4" (whole numbers as int)."""
  try:
    out = tuple(float(f) for f in text.split(",") if f.strip())
  except ValueError:
    raise photo_eval.PhotoEvalError(
        f"--factors {text!r}: expected numbers separated by commas"
    ) from None
  if not out or any(not f > 0 for f in out):
    raise photo_eval.PhotoEvalError(f"--factors {text!r}: expected positive numbers, e.g. 1,2,4")
  return tuple(int(f) if f == int(f) else f for f in out)


def _run_cli(args: argparse.Namespace) -> dict[str, Any]:

  if not 0 < args.holdout <= 1:
    raise photo_eval.PhotoEvalError(f"--holdout {args.holdout}: expected a fraction in (0, 1]")
  if not os.path.isdir(args.photos):
    raise photo_eval.PhotoEvalError(f"--photos {args.photos!r} is not a folder")
  if args.seen and (args.val_photos or args.holdout == 1):
    raise photo_eval.PhotoEvalError(
        "--seen tests on the photos a run trained on: it needs --holdout F < 1 (the run's "
        "training folder and its holdout=), without --val_photos"
    )
  if args.val_photos:
    if not os.path.isdir(args.val_photos):
      raise photo_eval.PhotoEvalError(f"--val_photos {args.val_photos!r} is not a folder")
    index, val_index = photo_eval.scan(args.photos), photo_eval.scan(args.val_photos)
    test = [index.path(i) for i in range(len(index.files))]
    names, val = list(index.files), [val_index.path(i) for i in range(len(val_index.files))]
  else:  # F = 1: the whole folder halved; F < 1: a run's training folder, its held-out share
    test_split = "train" if args.seen else "test"
    test, val, names = photo_eval.split_folder(args.photos, args.holdout, test_split)
  if not test:
    raise photo_eval.PhotoEvalError(
        f"--photos {args.photos!r}: no test photo ({len(val)} photo(s), all for validation); "
        "add photos or pass --val_photos"
    )
  factors = parse_factors(args.factors)
  student = linvit_jax.load_student(args.student)
  res = args.res or (student.training_size[0] if student.training_size else 0)
  if not res:
    raise photo_eval.PhotoEvalError(f"student '{args.student}' records no input size: pass --res")
  teacher, teacher_params = load_teacher(args.teacher, student, res)
  pp = student_pp(student)
  return photo_eval.evaluate_photos(
      teacher,
      teacher_params,
      student.model,
      student.params,
      test,
      val,
      photo_eval.PhotoEvalSpec(pp=pp, res=res, factors=factors, min_photos=args.min_photos),
      test_names=names,
      cache=feature_cache.FeatureCache.from_env(),
  )


def main(argv: list[str] | None = None) -> int:
  parser = _Parser(
      prog="python -m linvit_jax.compare",
      description="An exported student against its teacher on photos never used in training.",
  )
  parser.add_argument("--student", required=True, help="the export folder (a run's workdir)")
  parser.add_argument("--teacher", required=True, help="the teacher: npz, model folder, hub name")
  parser.add_argument("--photos", required=True, help="the test photos (a folder)")
  parser.add_argument(
      "--val_photos", default="", help="validation photos; default: half of --photos by a hash"
  )
  parser.add_argument(
      "--holdout",
      type=float,
      default=1.0,
      help="--photos is the run's training folder: its test@F / val@F halves (the run's holdout="
      "; 1: the whole folder is held out)",
  )
  parser.add_argument(
      "--seen",
      action="store_true",
      help="with --holdout F < 1: test on the photos the run trained on (train@F), to tell how "
      "well it fits what it saw from how well it carries to photos it did not",
  )
  parser.add_argument("--res", type=int, default=0, help="base size (default: the training size)")
  parser.add_argument("--factors", default="1,2,4", help="sizes as multiples of --res")
  parser.add_argument(
      "--min_photos",
      type=int,
      default=photo_eval.DEFAULT_MIN_PHOTOS,
      help="fewer: a note, not an error",
  )
  parser.add_argument("--out", default="", help="write the results as JSON here")
  args = parser.parse_args(argv)
  try:
    results = _run_cli(args)
    if args.out:
      try:
        with open(args.out, "w") as f:
          json.dump(results, f, indent=1)
      except OSError as e:
        raise photo_eval.PhotoEvalError(
            f"--out {args.out!r}: cannot write it ({e.strerror or e})"
        ) from None
  except UserError as e:
    return errors.say(e)
  print(photo_eval.format_table(results))
  if args.out:
    print(f"wrote {args.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
