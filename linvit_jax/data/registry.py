"""The registry of preprocessing ops; op specs like `resize(224, method="area")` are parsed by
pp_spec.parse_op.

An op is registered as a *getter*: called with the spec's arguments, it returns `fn(data) -> data`
over a dict of tf tensors (one example, traced inside `tf.data.Dataset.map`).

    @register("flip_lr")
    @keyed(random=True)
    def get_flip_lr():
      return lambda image, seed: tf.image.stateless_random_flip_left_right(image, seed)

`keyed` lifts a function of one tensor to a function of the dict, adding big_vision's `key`,
`inkey`, `outkey` arguments (default "image"). Random ops are stateless: their seed comes from the
example's `_rng` entry, which the input pipeline sets from (seed, position in the stream); that is
what makes a seed reproduce the same augmentations, and skip-ahead land on the same ones.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from linvit_jax.data import pp_spec

Features = dict[str, Any]
Op = Callable[[Features], Features]

# Per-example stateless seed (shape [2] int64), consumed and split by random ops.
RNG_KEY = "_rng"

_GETTERS: dict[str, Callable[..., Op]] = {}


def register(name: str) -> Callable[[Callable[..., Op]], Callable[..., Op]]:
  """Registers an op getter under `name` (the name used in pp strings)."""

  def decorator(getter: Callable[..., Op]) -> Callable[..., Op]:
    if name in _GETTERS:
      raise ValueError(f"preprocessing op {name!r} is registered twice")
    _GETTERS[name] = getter
    return getter

  return decorator


def registered_ops() -> list[str]:
  return sorted(_GETTERS)


def take_seed(data: Features) -> tf.Tensor:
  """Returns a fresh stateless seed for one random op and advances the example's `_rng`."""
  if RNG_KEY not in data:
    # Outside the input pipeline (e.g. a pp fn called by hand) there is no per-example seed:
    # fall back to a stateful draw, random but not reproducible.
    return tf.random.uniform([2], maxval=tf.int32.max, dtype=tf.int32)
  new_rng, seed = tf.unstack(tf.random.experimental.stateless_split(data[RNG_KEY], 2))
  data[RNG_KEY] = new_rng
  return seed


def keyed(
    getter: Callable[..., Callable] | None = None,
    *,
    random: bool = False,
    default_key: str = "image",
):
  """Lifts a getter of `fn(x)` (`fn(x, seed)` if random) to one of `fn(data)`.

  The lifted getter accepts big_vision's `key=` (in and out) or `inkey=` / `outkey=`.
  """

  def lift(getter):
    @functools.wraps(getter)
    def lifted(
        *args, key: str | None = None, inkey: str = default_key, outkey: str = default_key, **kwargs
    ) -> Op:
      fn = getter(*args, **kwargs)
      src, dst = key or inkey, key or outkey

      def op(data: Features) -> Features:
        if src not in data:
          raise KeyError(f"no key {src!r} in the example (keys: {', '.join(sorted(data))})")
        data = dict(data)
        x = data[src]
        data[dst] = fn(x, take_seed(data)) if random else fn(x)
        return data

      return op

    return lifted

  return lift(getter) if getter is not None else lift


def get_op(spec: str) -> Op:
  """Builds the op for one spec; errors name the spec and say what is wrong."""
  name, args, kwargs = pp_spec.parse_op(spec)
  if name not in _GETTERS:
    raise ValueError(
        f"unknown preprocessing op {name!r} in {spec!r}; "
        f"known ops: {', '.join(registered_ops())}"
    )
  try:
    op = _GETTERS[name](*args, **kwargs)
  except (TypeError, ValueError) as err:
    raise ValueError(f"preprocessing op {spec!r}: bad argument: {err}") from None

  @functools.wraps(op)
  def named_op(data: Features) -> Features:
    try:
      return op(data)
    except (KeyError, TypeError, ValueError) as err:
      # Tracing errors otherwise surface deep inside tf.data without saying which op failed.
      msg = err.args[0] if isinstance(err, KeyError) and err.args else err
      raise ValueError(f"preprocessing op {spec!r} failed: {msg}") from err

  return named_op


# Argument validation shared by the ops (raised as ValueError -> "bad argument").
def size_pair(size: Any, what: str = "size") -> tuple[int, int]:
  """An int H or a pair (H, W) of positive ints, as (H, W)."""
  pair = (size, size) if isinstance(size, int) else size
  if (
      not isinstance(pair, (tuple, list))
      or len(pair) != 2
      or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in pair)
  ):
    raise ValueError(f"{what} must be a positive int or a pair of them, got {size!r}")
  return int(pair[0]), int(pair[1])
