"""pp strings (`decode(1)|resize(224)|value_range(-1,1)|keep("image")`): the one parser of their
op specs (the TF op registry and the exported student's numpy pp both parse through it), and
edits of them as text.

No TensorFlow here: an exported student's preprocessing is read back where TF is not installed.
"""

from __future__ import annotations

import ast


def ops(pp: str) -> list[str]:
  """The op specs of a pp string, in order ('a|b(1)|' -> ['a', 'b(1)'])."""
  return [op.strip() for op in (pp or "").split("|") if op.strip()]


def parse_op(spec: str) -> tuple[str, tuple, dict]:
  """'name(1, b="x")' -> ('name', (1,), {'b': 'x'}); arguments must be Python literals. A
  ValueError names the spec and says what is wrong."""
  spec = spec.strip()
  try:
    node = ast.parse(spec, mode="eval").body
  except SyntaxError as err:
    raise ValueError(f"preprocessing op {spec!r}: cannot parse it ({err.msg})") from None
  if isinstance(node, ast.Name):
    return node.id, (), {}
  if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
    raise ValueError(f"preprocessing op {spec!r}: expected `name` or `name(args)`")
  try:
    args = tuple(ast.literal_eval(a) for a in node.args)
    kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
  except ValueError:
    raise ValueError(
        f"preprocessing op {spec!r}: arguments must be Python literals "
        "(numbers, strings, tuples, lists)"
    ) from None
  if None in kwargs:
    raise ValueError(f"preprocessing op {spec!r}: `**kwargs` is not supported")
  return node.func.id, args, kwargs


def parse(pp: str) -> list[tuple[str, tuple, dict]]:
  """'decode|resize(224, method="area")' -> [('decode', (), {}), ('resize', (224,), {...})]."""
  return [parse_op(spec) for spec in ops(pp)]


# pp ops that only augment or handle labels: not part of inference preprocessing.
TRAINING_ONLY_OPS = ("flip_lr", "onehot", "keep", "drop", "inception_crop", "random_crop")


def inference_pp(pp: str) -> str:
  """The image ops of an eval pp string (label and augmentation ops dropped), ending in
  keep("image")."""
  kept = [op for op in ops(pp) if op.split("(", 1)[0] not in TRAINING_ONLY_OPS]
  return "|".join(kept + ['keep("image")'])


def with_resize(pp: str, size: int) -> str:
  """The pp string with `resize(size)` after the geometric ops (before value_range)."""
  ops = pp.split("|")
  at = next((i for i, op in enumerate(ops) if "value_range" in op), len(ops))
  return "|".join(ops[:at] + [f"resize({size})"] + ops[at:])
