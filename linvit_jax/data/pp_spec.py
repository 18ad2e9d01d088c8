"""Edits of pp strings (`decode(1)|resize(224)|value_range(-1,1)|keep("image")`) as text.

No TensorFlow here: an exported student's preprocessing is read back where TF is not installed.
"""

from __future__ import annotations

# pp ops that only augment or handle labels: not part of inference preprocessing.
TRAINING_ONLY_OPS = ("flip_lr", "onehot", "keep", "drop", "inception_crop", "random_crop")


def inference_pp(pp: str) -> str:
  """The image ops of an eval pp string (label and augmentation ops dropped), ending in
  keep("image")."""
  ops = [op.strip() for op in pp.split("|") if op.strip()]
  kept = [op for op in ops if op.split("(", 1)[0] not in TRAINING_ONLY_OPS]
  return "|".join(kept + ['keep("image")'])


def with_resize(pp: str, size: int) -> str:
  """The pp string with `resize(size)` after the geometric ops (before value_range)."""
  ops = pp.split("|")
  at = next((i for i, op in enumerate(ops) if "value_range" in op), len(ops))
  return "|".join(ops[:at] + [f"resize({size})"] + ops[at:])
