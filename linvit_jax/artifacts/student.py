"""An exported student, ready to use: `Student` runs `encode` / `tokens` / `predict` on paths,
encoded bytes, uint8 HWC arrays (preprocessed here by inference_pp.py: the run's own eval pp
string in PIL + numpy) or preprocessed float batches, at the training size or any multiple of the
patch (the position table resampled), in batches with one compile per shape bucket.
student_loader.load_student builds one from an export folder. Applying a student imports no
TensorFlow (`preprocess_tf` does, on request).
"""

from __future__ import annotations

import dataclasses
import functools
import io
import os
import sys
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from linvit_jax.artifacts import export_folder
from linvit_jax.artifacts.export_format import ExportError
from linvit_jax.artifacts.model_card import describe_attention
from linvit_jax.data import inference_pp
from linvit_jax.models import vit
from linvit_jax.models import vit_checkpoint
from linvit_jax.runtime import gfile
from linvit_jax.runtime.errors import UserError

_VERBS = {"encoded": "tokens", "pre_logits": "encode", "logits": "predict"}


def _nearest_sizes(n: int, patch: int) -> str:
  lo = n // patch * patch
  return str(patch) if lo < patch else f"{lo} or {lo + patch}"


def check_size(size: Any, patch: Sequence[int]) -> tuple[int, int]:
  """(H, W) of an input size (an int or a pair) if both are multiples of the patch; else an
  ExportError naming the size, the patch and the nearest valid sizes."""
  h, w = (size, size) if np.ndim(size) == 0 else tuple(size)
  bad = [(n, p) for n, p in ((h, patch[0]), (w, patch[1])) if n <= 0 or n % p]
  if bad:
    n, p = bad[0]
    raise ExportError(
        f"image size {h}×{w}: {n} is not a positive multiple of the patch {p} "
        f"(nearest valid: {_nearest_sizes(n, p)})"
    )
  return int(h), int(w)


def _progress(total: int, what: str):
  """A tqdm bar when tqdm is installed, else one updating stderr line."""
  try:
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=what, unit="img", file=sys.stderr)
  except ImportError:

    class _Line:
      n = 0

      def update(self, k: int) -> None:
        self.n += k
        print(f"\r{what}: {self.n}/{total} images", end="", file=sys.stderr, flush=True)

      def close(self) -> None:
        print(file=sys.stderr)

    return _Line()


