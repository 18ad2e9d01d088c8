"""Two models' final tokens on photos at any size, the photo evaluation's forward (photo_eval.py
defines the views and what is measured on the tokens): each photo decoded once and made into
every view at a size, fixed-size batches (one compile per size, a padded last batch), the
position table resampled to the size's grid as `load_student` does, each model's images/s after
the compile, and the teacher's tokens (or its image features: `features`) kept in the feature
cache between evaluations.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from linvit_jax.data import inference_pp

# Tokens per forward batch: a 4·res softmax teacher holds an N×N attention per head and image.
_TOKENS_PER_BATCH = 8192
_MAX_BATCH = 8
# Teacher batches per size always computed (the first compiles, the second is timed) when the
# rest come from the feature cache.
_TIMED_CALLS = 3  # the compile and two timed batches: a speed from more than one batch


def image_feature(model: Any, tokens: np.ndarray) -> np.ndarray:
  """[B, D], a model's one vector per image from its final tokens [B, N, D]: the cls token (pool
  "tok": the token photo_eval's cls cosine compares), else the mean of the patch tokens
  (registers excluded; "gap" pooling: a MAP head's output is not in the tokens)."""
  if model.pool_type == "tok":
    return tokens[:, 0]
  return tokens[:, model.num_prefix_tokens :].mean(axis=1)


def feature_name(model: Any) -> str:
  """What `image_feature` takes of `model`'s tokens, in words (results say it)."""
  return "cls token" if model.pool_type == "tok" else "mean patch token"


def _train_grid(params: Any, res: int, patch: tuple[int, int]) -> tuple[int, int]:
  """The grid the params were trained at: res / patch, or the square grid of their position table."""
  grid = (res // patch[0], res // patch[1])
  pe = params.get("pos_embedding") if hasattr(params, "get") else None
  if pe is not None and np.shape(pe)[1] != grid[0] * grid[1]:
    side = int(round(np.sqrt(np.shape(pe)[1])))
    grid = (side, side)
  return grid


class Tokens:
  """A model's final normalised tokens [B, N, D] (float32) at fixed-size batches: one compile per
  size."""

  def __init__(self, model: Any, params: Any, res: int):
    import jax

    self.model, self.params = model, params
    self.patch = tuple(int(p) for p in model.patch_size)
    self.train_grid = _train_grid(params, res, self.patch)
    self._fn = jax.jit(lambda p, x: model.apply({"params": p}, x, train=False)[1]["encoded"])
    self._sized: dict[int, Any] = {}
    # size -> [seconds, images] of the forwards after the first (which compiles) at that size
    self.timing: dict[int, list[float]] = {}

  def __call__(self, images: np.ndarray, batch: int) -> np.ndarray:
    import jax

    from linvit_jax.models import vit_checkpoint

    size = images.shape[1]
    if size not in self._sized:  # one size on the device at a time: a 4·res table is large
      grid = (size // self.patch[0], size // self.patch[1])
      resized = vit_checkpoint.with_posemb_grid(self.params, grid, self.train_grid)
      self._sized = {size: jax.device_put(resized)}
    k = len(images)
    if k < batch:  # padded: one compile per size, not per chunk
      images = np.concatenate([images, np.zeros((batch - k, *images.shape[1:]), images.dtype)])
    t0 = time.perf_counter()
    out = np.asarray(self._fn(self._sized[size], images), np.float32)[:k]
    if size in self.timing:
      self.timing[size][0] += time.perf_counter() - t0
      self.timing[size][1] += batch  # padded rows cost the same
    else:
      self.timing[size] = [0.0, 0]
    return out

  def features(self, images: np.ndarray, batch: int) -> np.ndarray:
    """`image_feature` [B, D] of a batch (at most `batch` images)."""
    return image_feature(self.model, self(images, batch))

  def images_per_s(self, size: int) -> float | None:
    seconds, images = self.timing.get(size, (0.0, 0))
    return images / seconds if images else None

  def timed_images(self, size: int) -> int:
    return int(self.timing.get(size, (0.0, 0))[1])

  def swap_params(self, params: Any) -> None:
    """Other params of the same tree (another checkpoint): the compiled forwards are kept."""
    self.params, self._sized = params, {}


class CachedTokens:
  """The teacher's tokens of one batch, from `cache` when an earlier evaluation computed them for
  the same params, model and pixels (feature_cache's key: a changed photo, pp or weight misses).
  The first `_TIMED_CALLS` batches at each size always run, so the teacher's images/s (the speed
  goal's denominator) stays measured on two batches, compile excluded, when every other batch
  is a hit."""

  def __init__(self, tokens: Tokens, cache: Any):
    from linvit_jax.evaluation import feature_cache

    self.inner, self.cache, self.model = tokens, cache, tokens.model
    self.digest = feature_cache.params_digest(tokens.params) if cache is not None else None
    model = tokens.model
    self.fields = {
        f.name: getattr(model, f.name)
        for f in dataclasses.fields(model)
        if f.name not in ("parent", "name")
    }
    self.calls: dict[int, int] = {}
    self.hits, self.misses, self.saved_seconds = 0, 0, 0.0

  def _parts(
      self, images: np.ndarray, batch: int, what: str = "photo_eval tokens(encoded)"
  ) -> dict[str, Any]:
    import jax

    pixels = np.ascontiguousarray(images, np.float32)
    return {
        "what": what,
        "params": self.digest,
        "model": self.fields,
        "batch": int(batch),
        "train_grid": list(self.inner.train_grid),
        "inputs": hashlib.sha256(pixels.reshape(-1).view(np.uint8)).hexdigest(),
        "shape": list(pixels.shape),
        "backend": jax.default_backend(),
        "jax": jax.__version__,
    }

  def __call__(self, images: np.ndarray, batch: int) -> np.ndarray:
    size = images.shape[1]
    self.calls[size] = calls = self.calls.get(size, 0) + 1
    if self.digest is None:
      return self.inner(images, batch)
    parts = self._parts(images, batch)
    if calls > _TIMED_CALLS:
      entry = self.cache.get(parts)
      if entry is not None and entry["tokens"].shape[0] == len(images):
        self.hits += 1
        self.saved_seconds += float(entry["seconds"])
        return entry["tokens"]
    t0 = time.perf_counter()
    out = self.inner(images, batch)
    self.misses += 1
    if calls > _TIMED_CALLS:  # the timed batches run every time: storing them saves nothing
      self.cache.put(parts, {"tokens": out, "seconds": np.float64(time.perf_counter() - t0)})
    return out

  def features(self, images: np.ndarray, batch: int) -> np.ndarray:
    """`image_feature` [B, D] of a batch, from the cache whenever it holds them: these batches
    (crop retrieval's) are no speed's measure, so no batch is run for timing. Only the features
    are stored, not the tokens they were taken from."""
    if self.digest is None:
      return self.inner.features(images, batch)
    parts = self._parts(images, batch, f"photo_eval features({feature_name(self.model)})")
    entry = self.cache.get(parts)
    if entry is not None and entry["features"].shape[0] == len(images):
      self.hits += 1
      self.saved_seconds += float(entry["seconds"])
      return entry["features"]
    t0 = time.perf_counter()
    out = self.inner.features(images, batch)
    self.misses += 1
    self.cache.put(parts, {"features": out, "seconds": np.float64(time.perf_counter() - t0)})
    return out

  def images_per_s(self, size: int) -> float | None:
    return self.inner.images_per_s(size)

  def timed_images(self, size: int) -> int:
    return self.inner.timed_images(size)

  def summary(self) -> dict[str, Any]:
    return {"hits": self.hits, "computed": self.misses, "saved_seconds": self.saved_seconds}


def batch_size(model: Any, size: int) -> int:
  """Images per forward at `size` px: at most _TOKENS_PER_BATCH tokens and _MAX_BATCH images."""
  tokens = (size // model.patch_size[0]) * (size // model.patch_size[1])
  return max(1, min(_MAX_BATCH, _TOKENS_PER_BATCH // max(tokens, 1)))


def decode_views(
    paths: Sequence[str], pps: dict[str, inference_pp.Preprocess], size: int
) -> tuple[dict[str, np.ndarray], dict[str, int]]:
  """Per view: the batch [B, s, s, C] and how many photos were enlarged; each photo decoded once."""
  out = {v: [] for v in pps}
  up = dict.fromkeys(pps, 0)
  for path in paths:
    channels = next(iter(pps.values())).channels
    original = inference_pp.decode(path, channels)
    for view, pp in pps.items():
      out[view].append(pp(original))
      up[view] += min(original.shape[:2]) < size  # enlarged to make the view
  return {v: np.stack(x).astype(np.float32) for v, x in out.items()}, up


def forward_all(
    teacher: Tokens | CachedTokens,
    student: Tokens,
    paths: Sequence[str],
    pps: dict[str, inference_pp.Preprocess],
    size: int,
    on_batch: Callable[[int], Any] | None = None,
) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], dict[str, int]]:
  """Per view: (teacher tokens, student tokens) of every photo at `size` px (`pps`: each view's
  pp at that size), and how many photos each view enlarged; `on_batch(n)` after each batch of n
  photos (a progress bar's update)."""
  batch = batch_size(teacher.model, size)
  tokens = {v: ([], []) for v in pps}
  up = dict.fromkeys(pps, 0)
  for start in range(0, len(paths), batch):
    views, enlarged = decode_views(paths[start : start + batch], pps, size)
    for view, images in views.items():
      tokens[view][0].append(teacher(images, batch))
      tokens[view][1].append(student(images, batch))
      up[view] += enlarged[view]
    if on_batch is not None:
      on_batch(len(paths[start : start + batch]))
  return {v: (np.concatenate(t), np.concatenate(s)) for v, (t, s) in tokens.items()}, up
