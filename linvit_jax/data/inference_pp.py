"""An exported student's eval preprocessing without TensorFlow: its pp string in PIL + numpy.

    pp = Preprocess('decode|resize_small(256)|central_crop(224)|vgg_value_range|keep("image")')
    x = pp("photo.jpg")          # float32 [224, 224, 3], as evaluation saw it

The ops are those `pp_spec.inference_pp` keeps from an eval pp string, with data/ops_image.py's
arguments and defaults: decode, resize, resize_small, central_crop, value_range, vgg_value_range,
grayscale_to_rgb and keep("image"). Any other op is refused (`PreprocessError`, one line).

How close to TensorFlow (tests/test_student_inference_pp.py measures it on real photos):
  - `area` and non-antialiased `bilinear` / `nearest` resizes are TF's formulas (half-pixel
    centres; area = exact fractional box average), computed in float64 then clipped and truncated
    to uint8 as TF's `_resize_keep_dtype` does: the pixels agree except where a value sits on an
    integer boundary (±1 level);
  - JPEG decoding is libjpeg's exact DCT (PIL); TF's default (`decode` without precise=True) is
    its fast integer DCT: about 1 level on average, up to ~16 levels at sharp edges on JPEGs
    (PNGs decode identically; `decode(precise=True)` JPEGs within 1 level);
  - decode(1) of a colour image: ITU-R 601 luma (PIL, libjpeg); TF's libpng also applies a PNG's
    gamma chunk, so gamma-tagged colour PNGs differ there;
  - antialiased resizes and other methods go through PIL's filters on float32 channels (PIL's
    filters antialias when shrinking, as TF's `antialias=True` does; without antialias TF does
    not, so those methods are an approximation when shrinking).
EXIF orientation is ignored, as TF's decoders ignore it (the model was evaluated that way).

At another input size than the training size (`size=`), every size argument of resize,
resize_small and central_crop is scaled by size / training size (rounded; resize_small by the
larger of the two axes' factors, so the crop fits): 224 → 448 turns `resize_small(256)|
central_crop(224)` into `resize_small(512)|central_crop(448)`. A pp string whose ops do not fix the
output size (no resize, no sized central_crop) gets a bilinear `resize(size)` before its value
ops, as pp_spec.with_resize does for the run's resolution rows (with `size` at the training size
too, so that a photo of any size fits the model).
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from linvit_jax.data import pp_spec
from linvit_jax.runtime.errors import UserError

SUPPORTED = (
    "decode",
    "resize",
    "resize_small",
    "central_crop",
    "value_range",
    "vgg_value_range",
    "grayscale_to_rgb",
    "keep",
)
_IMAGENET_MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
_IMAGENET_STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)
_PIL_FILTERS = {
    "bilinear": "BILINEAR",
    "bicubic": "BICUBIC",
    "lanczos3": "LANCZOS",
    "lanczos5": "LANCZOS",
    "mitchellcubic": "BICUBIC",
    "gaussian": "BILINEAR",
    "nearest": "NEAREST",
    "area": "BOX",
}


class PreprocessError(UserError, ValueError):
  """A pp string this module cannot run, or an input that is not an image; one line."""


def parse(pp: str) -> list[tuple[str, tuple, dict]]:
  """'decode|resize(224, method="area")' -> [('decode', (), {}), ('resize', (224,), {...})]
  (pp_spec.parse, the parser the TF ops use too), its errors as PreprocessError."""
  try:
    return pp_spec.parse(pp)
  except ValueError as e:
    raise PreprocessError(str(e)) from None


def _pair(size: Any) -> tuple[int, int]:
  return (int(size), int(size)) if np.ndim(size) == 0 else (int(size[0]), int(size[1]))


def _bind(name: str, args: tuple, kwargs: dict, params: Sequence[str]) -> dict[str, Any]:
  """args/kwargs by name, as the op getter's signature would bind them; a clear error if not."""
  kwargs = dict(kwargs)
  for key in ("key", "inkey", "outkey"):
    if kwargs.pop(key, "image") != "image":
      raise PreprocessError(f"preprocessing op {name!r}: only the 'image' key is supported here")
  if len(args) > len(params) or set(kwargs) - set(params):
    raise PreprocessError(
        f"preprocessing op {name!r}: unexpected arguments {args!r} {kwargs!r} "
        f"(expected {', '.join(params)})"
    )
  return {**dict(zip(params, args)), **kwargs}