@dataclasses.dataclass(repr=False)
class Student:
  """An exported student, ready to use: `model` and `params` for custom code.

  `image_size` (H, W): the size `encode` / `tokens` / `predict` run raw images at unless a call
  names another (default: the training size); any multiple of the patch, the learned position
  table resized bilinearly from the training grid (big_vision's `resample_posemb`; cls and
  register tokens are not in that table). `dtype` (e.g. jnp.bfloat16): params and compute in it,
  outputs float32. Batches of `batch_size`, the last padded to a power-of-two bucket (≥ 8,
  ≤ batch_size): one compile per (output, bucket, image size); `traces` counts them.
  """

  model: Any
  params: Any
  config: dict[str, Any]
  folder: str = ""
  image_size: Any = None
  dtype: Any = None
  batch_size: int = 32

  def __post_init__(self):
    self.patch = tuple(int(p) for p in self.model.patch_size)
    pe = self.params.get("pos_embedding") if isinstance(self.params, Mapping) else None
    self._grid = None
    pre = self.config.get("preprocessing") or {}
    if pre.get("image_size"):
      self.training_size = tuple(int(n) for n in pre["image_size"])
      self._grid = (self.training_size[0] // self.patch[0], self.training_size[1] // self.patch[1])
    elif pe is not None:  # format 1: a square grid of the stored table
      side = int(round(np.sqrt(np.shape(pe)[1])))
      self._grid, self.training_size = (side, side), (side * self.patch[0], side * self.patch[1])
    else:
      self.training_size = None
    if pe is not None and self._grid[0] * self._grid[1] != np.shape(pe)[1]:
      side = int(round(np.sqrt(np.shape(pe)[1])))
      self._grid = (side, side)
    self.image_size = (
        self._check(self.image_size) if self.image_size is not None else self.training_size
    )
    if self.dtype is not None:
      self.dtype = jnp.dtype(self.dtype)
      self.model = self.model.clone(dtype_mm=self.dtype.name)
      self.params = jax.tree.map(
          lambda a: np.asarray(a).astype(self.dtype)
          if np.issubdtype(np.asarray(a).dtype, np.floating)
          else a,
          self.params,
      )
    self.channels = int(np.shape(self.params["embedding"]["kernel"])[2])
    self.traces = 0  # how many times the forward was traced (= compiled): one per bucket
    self._forward = jax.jit(self._apply, static_argnums=0)
    self._sized: dict[tuple[int, int], Any] = {}
    self._pps: dict[tuple[int, int], Any] = {}
    self._tf_pp = None
    self._bounds: tuple[float, ...] | None = None

  def __repr__(self) -> str:
    m = self.model
    n = sum(int(np.size(a)) for a in jax.tree.leaves(self.params))
    size = "×".join(map(str, self.training_size)) if self.training_size else "?"
    return (
        f"Student('{self.folder}': ViT width {m.width}, depth {m.depth}, heads {m.num_heads}, "
        f"patch {self.patch[0]}, {describe_attention(m.attention, m.depth)}; trained at {size} "
        f"px, runs at {'×'.join(map(str, self.image_size or ('?',)))}; {n / 1e6:.2f}M params"
        + (f", {self.dtype.name}" if self.dtype is not None else "")
        + ")"
    )

  # -------------------------------------------------------------------------- preprocessing

  def preprocess(self, images: Any, image_size: Any = None) -> np.ndarray:
    """Paths, encoded bytes or uint8 HWC arrays -> the model's input batch [B, H, W, C] float32,
    through the run's own eval pp string in PIL + numpy (inference_pp: resize, crop and
    normalisation scaled to `image_size`; no TensorFlow)."""
    size = self._size(image_size)
    items = _as_list(images)
    if not items:
      return np.zeros((0, *size, self.channels), np.float32)
    return np.stack([self._pp(size)(x) for x in items]).astype(np.float32)

  def preprocess_tf(self, images: Any) -> np.ndarray:
    """As `preprocess` at the training size, through TensorFlow and the run's own pp ops (what
    evaluation ran); imports TensorFlow."""
    if self._tf_pp is None:
      from linvit_jax.runtime import quiet_tf

      quiet_tf.import_quietly("tensorflow")
      from linvit_jax.data import preprocess as pp_lib

      self._tf_pp = pp_lib.get_preprocess_fn(self._pp_string())
    import tensorflow as tf

    out = []
    for image in _as_list(images):
      data = {"image": tf.constant(_encoded(image))}
      out.append(np.asarray(self._tf_pp(data)["image"]))
    return np.stack(out).astype(np.float32)

  def _pp_string(self) -> str:
    pre = self.config.get("preprocessing") or {}
    if not pre.get("pp"):
      raise ExportError(
          f"student '{self.folder}' records no preprocessing (an old export): pass preprocessed "
          "float arrays [B, H, W, C]"
      )
    return pre["pp"]

  def _pp(self, size: tuple[int, int]) -> inference_pp.Preprocess:
    if size not in self._pps:
      self._pps[size] = inference_pp.Preprocess(self._pp_string(), size, self.training_size)
    return self._pps[size]

  def _check(self, size: Any) -> tuple[int, int]:
    size = check_size(size, self.patch)
    if size[0] != size[1]:
      needs = [
          what
          for what, used in (
              ("convolution on values (conv_v)", lambda s: s.conv_v),
              ("exact window (window)", lambda s: s.window),
              ("pooled softmax keys (key_grid)", lambda s: s.key_grid),
          )
          if any(used(s) for s in vit.layer_specs(self.model))
      ]
      if needs:
        raise ExportError(
            f"image size {size[0]}×{size[1]}: this student's {' and '.join(needs)} needs a "
            "square patch grid; use a square size"
        )
    return size

  def _size(self, image_size: Any) -> tuple[int, int]:
    if image_size is not None:
      return self._check(image_size)
    if self.image_size is None:
      raise ExportError(
          f"student '{self.folder}' does not record its input size: pass image_size= or a "
          "preprocessed batch"
      )
    return self.image_size

  # -------------------------------------------------------------------------- the forward

  def _apply(self, what: str, params: Any, x: jax.Array) -> jax.Array:
    self.traces += 1  # runs only when jax traces, i.e. compiles, this function
    logits, out = self.model.apply({"params": params}, x, train=False)
    return (logits if what == "logits" else out[what]).astype(jnp.float32)

  def _params_at(self, size: tuple[int, int]) -> Any:
    """The params with the position table resampled to `size`'s grid (cached, on device)."""
    if size not in self._sized:
      grid = (size[0] // self.patch[0], size[1] // self.patch[1])
      params = vit_checkpoint.with_posemb_grid(self.params, grid, self._grid)
      self._sized[size] = jax.device_put(params)
    return self._sized[size]

  def _run(self, what: str, images: Any, image_size: Any, batch_size: int | None) -> np.ndarray:
    batch_size = int(batch_size or self.batch_size)
    if batch_size < 1:
      raise ExportError(f"batch_size must be at least 1, got {batch_size}")
    batch, items, size = self._inputs(images, image_size)
    n = len(batch) if batch is not None else len(items)
    params = self._params_at(size)
    dtype = self.dtype or np.float32
    if n == 0:
      traces = self.traces  # a shape, not a compile
      shape = jax.eval_shape(
          functools.partial(self._apply, what),
          params,
          jax.ShapeDtypeStruct((1, *size, self.channels), dtype),
      )
      self.traces = traces
      return np.zeros((0, *shape.shape[1:]), np.float32)
    bar = _progress(n, _VERBS[what]) if n > batch_size else None
    out = []
    for start in range(0, n, batch_size):
      if batch is not None:
        x = np.asarray(batch[start : start + batch_size])
      else:
        x = self.preprocess(items[start : start + batch_size], size)
      k = len(x)
      bucket = min(batch_size, max(8, 1 << (k - 1).bit_length()))
      if bucket > k:  # padding: one compile per bucket, not per batch size
        x = np.concatenate([x, np.zeros((bucket - k, *x.shape[1:]), x.dtype)])
      out.append(np.asarray(self._forward(what, params, x.astype(dtype)))[:k])
      if bar is not None:
        bar.update(k)
    if bar is not None:
      bar.close()
    return np.concatenate(out).astype(np.float32)

  def _inputs(self, images: Any, image_size: Any) -> tuple[Any, list, tuple[int, int]]:
    """(a preprocessed batch or None, raw images, the input size)."""
    if isinstance(images, (np.ndarray, jax.Array)) and jnp.issubdtype(images.dtype, jnp.floating):
      if images.ndim != 4 or images.shape[-1] != self.channels:
        raise ExportError(
            f"a float array must be a preprocessed batch [B, H, W, {self.channels}]; got shape "
            f"{tuple(images.shape)} (raw images: uint8 arrays, paths or bytes)"
        )
      size = self._check(images.shape[1:3])
      self._check_normalised(images)
      if image_size is not None and self._check(image_size) != size:
        raise ExportError(
            f"image_size={image_size} but the preprocessed batch is {size[0]}×{size[1]}: a "
            "batch's own size decides"
        )
      return images, [], size
    if isinstance(images, np.ndarray) and images.dtype == np.uint8 and images.ndim == 4:
      return None, list(images), self._size(image_size)
    return None, _as_list(images), self._size(image_size)

  def value_bounds(self) -> tuple[float, float] | None:
    """(lowest, highest) value the student's own preprocessing gives a pixel (black and white
    through its normalisation), or None when the export records no preprocessing this module
    can run."""
    if self._bounds is None:
      try:
        pp = inference_pp.Preprocess(self._pp_string())
        black, white = (np.full((2, 2, self.channels), v, np.uint8) for v in (0, 255))
        lo, hi = float(np.min(pp(black))), float(np.max(pp(white)))
        self._bounds = (min(lo, hi), max(lo, hi))
      except UserError:
        self._bounds = ()
    return self._bounds or None

  def _check_normalised(self, images: Any) -> None:
    """A float batch must hold normalised pixels: values far outside what the preprocessing makes
    (raw 0..255 pixels, say) are refused; values a little outside it, or a batch that looks like
    raw 0..1 pixels, are warned of."""
    bounds = self.value_bounds()
    if bounds is None or not np.size(images):
      return
    lo, hi = bounds
    # The array's own min/max: a jax batch is reduced where it lives, not copied to the host twice.
    vmin, vmax = float(images.min()), float(images.max())
    slack = 0.05 * (hi - lo)  # resampling may overshoot the range a little
    fix = (
        "pass raw pixels as uint8 HxWxC arrays (or paths / bytes), which are preprocessed here, "
        "or preprocess() them first"
    )
    if not (np.isfinite(vmin) and np.isfinite(vmax)):
      raise ExportError("the float batch holds NaN or infinite values")
    span = f"its values span [{vmin:.4g}, {vmax:.4g}] and this student's preprocessing makes"
    if vmin < lo - 4 * (hi - lo) or vmax > hi + 4 * (hi - lo):  # raw 0..255 pixels, say
      raise ExportError(
          f"a float batch is read as normalised pixels, but {span} [{lo:.4g}, {hi:.4g}]: {fix}"
      )
    if vmin < lo - slack or vmax > hi + slack:  # another normalisation, or synthetic values
      warnings.warn(
          f"a float batch is read as normalised pixels, but {span} [{lo:.3g}, {hi:.3g}]",
          stacklevel=4,
      )
    if lo < -0.1 and vmin >= 0.0 and vmax <= 1.0:
      warnings.warn(
          f"a float batch with every value in [0, 1], where this student's normalised pixels "
          f"span [{lo:.3g}, {hi:.3g}]: raw 0..1 pixels? If so, {fix}",
          stacklevel=4,
      )

  def tokens(
      self, images: Any, image_size: Any = None, batch_size: int | None = None
  ) -> np.ndarray:
    """Final normalised tokens [B, N, D] float32 (cls and registers first, as the teacher's).

    `images`: paths, encoded bytes, uint8 HWC arrays (raw images: preprocessed here, at
    `image_size`), or a preprocessed float batch [B, H, W, C] (numpy or jax, any float dtype;
    its H, W decide the size). A float batch must hold *normalised* pixels, as `preprocess`
    makes them: raw pixels go in as uint8 (a float batch far outside `value_bounds()` is refused,
    one a little outside it or with every value in [0, 1] is warned of)."""
    return self._run("encoded", images, image_size, batch_size)

  def encode(
      self, images: Any, image_size: Any = None, batch_size: int | None = None
  ) -> np.ndarray:
    """The pooled final feature [B, D] float32 (cls token, MAP or mean pool, as the teacher's);
    `images` as for `tokens`. `encode([])` is an empty [0, D] array."""
    return self._run("pre_logits", images, image_size, batch_size)

  def predict(
      self, images: Any, image_size: Any = None, batch_size: int | None = None
  ) -> np.ndarray:
    """Logits [B, classes] float32; a headless student has none. `images` as for `tokens`."""
    if not self.model.num_classes:
      raise ExportError(f"student '{self.folder}' has no head (num_classes is None): use encode()")
    return self._run("logits", images, image_size, batch_size)

  def save(self, folder: str) -> None:
    """Writes this student as an export folder (export_folder.save), its params float32."""
    export_folder.save(
        folder, jax.tree.map(lambda a: np.asarray(a, np.float32), self.params), self.config
    )


def _as_list(images: Any) -> list[Any]:
  if isinstance(images, (str, bytes, os.PathLike)) or (
      isinstance(images, np.ndarray) and images.ndim in (2, 3)
  ):
    return [images]
  return list(images)


def _encoded(image: Any) -> bytes:
  """An image as encoded bytes for TensorFlow's decode (a uint8 array as a lossless PNG)."""
  if isinstance(image, bytes):
    return image
  if isinstance(image, (str, os.PathLike)):
    try:
      with gfile.open(os.fspath(image), "rb") as f:
        return f.read()
    except OSError as e:
      raise ExportError(
          f"'{os.fspath(image)}': cannot read the image ({e.strerror or e})"
      ) from None
  a = inference_pp.decode(image, 3 if np.ndim(image) == 2 or np.shape(image)[-1] != 1 else 1)
  from PIL import Image

  buf = io.BytesIO()  # PNG is lossless: the pp's decode sees exactly these pixels
  Image.fromarray(a[..., 0] if a.shape[-1] == 1 else a).save(buf, format="PNG")
  return buf.getvalue()
