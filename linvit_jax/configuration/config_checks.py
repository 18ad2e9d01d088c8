"""The value checks of the shipped configs' `:arg` options, run by their get_config (through
`check_options`) right after parse_arg: a ValueError naming the option, before anything
runs (main.py prints it as one line; `linvit_jax.convert` raises it as an OptionError).

parse_arg checks each option's type; this module checks what a config file can without reading
`init` (ranges, choices, the photo folder). preflight checks the built config before compute (res
against the teacher's patch, the folder's splits, the k-NN set, the workdir).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Mapping
from typing import Any

from linvit_jax.configuration import config_lib
from linvit_jax.configuration import recipes

# convert_folder's numeric options: (test, the range in words). A value outside one is an error
# naming the option (a silent clamp would run another recipe).
_BETA = (lambda v, arg: math.isfinite(v) and v >= 0, "a Beta concentration, expected >= 0 (0: off)")
RANGES = {
    "max_images": (lambda v, arg: v >= arg.batch, "expected at least batch={batch} (one step)"),
    "batch": (lambda v, arg: v >= 1, "expected >= 1"),
    "distill_fraction": (lambda v, arg: 0 < v <= 1, "expected in (0, 1]"),
    "holdout": (lambda v, arg: 0 < v < 1, "expected a fraction in (0, 1) of the photos"),
    "align_start_weight": (lambda v, arg: 0 <= v < 1, "expected in [0, 1) (0: off)"),
    "align_ema": (lambda v, arg: 0 <= v < 1, "expected in [0, 1) (0: off)"),
    "align_average": (lambda v, arg: 0 <= v <= 1, "expected in [0, 1] (0: off)"),
    "distill_mixup": _BETA,
    "align_mixup": _BETA,
    "deploy_res": (lambda v, arg: v >= 0, "expected a resolution in px (0: off)"),
    "deploy_fraction": (lambda v, arg: 0 < v < 1, "expected in (0, 1), a share of the align steps"),
    "eval_images": (lambda v, arg: v >= 1, "expected >= 1"),
    "res": (lambda v, arg: v >= 1, "expected a positive multiple of the teacher's patch"),
    "softmax_layers": (
        lambda v, arg: v >= 0,
        "expected a count of layers >= 0 (0: none; at most the teacher's depth - 1)",
    ),
    "softmax_key_grid": (
        lambda v, arg: config_lib.key_grid_valid(v),
        "expected " + config_lib.KEY_GRID_FORMS,
    ),
    "num_features": (lambda v, arg: v >= 0, "expected >= 0 (0: the feature map's default)"),
    "window": (lambda v, arg: v == 0 or (v > 0 and v % 2 == 1), "expected 0 (off) or an odd size"),
    "sinks": (lambda v, arg: v >= 0, "expected >= 0 (0: off)"),
    "compose": (lambda v, arg: 0 <= v <= 1, "expected a fraction in [0, 1] (0: off)"),
    "knn_train": (lambda v, arg: v >= 1, "expected >= 1"),
    "knn_eval": (lambda v, arg: v >= 1, "expected >= 1"),
    "lr_distill": (lambda v, arg: math.isfinite(v) and v > 0, "expected a learning rate > 0"),
    "lr_align": (lambda v, arg: math.isfinite(v) and v > 0, "expected a learning rate > 0"),
    "align_warmup": (lambda v, arg: 0 <= v < 1, "expected a fraction in [0, 1) of align's steps"),
}


def align_steps(arg: Any) -> int:
  """The align stage's steps that convert_folder's budget leaves (before deploy_res's share)."""
  return (arg.max_images - int(arg.max_images * arg.distill_fraction)) // arg.batch


def ignored_options(arg: Any, defaults: dict[str, Any]) -> list[str]:
  """The options set away from their defaults that this run will not read: align's and
  deploy_res's when no align stage runs, the k-NN set's when knn is off, the softmax layers' when
  there are none (softmax_layers=0)."""
  no_align = arg.distill_fraction >= 1 or (align_steps(arg) == 0 and not arg.tiny)
  unread = []
  for name, default in defaults.items():
    if arg[name] == default:
      continue
    if no_align and name.startswith(("align_", "deploy_", "lr_align")):
      unread.append(name)
    elif arg.knn in ("", "none") and name.startswith("knn_"):
      unread.append(name)
    elif arg.softmax_layers == 0 and name in _SOFTMAX_LAYER_OPTIONS:
      unread.append(name)
  return unread


_SOFTMAX_LAYER_OPTIONS = ("softmax_pick", "softmax_pick_images", "softmax_key_grid")


def budget_note(arg: Any, defaults: dict[str, Any] | None = None) -> str:
  """One line when the budget drops the align stage that distill_fraction < 1 asks for, or when
  options are set that the run will not read; else ""."""
  unread = ignored_options(arg, defaults) if defaults else []
  if unread:
    reasons = [
        why
        for why, found in (
            (
                "no align stage runs",
                any(not n.startswith("knn_") and n not in _SOFTMAX_LAYER_OPTIONS for n in unread),
            ),
            ("knn is off", any(n.startswith("knn_") for n in unread)),
            ("softmax_layers=0", any(n in _SOFTMAX_LAYER_OPTIONS for n in unread)),
        )
        if found
    ]
    why = "; ".join(reasons)
    return f"options {', '.join(unread)} are set but not read ({why})"
  if arg.tiny or arg.distill_fraction >= 1 or align_steps(arg) > 0:
    return ""
  need = math.ceil(arg.batch / (1 - arg.distill_fraction))
  return (
      f"max_images={arg.max_images} leaves the align stage no step (distill_fraction="
      f"{arg.distill_fraction} and batch={arg.batch}): the run distils only; max_images >= "
      f"{need} keeps align (distill_fraction=1 says distillation only)"
  )


def convert_folder(arg: Any) -> None:
  """configs/convert_folder.py's options; preflight checks the rest (e.g. res against the
  teacher's patch)."""
  if not arg.init:
    raise ValueError("convert_folder needs init=<big_vision .npz, model folder or .safetensors>")
  if not arg.images:
    raise ValueError("convert_folder needs images=<folder of jpg/png photos>")
  for field, (ok, expected) in RANGES.items():
    if not ok(arg[field], arg):
      raise ValueError(f"{field}={arg[field]!r}: {expected.format(batch=arg.batch)}")
  choices = dict(gelu=("", "exact", "tanh"), norm=("", "source", *recipes.NORMS))
  augments = tuple(recipes.AUGMENTS)
  choices.update(distill_augment=augments, align_augment=augments)
  choices.update(softmax_pick_images=config_lib.SOFTMAX_PICK_IMAGES)
  if not config_lib.softmax_pick_valid(arg.softmax_pick):
    raise ValueError(
        f"softmax_pick={arg.softmax_pick!r}: expected one of {list(config_lib.SOFTMAX_PICKS)} or "
        "the layers themselves ('8', '4+8')"
    )
  for field, allowed in choices.items():
    if arg[field] not in allowed:
      raise ValueError(f"{field}={arg[field]!r}: expected one of {list(allowed)} (empty: default)")
  if isinstance(arg.align_lora, bool) or not isinstance(arg.align_lora, int) or arg.align_lora < 0:
    raise ValueError(f"align_lora={arg.align_lora!r}: expected a rank >= 0 (0: off)")
  if arg.align_average and arg.align_ema:
    raise ValueError("align_average and align_ema are two averages: choose one (the other 0)")
  for field in ("distill_mixup", "align_mixup"):
    if arg[field] and arg.batch < 2:
      raise ValueError(
          f"{field}={arg[field]} blends images within a batch: batch={arg.batch} (set {field}=0)"
      )
  if arg.deploy_res and arg.deploy_res != arg.res and not arg.tiny:
    at_deploy = int(align_steps(arg) * arg.deploy_fraction)
    if at_deploy == 0:
      raise ValueError(
          f"deploy_res={arg.deploy_res} trains the last deploy_fraction={arg.deploy_fraction} of "
          f"align's steps there, but the budget leaves align {align_steps(arg)} step(s) and that "
          "share none: raise max_images or deploy_fraction, or set deploy_res=0"
      )
  for field in ("images", "eval_folder"):
    if arg[field] and "://" not in arg[field] and not os.path.isdir(arg[field]):
      raise ValueError(f"{field}={arg[field]!r} is not a folder")
  if arg.eval_folder and os.path.realpath(arg.eval_folder) == os.path.realpath(arg.images):
    raise ValueError(
        "eval_folder= is the training folder: give a folder of other photos, or leave it empty "
        "(holdout= then keeps a share of images= aside)"
    )


def demo(arg: Any) -> None:
  """configs/demo.py's options."""
  if arg.align_lora and not arg.align_steps:
    raise ValueError(f"align_lora={arg.align_lora} needs the align stage (align_steps > 0)")


def _head(arg: Any, fresh: str) -> None:
  if arg.head not in ("keep", "fresh"):
    raise ValueError(f"head={arg.head!r}: expected keep or fresh ({fresh})")


def imagenet_vit(arg: Any) -> None:
  """configs/imagenet_vit.py's options."""
  _head(arg, "a new head, e.g. i21k → i1k")
  if arg.norm not in recipes.NORMS:
    raise ValueError(f"norm={arg.norm!r}: expected one of {sorted(recipes.NORMS)}")


def jft_vit(arg: Any) -> None:
  """configs/jft_vit.py's options."""
  _head(arg, "a new head of num_classes")


CHECKS: dict[str, Callable[[Any], None]] = dict(
    convert_folder=convert_folder, demo=demo, imagenet_vit=imagenet_vit, jft_vit=jft_vit
)


def check_options(config: str, arg: Any) -> None:
  """Raises a ValueError naming the first option of shipped config `config` (its file's stem)
  whose value `arg` holds out of range or out of its choices."""
  CHECKS[config](arg)


def say_budget(config: str, arg: Any, defaults: Mapping[str, Any]) -> None:
  """Logs one warning when shipped config `config`'s budget drops a stage its options ask for,
  or options are set that the run will not read (budget_note)."""
  note = budget_note(arg, dict(defaults)) if config == "convert_folder" else ""
  if note:
    logging.warning(note)