class Preprocess:
  """A pp string as a function: an image (path, encoded bytes or uint8 HxW[xC] array) ->
  float32 HxWxC. `size` / `training_size` (H, W): scale the geometric ops (module doc)."""

  def __init__(
      self,
      pp: str,
      size: tuple[int, int] | None = None,
      training_size: tuple[int, int] | None = None,
  ):
    """One pass over the pp string's ops, one branch per supported op with its arguments (kept
    together so each op reads like its TF counterpart in data/ops_image.py); the branches share
    the size factors and where the value ops start, which a split would pass around."""
    self.pp = pp
    ops = parse(pp)
    unknown = [n for n, _, _ in ops if n not in SUPPORTED]
    if unknown:
      raise PreprocessError(
          f"preprocessing op {unknown[0]!r} is not supported without TensorFlow "
          f"(supported: {', '.join(SUPPORTED)}); use Student.preprocess_tf"
      )
    self.channels = 3
    fy = fx = 1.0
    if size is not None and training_size is not None:
      fy, fx = size[0] / training_size[0], size[1] / training_size[1]
    self._fns: list[Callable[[np.ndarray], np.ndarray]] = []
    fixes_size, first_value_op = False, None
    for name, args, kwargs in ops:
      if name == "decode":
        b = _bind(name, args, kwargs, ("channels", "precise"))
        self.channels = int(b.get("channels", 3))
        if self.channels not in (1, 3, 4):
          raise PreprocessError(f"decode: channels must be 1, 3 or 4, got {self.channels!r}")
      elif name == "resize":
        b = _bind(name, args, kwargs, ("size", "method", "antialias"))
        h, w = _pair(b["size"])
        hw = (round(h * fy), round(w * fx))
        self._fns.append(_resizer(lambda _, hw=hw: hw, b.get("method", "bilinear"), b))
        fixes_size = True
      elif name == "resize_small":
        b = _bind(name, args, kwargs, ("smaller_size", "method", "antialias"))
        small = round(int(b["smaller_size"]) * max(fy, fx))
        self._fns.append(_resizer(lambda s, small=small: _small(s, small), "area", b))
      elif name == "central_crop":
        b = _bind(name, args, kwargs, ("crop_size",))
        crop = b.get("crop_size")
        crop = None if crop is None else (round(_pair(crop)[0] * fy), round(_pair(crop)[1] * fx))
        self._fns.append(lambda x, crop=crop: _central_crop(x, crop))
        fixes_size = fixes_size or crop is not None
      elif name == "value_range":
        b = _bind(name, args, kwargs, ("vmin", "vmax", "in_min", "in_max", "clip_values"))
        first_value_op = len(self._fns) if first_value_op is None else first_value_op
        self._fns.append(_value_range(**b))
      elif name == "vgg_value_range":
        b = _bind(name, args, kwargs, ("mean", "std"))
        mean = np.asarray(b.get("mean", _IMAGENET_MEAN), np.float32)
        std = np.asarray(b.get("std", _IMAGENET_STD), np.float32)
        first_value_op = len(self._fns) if first_value_op is None else first_value_op
        self._fns.append(lambda x, m=mean, s=std: (x.astype(np.float32) - m) / s)
      elif name == "grayscale_to_rgb":
        _bind(name, args, kwargs, ())
        self._fns.append(_grayscale_to_rgb)
      else:  # keep: only "image" comes out of here anyway
        if any(a != "image" for a in args):
          raise PreprocessError(f"{name}{args}: only keep('image') is supported here")
    if size is not None and not fixes_size:  # on the pixels, before the value ops (with_resize)
      at = len(self._fns) if first_value_op is None else first_value_op
      self._fns.insert(at, _resizer(lambda _: tuple(size), "bilinear", {}))

  def __call__(self, image: Any) -> np.ndarray:
    x = decode(image, self.channels)
    for fn in self._fns:
      x = fn(x)
    return np.asarray(x, np.float32)


