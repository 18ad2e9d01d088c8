"""Label and dict ops, with big_vision's names and semantics.

onehot(depth, key="labels", key_result=None, multi=True, on=1.0, off=0.0)
    a scalar label -> one-hot float32 [depth]; a list of labels -> multi-hot [depth] (multi=True)
    or one one-hot row per label [n, depth] (multi=False).
keep(*keys)   keeps only these keys;  drop(*keys)   removes them.  A missing key is an error
    (a typo would otherwise silently drop the labels).  The internal `_rng` survives both; the
    pipeline removes it.
"""

from __future__ import annotations

import tensorflow as tf

from linvit_jax.data.registry import RNG_KEY
from linvit_jax.data.registry import Features
from linvit_jax.data.registry import Op
from linvit_jax.data.registry import register


def _check_depth(depth) -> None:
  if not isinstance(depth, int) or isinstance(depth, bool) or depth <= 0:
    raise ValueError(f"depth must be a positive int, got {depth!r}")


def multi_hot_vector(labels: tf.Tensor, depth: int, on: float = 1.0, off: float = 0.0) -> tf.Tensor:
  """A list of label ids -> float32 [depth] with `on` at each id (repeats count once).

  A scatter is cheaper than one_hot + reduce_max for thousands of classes. Ids outside [0, depth)
  raise at run time instead of being dropped, since they mean `depth` is wrong.
  """
  labels = tf.cast(tf.reshape(labels, [-1]), tf.int64)
  tf.debugging.assert_less(
      labels, tf.constant(depth, tf.int64), message=f"label id >= depth={depth}"
  )
  tf.debugging.assert_non_negative(labels, message="negative label id")
  hits = tf.scatter_nd(labels[:, None], tf.ones_like(labels, tf.float32), [depth])
  return tf.minimum(hits, 1.0) * (on - off) + off


@register("onehot")
def get_onehot(
    depth: int,
    key: str = "labels",
    key_result: str | None = None,
    multi: bool = True,
    on: float = 1.0,
    off: float = 0.0,
) -> Op:
  _check_depth(depth)

  def onehot(data: Features) -> Features:
    if key not in data:
      raise KeyError(f"no key {key!r} in the example (keys: {', '.join(sorted(data))})")
    labels = tf.cast(data[key], tf.int64)
    if labels.shape.rank and multi:
      out = multi_hot_vector(labels, depth, on, off)
    else:
      out = tf.one_hot(labels, depth, on_value=on, off_value=off, dtype=tf.float32)
    return {**data, key_result or key: out}

  return onehot


def _check_keys(keys: tuple, op: str) -> None:
  if not keys or not all(isinstance(k, str) for k in keys):
    raise ValueError(f"{op} needs key names (strings), got {keys!r}")


def _missing(data: Features, keys: tuple) -> None:
  missing = [k for k in keys if k not in data]
  if missing:
    raise KeyError(
        f"no key {', '.join(map(repr, missing))} in the example "
        f"(keys: {', '.join(sorted(data))})"
    )


@register("keep")
def get_keep(*keys: str) -> Op:
  _check_keys(keys, "keep")

  def keep(data: Features) -> Features:
    _missing(data, keys)
    return {k: v for k, v in data.items() if k in keys or k == RNG_KEY}

  return keep


@register("drop")
def get_drop(*keys: str) -> Op:
  _check_keys(keys, "drop")

  def drop(data: Features) -> Features:
    _missing(data, keys)
    return {k: v for k, v in data.items() if k not in keys}

  return drop
