"""big_vision-style preprocessing strings -> one function over a feature dict.

  fn = get_preprocess_fn('decode|inception_crop(224)|flip_lr|value_range(-1,1)|'
                         'onehot(1000, key="label", key_result="labels")|keep("image", "labels")')
  example = fn({"image": jpeg_bytes, "label": 3})   # tf ops: use inside tf.data.Dataset.map

Ops run left to right, separated by `|`; each is `name` or `name(args)` with Python-literal
arguments. The ops (see ops_image.py, ops_general.py, jft.py for arguments):

  images: decode, decode_jpeg_and_inception_crop, inception_crop, resize, resize_small,
          central_crop, random_crop, flip_lr, value_range, vgg_value_range, grayscale_to_rgb
  labels: onehot (one-hot, or multi-hot for a list), multi_hot (JFT-style id lists)
  dicts:  keep, drop

After `value_range(-1,1)` images are float32 in [-1, 1]. An unknown op, unparsable spec or bad
argument raises ValueError naming the spec. New ops: `@register("name")` (registry.py).
"""

from __future__ import annotations

from collections.abc import Callable

# Imported for their side effect: registering their ops.
from linvit_jax.data import jft as _jft  # noqa: F401
from linvit_jax.data import ops_general as _ops_general  # noqa: F401
from linvit_jax.data import ops_image as _ops_image  # noqa: F401
from linvit_jax.data import pp_spec
from linvit_jax.data.registry import RNG_KEY
from linvit_jax.data.registry import Features
from linvit_jax.data.registry import get_op
from linvit_jax.data.registry import register
from linvit_jax.data.registry import registered_ops

__all__ = ["get_preprocess_fn", "register", "registered_ops", "RNG_KEY"]


def get_preprocess_fn(pp_string: str | None) -> Callable[[Features], Features]:
  """Builds the preprocessing function of a pp string (empty or None: identity).

  All ops are built (and their arguments checked) here, not on the first example.
  """
  ops = [get_op(spec) for spec in pp_spec.ops(pp_string)]

  def preprocess(data: Features) -> Features:
    if not isinstance(data, dict):
      raise TypeError(f"preprocessing expects a dict of tensors, got {type(data).__name__}")
    for op in ops:
      data = op(data)
    return data

  return preprocess