def decode(image: Any, channels: int = 3) -> np.ndarray:
  """A path, encoded bytes or a uint8 array -> uint8 HxWxchannels (what TF's decode gives)."""
  from PIL import Image
  from PIL import UnidentifiedImageError

  if isinstance(image, (str, os.PathLike, bytes)):
    what = "the bytes given" if isinstance(image, bytes) else f"'{os.fspath(image)}'"
    try:
      if isinstance(image, bytes):
        data = image
      else:
        from linvit_jax.runtime import gfile

        with gfile.open(os.fspath(image), "rb") as f:
          data = f.read()
    except (FileNotFoundError, IsADirectoryError, PermissionError) as e:
      raise PreprocessError(f"{what}: cannot read the image ({e.strerror or e})") from None
    except OSError as e:
      raise PreprocessError(f"{what}: cannot read the image ({e})") from None
    try:
      pil = Image.open(io.BytesIO(data))
      if channels == 1 and pil.format == "JPEG":
        pil.draft("L", pil.size)  # libjpeg's own grayscale output, as TF's decode(1) asks for
      pil.load()
    except UnidentifiedImageError:
      raise PreprocessError(f"{what}: not an image file (no image format recognised)") from None
    except (OSError, ValueError) as e:  # a truncated or corrupt image
      raise PreprocessError(f"{what}: not a readable image ({type(e).__name__}: {e})") from None
    mode = {1: "L", 3: "RGB", 4: "RGBA"}[channels]
    if pil.mode in ("I;16", "I;16B", "I"):  # 16-bit PNG: TF's uint8 decode keeps the top byte
      pil = Image.fromarray((np.asarray(pil, np.uint32) >> 8).astype(np.uint8))
    return np.asarray(pil.convert(mode) if pil.mode != mode else pil, np.uint8).reshape(
        pil.height, pil.width, channels
    )
  a = np.asarray(image)
  if a.dtype != np.uint8 or a.ndim not in (2, 3) or (a.ndim == 3 and a.shape[-1] not in (1, 3, 4)):
    raise PreprocessError(
        "an image must be a path, encoded bytes or a uint8 HxW[xC] array (C = 1, 3 or 4); "
        f"got {a.dtype} {a.shape}"
    )
  if not a.shape[0] or not a.shape[1]:  # resize would divide by the empty side
    raise PreprocessError(f"an empty image ({a.shape[0]}×{a.shape[1]} pixels): nothing to encode")
  a = a if a.ndim == 3 else a[..., None]
  if a.shape[-1] == channels:
    return a
  if channels == 3 and a.shape[-1] == 1:
    return np.repeat(a, 3, axis=-1)
  if channels == 3:  # RGBA: TF's decode drops alpha
    return a[..., :3]
  from PIL import Image

  rgb = np.repeat(a, 3, axis=-1) if a.shape[-1] == 1 else a[..., :3]
  out = np.asarray(Image.fromarray(rgb).convert("L" if channels == 1 else "RGBA"))
  return out.reshape(*a.shape[:2], channels)


def _small(shape: tuple[int, ...], smaller_size: int) -> tuple[int, int]:
  # TF: round(hw * smaller / min(hw)) in float32; float64 here gives the same integers.
  h, w = shape[:2]
  factor = smaller_size / min(h, w)
  return int(np.round(h * factor)), int(np.round(w * factor))


def _resizer(target: Callable, default_method: str, b: dict[str, Any]) -> Callable:
  method, antialias = b.get("method", default_method), bool(b.get("antialias", False))
  if method not in _PIL_FILTERS:
    raise PreprocessError(f"resize method must be one of {', '.join(_PIL_FILTERS)}; got {method!r}")

  def resize(x: np.ndarray) -> np.ndarray:
    hw = tuple(target(x.shape))
    if hw == x.shape[:2]:
      return x  # TF's resize at the same size is the identity for these methods
    if method == "area":
      y = _area(_area(x.astype(np.float64), hw[0], 0), hw[1], 1)
    elif method == "bilinear" and not antialias:
      y = _bilinear(_bilinear(x.astype(np.float64), hw[0], 0), hw[1], 1)
    elif method == "nearest" and not antialias:
      y = _nearest(_nearest(x, hw[0], 0), hw[1], 1)
    else:
      y = _pil_resize(x, hw, _PIL_FILTERS[method])
    if x.dtype == np.uint8:  # TF's _resize_keep_dtype: clip, then a truncating cast
      y = np.clip(y, 0, 255)
    return y.astype(x.dtype)

  return resize


