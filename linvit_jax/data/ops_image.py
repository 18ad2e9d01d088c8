"""Image preprocessing ops, with big_vision's names, arguments and defaults.

Every op takes `key=` (or `inkey=`/`outkey=`), default "image". Images are HxWxC tensors; C may be 1
(Fashion-MNIST) or 3. Random ops (`inception_crop`, `decode_jpeg_and_inception_crop`, `random_crop`,
`flip_lr`) are stateless, seeded from the example's `_rng` (see registry.py).

  decode(channels=3, precise=False)        encoded bytes (JPEG/PNG/...) -> uint8 HxWxC
  decode_jpeg_and_inception_crop(size=None, area_min=5, area_max=100, ratio_min=0.75,
                                 ratio_max=1.33, method="bilinear", antialias=False)
                                           JPEG bytes -> crop, 3 channels
  inception_crop(size=None, area_min=5, area_max=100, ratio_min=0.75, ratio_max=1.33, ...)
  resize(size, method="bilinear", antialias=False)      size: H or (H, W); keeps the dtype
  resize_small(smaller_size, method="area", antialias=False)   shorter side -> smaller_size
  central_crop(crop_size=None)             None: the largest central square
  random_crop(crop_size)
  flip_lr()                                left-right flip with probability 1/2
  value_range(vmin=-1, vmax=1, in_min=0, in_max=255, clip_values=False)   -> float32
  vgg_value_range(mean=ImageNet RGB*255, std=ImageNet RGB*255)             -> float32
  grayscale_to_rgb()                       HxWx1 -> HxWx3
  color_jitter(brightness=0.4, contrast=0.4, saturation=0.2, hue=0.1, p=0.8)
                                           with probability p, random brightness / contrast /
                                           saturation / hue (DINO's strengths); keeps the dtype
  random_grayscale(p=0.2)                  with probability p, luma in all three channels
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from linvit_jax.data.registry import keyed
from linvit_jax.data.registry import register
from linvit_jax.data.registry import size_pair

_METHODS = (
    "area",
    "bicubic",
    "bilinear",
    "gaussian",
    "lanczos3",
    "lanczos5",
    "mitchellcubic",
    "nearest",
)


def _check_method(method: str) -> None:
  if method not in _METHODS:
    raise ValueError(f"resize method must be one of {', '.join(_METHODS)}; got {method!r}")


def _resize_keep_dtype(image: tf.Tensor, size, method: str, antialias: bool) -> tf.Tensor:
  # Like big_vision: clip and cast back (truncating) to the input dtype, so a uint8 image stays
  # uint8 and a teacher trained with big_vision sees bit-identical inputs.
  dtype = image.dtype
  out = tf.image.resize(image, size, method=method, antialias=antialias)
  if dtype.is_integer:
    out = tf.clip_by_value(out, dtype.min, dtype.max)
  return tf.cast(out, dtype)


@register("decode")
@keyed
def get_decode(channels: int = 3, precise: bool = False) -> Callable:
  """Decodes image bytes. `precise` uses the exact JPEG DCT (matches PIL / cv2)."""
  if channels not in (1, 3, 4):
    raise ValueError(f"channels must be 1, 3 or 4, got {channels!r}")

  def decode(data: tf.Tensor) -> tf.Tensor:
    if data.dtype != tf.string:
      raise ValueError(
          f"expects encoded image bytes (tf.string), got {data.dtype.name} "
          f"{data.shape}; the input pipeline leaves images encoded, decode them once"
      )
    if precise:  # decode_jpeg also reads PNG and GIF.
      image = tf.io.decode_jpeg(data, channels=channels, dct_method="INTEGER_ACCURATE")
    else:
      image = tf.io.decode_image(data, channels=channels, expand_animations=False)
    image.set_shape([None, None, channels])
    return image

  return decode


def _crop_box_args(area_min: float, area_max: float, ratio_min: float, ratio_max: float) -> dict:
  if not 0 < area_min <= area_max <= 100:
    raise ValueError(f"need 0 < area_min <= area_max <= 100 (percent), got {area_min}, {area_max}")
  if not 0 < ratio_min <= ratio_max:
    raise ValueError(f"need 0 < ratio_min <= ratio_max, got {ratio_min}, {ratio_max}")
  return dict(
      area_range=(area_min / 100, area_max / 100),
      aspect_ratio_range=(ratio_min, ratio_max),
      min_object_covered=0.0,  # No box to cover: any crop in the area/ratio ranges.
      use_image_if_no_bounding_boxes=True,
  )


def _sample_crop(shape: tf.Tensor, seed: tf.Tensor, box_args: dict):
  begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
      shape, tf.zeros([1, 0, 4], tf.float32), seed=seed, **box_args
  )
  return begin, size


def _inception_args(
    size=None,
    area_min: float = 5,
    area_max: float = 100,
    ratio_min: float = 0.75,
    ratio_max: float = 1.33,
    method: str = "bilinear",
    antialias: bool = False,
) -> tuple[dict, tuple[int, int] | None, str, bool]:
  """The arguments both Inception crops take, checked: (box args, size pair or None, the resize
  method, antialias). Random area (percent of the image) and aspect ratio, then a resize to
  `size` (none: the crop as it is)."""
  box_args = _crop_box_args(area_min, area_max, ratio_min, ratio_max)
  _check_method(method)
  return box_args, (size_pair(size) if size is not None else None), method, antialias


@register("inception_crop")
@keyed(random=True)
def get_inception_crop(*args: Any, **kwargs: Any) -> Callable:
  """Random crop of random area and aspect ratio (Inception-style), then resize to `size`
  (arguments: `_inception_args`)."""
  box_args, size, method, antialias = _inception_args(*args, **kwargs)

  def crop(image: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    begin, crop_size = _sample_crop(tf.shape(image), seed, box_args)
    out = tf.slice(image, begin, crop_size)
    out.set_shape([None, None, image.shape[-1]])  # tf.slice forgets the static channel count.
    return _resize_keep_dtype(out, size, method, antialias) if size else out

  return crop


@register("decode_jpeg_and_inception_crop")
@keyed(random=True)
def get_decode_jpeg_and_inception_crop(*args: Any, **kwargs: Any) -> Callable:
  """`inception_crop` fused with JPEG decoding: only the crop window is decoded (much faster)."""
  box_args, size, method, antialias = _inception_args(*args, **kwargs)

  def crop(data: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    begin, crop_size = _sample_crop(tf.image.extract_jpeg_shape(data), seed, box_args)
    window = tf.stack([begin[0], begin[1], crop_size[0], crop_size[1]])
    out = tf.image.decode_and_crop_jpeg(data, window, channels=3)
    return _resize_keep_dtype(out, size, method, antialias) if size else out

  return crop


@register("resize")
@keyed
def get_resize(size, method: str = "bilinear", antialias: bool = False) -> Callable:
  """Resizes to `size` (H or (H, W)), ignoring the aspect ratio."""
  size = size_pair(size)
  _check_method(method)
  return lambda image: _resize_keep_dtype(image, size, method, antialias)


@register("resize_small")
@keyed
def get_resize_small(smaller_size: int, method: str = "area", antialias: bool = False) -> Callable:
  """Resizes so that the shorter side is `smaller_size`, keeping the aspect ratio."""
  size_pair(smaller_size, "smaller_size")
  _check_method(method)

  def resize_small(image: tf.Tensor) -> tf.Tensor:
    hw = tf.cast(tf.shape(image)[:2], tf.float32)
    factor = smaller_size / tf.reduce_min(hw)
    new_hw = tf.cast(tf.round(hw * factor), tf.int32)
    return _resize_keep_dtype(image, new_hw, method, antialias)

  return resize_small


@register("central_crop")
@keyed
def get_central_crop(crop_size=None) -> Callable:
  """Crops the center `crop_size` (H or (H, W)); None takes the largest central square."""
  crop_size = size_pair(crop_size, "crop_size") if crop_size is not None else None

  def central_crop(image: tf.Tensor) -> tf.Tensor:
    shape = tf.shape(image)
    if crop_size:
      h, w = crop_size
    else:
      h = w = tf.minimum(shape[0], shape[1])
    return tf.image.crop_to_bounding_box(image, (shape[0] - h) // 2, (shape[1] - w) // 2, h, w)

  return central_crop


@register("random_crop")
@keyed(random=True)
def get_random_crop(crop_size) -> Callable:
  """Crops a random `crop_size` (H or (H, W)) window."""
  h, w = size_pair(crop_size, "crop_size")

  def random_crop(image: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    out = tf.image.stateless_random_crop(image, [h, w, tf.shape(image)[-1]], seed=seed)
    out.set_shape([h, w, image.shape[-1]])
    return out

  return random_crop


@register("flip_lr")
@keyed(random=True)
def get_flip_lr() -> Callable:
  """Flips left-right with probability 1/2."""
  return lambda image, seed: tf.image.stateless_random_flip_left_right(image, seed)


@register("value_range")
@keyed
def get_value_range(
    vmin: float = -1, vmax: float = 1, in_min=0, in_max=255.0, clip_values: bool = False
) -> Callable:
  """Maps [in_min, in_max] linearly to [vmin, vmax] as float32 (in_*: scalars or per channel)."""

  def value_range(image: tf.Tensor) -> tf.Tensor:
    lo, hi = tf.constant(in_min, tf.float32), tf.constant(in_max, tf.float32)
    out = vmin + (tf.cast(image, tf.float32) - lo) / (hi - lo) * (vmax - vmin)
    return tf.clip_by_value(out, vmin, vmax) if clip_values else out

  return value_range


@register("vgg_value_range")
@keyed
def get_vgg_value_range(
    mean: Sequence[float] = (0.485 * 255, 0.456 * 255, 0.406 * 255),
    std: Sequence[float] = (0.229 * 255, 0.224 * 255, 0.225 * 255),
) -> Callable:
  """(image - mean) / std per channel, float32 (defaults: ImageNet RGB statistics on 0..255)."""
  mean_t, std_t = tf.constant(mean, tf.float32), tf.constant(std, tf.float32)
  n = mean_t.shape.num_elements()
  if n != std_t.shape.num_elements():
    raise ValueError(f"mean and std differ in length: {mean!r} vs {std!r}")

  def vgg_value_range(image: tf.Tensor) -> tf.Tensor:
    c = image.shape[-1]
    if mean_t.shape.rank and c is not None and n not in (1, c):
      # Would silently broadcast a 1-channel image to 3 channels.
      raise ValueError(f"mean/std have {n} values but the image has {c} channels")
    return (tf.cast(image, tf.float32) - mean_t) / std_t

  return vgg_value_range


@register("grayscale_to_rgb")
@keyed
def get_grayscale_to_rgb() -> Callable:
  """Repeats a single channel three times (e.g. Fashion-MNIST for an RGB teacher)."""

  def grayscale_to_rgb(image: tf.Tensor) -> tf.Tensor:
    if image.shape[-1] != 1:
      raise ValueError(f"expects a 1-channel image, got shape {image.shape}")
    return tf.image.grayscale_to_rgb(image)

  return grayscale_to_rgb


def _uniform(seed: tf.Tensor) -> tf.Tensor:
  return tf.random.stateless_uniform([], seed=seed)


def _as_unit_float(image: tf.Tensor) -> tf.Tensor:
  return tf.image.convert_image_dtype(image, tf.float32)  # uint8 -> [0, 1]; floats unchanged


def _back_to(dtype: tf.DType, image: tf.Tensor) -> tf.Tensor:
  if dtype.is_integer:
    return tf.image.convert_image_dtype(tf.clip_by_value(image, 0.0, 1.0), dtype, saturate=True)
  return tf.cast(image, dtype)


def _check_probability(name: str, p: float) -> None:
  if not 0 <= p <= 1:
    raise ValueError(f"{name}: p={p} is not a probability in [0, 1]")


@register("color_jitter")
@keyed(random=True)
def get_color_jitter(
    brightness: float = 0.4,
    contrast: float = 0.4,
    saturation: float = 0.2,
    hue: float = 0.1,
    p: float = 0.8,
) -> Callable:
  """With probability p: brightness ×U(1±b), contrast and saturation ×U(1±c), hue +U(±h) turns,
  in that order, on an RGB image (uint8 or float in [0, 1]; the dtype is kept). DINO's and
  DINOv2's strengths are the defaults: inputs the teacher was trained to see, so a label-free
  student can be matched to it on more varied views of the same few photos."""
  _check_probability("color_jitter", p)
  for name, value in (
      ("brightness", brightness),
      ("contrast", contrast),
      ("saturation", saturation),
  ):
    if not 0 <= value < 1:
      raise ValueError(f"color_jitter: {name}={value} must be in [0, 1)")
  if not 0 <= hue <= 0.5:
    raise ValueError(f"color_jitter: hue={hue} must be in [0, 0.5] (a fraction of a turn)")

  def color_jitter(image: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    if image.shape[-1] != 3:
      raise ValueError(f"color_jitter expects an RGB image, got shape {image.shape}")
    seeds = tf.random.experimental.stateless_split(seed, 5)
    x = _as_unit_float(image)
    # Multiplicative brightness, as torchvision's ColorJitter (tf's own op adds a delta).
    x = x * tf.random.stateless_uniform([], seeds[0], 1 - brightness, 1 + brightness)
    if contrast:
      x = tf.image.stateless_random_contrast(x, 1 - contrast, 1 + contrast, seeds[1])
    if saturation:
      x = tf.image.stateless_random_saturation(
          tf.clip_by_value(x, 0.0, 1.0), 1 - saturation, 1 + saturation, seeds[2]
      )
    if hue:
      x = tf.image.stateless_random_hue(tf.clip_by_value(x, 0.0, 1.0), hue, seeds[3])
    jittered = _back_to(image.dtype, x)
    return tf.where(_uniform(seeds[4]) < p, jittered, image)

  return color_jitter


@register("random_grayscale")
@keyed(random=True)
def get_random_grayscale(p: float = 0.2) -> Callable:
  """With probability p, the image's luma (ITU-R 601) in all three channels; keeps the dtype."""
  _check_probability("random_grayscale", p)

  def random_grayscale(image: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    if image.shape[-1] != 3:
      raise ValueError(f"random_grayscale expects an RGB image, got shape {image.shape}")
    gray = _back_to(
        image.dtype, tf.image.grayscale_to_rgb(tf.image.rgb_to_grayscale(_as_unit_float(image)))
    )
    return tf.where(_uniform(seed) < p, gray, image)

  return random_grayscale