def _area(x: np.ndarray, n_out: int, axis: int) -> np.ndarray:
  """TF's resize_area along one axis: each output is the average of the input over its exact
  (fractional) interval [i·s, (i+1)·s), s = n_in / n_out, through the running integral."""
  n_in = x.shape[axis]
  x = np.moveaxis(x, axis, 0)
  cum = np.concatenate([np.zeros((1,) + x.shape[1:]), np.cumsum(x, axis=0)])
  pos = np.arange(n_out + 1) * (n_in / n_out)
  lo = np.minimum(np.floor(pos).astype(int), n_in - 1)
  frac = (pos - lo)[(...,) + (None,) * (x.ndim - 1)]
  integral = cum[lo] + frac * x[lo]  # the integral of the piecewise-constant row up to pos
  out = (integral[1:] - integral[:-1]) / (n_in / n_out)
  return np.moveaxis(out, 0, axis)


def _bilinear(x: np.ndarray, n_out: int, axis: int) -> np.ndarray:
  """TF2's bilinear resize along one axis (half-pixel centres, edges clamped, no antialias)."""
  n_in = x.shape[axis]
  scale = np.float32(n_in / n_out)  # TF computes the source coordinate in float32
  centre = ((np.arange(n_out, dtype=np.float32) + 0.5) * scale - np.float32(0.5)).astype(np.float64)
  floor = np.floor(centre)
  lower = np.maximum(floor, 0).astype(int)
  upper = np.minimum(np.ceil(centre), n_in - 1).astype(int)
  lerp = (centre - floor)[(slice(None),) + (None,) * (x.ndim - 1)]
  x = np.moveaxis(x, axis, 0)
  out = x[lower] + (x[upper] - x[lower]) * lerp
  return np.moveaxis(out, 0, axis)


def _nearest(x: np.ndarray, n_out: int, axis: int) -> np.ndarray:
  n_in = x.shape[axis]
  idx = np.minimum(np.floor((np.arange(n_out) + 0.5) * (n_in / n_out)).astype(int), n_in - 1)
  return np.take(x, idx, axis=axis)


def _pil_resize(x: np.ndarray, hw: tuple[int, int], filter_name: str) -> np.ndarray:
  from PIL import Image

  resample = getattr(Image.Resampling, filter_name)
  channels = [
      np.asarray(Image.fromarray(x[..., c].astype(np.float32), mode="F").resize(hw[::-1], resample))
      for c in range(x.shape[-1])
  ]
  return np.stack(channels, axis=-1).astype(np.float64)


def _central_crop(x: np.ndarray, crop: tuple[int, int] | None) -> np.ndarray:
  h, w = crop if crop is not None else (min(x.shape[:2]),) * 2
  if h > x.shape[0] or w > x.shape[1]:
    raise PreprocessError(f"central_crop({h}, {w}) is larger than the image {x.shape[:2]}")
  top, left = (x.shape[0] - h) // 2, (x.shape[1] - w) // 2
  return x[top : top + h, left : left + w]


def _value_range(
    vmin: float = -1, vmax: float = 1, in_min: Any = 0, in_max: Any = 255.0, clip_values=False
) -> Callable:
  lo, hi = np.asarray(in_min, np.float32), np.asarray(in_max, np.float32)
  vmin32, span = np.float32(vmin), np.float32(vmax - vmin)

  def value_range(x: np.ndarray) -> np.ndarray:
    out = vmin32 + (x.astype(np.float32) - lo) / (hi - lo) * span  # TF's order, float32
    return np.clip(out, vmin, vmax) if clip_values else out

  return value_range


def _grayscale_to_rgb(x: np.ndarray) -> np.ndarray:
  if x.shape[-1] != 1:
    raise PreprocessError(f"grayscale_to_rgb expects a 1-channel image, got shape {x.shape}")
  return np.repeat(x, 3, axis=-1)
