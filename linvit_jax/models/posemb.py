"""Position tables resized to another grid, each the way its source framework does it.

big_vision's rule (`resample_posemb`: bilinear, corners to corners, scipy.ndimage.zoom) for its
own checkpoints and for every table this library trains, also as per-axis matrices
(`zoom_matrix`) for the in-graph resampling of vit.resample_posemb_in_graph; torch's bicubic
F.interpolate, with or without antialias (`resample_posemb_torch`), for Hugging Face and timm
tables, as those frameworks resize them at run time. `resample_posemb_as` picks one by name.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import scipy.ndimage

from linvit_jax.models.checkpoints import CheckpointError

# How a checkpoint's position table is resized: models/foreign_layout.Imported.posemb_resample, or the
# sidecar JSON of an .npz.
RESAMPLERS = ("torch_bicubic", "torch_bicubic_antialias", "big_vision")


def _square_side(n: int, what: str) -> int:
  side = math.isqrt(n)
  if side * side != n:
    raise CheckpointError(
        f"{what} has {n} positions, not a square grid; pass its (h, w) "
        "explicitly to resample_posemb"
    )
  return side


def resample_posemb(
    old: np.ndarray,
    new: Any,
    old_hw: tuple[int, int] | None = None,
    new_hw: tuple[int, int] | None = None,
) -> np.ndarray:
  """Resizes a (1, h*w, D) learned posemb to another grid: bilinear, as big_vision does.

  `new` is the target array or its shape. Grids are square unless given as (h, w). Corners map to
  corners (scipy.ndimage.zoom, order=1, its default align-corners grid), like big_vision's
  "high-res fine-tuning".
  """
  old = np.asarray(old)
  new_shape = tuple(new.shape if hasattr(new, "shape") else new)
  if old.ndim != 3 or len(new_shape) != 3 or old.shape[0] != 1 or new_shape[0] != 1:
    raise CheckpointError(f"pos_embedding must be (1, N, D): got {old.shape} -> {new_shape}")
  if old.shape[2] != new_shape[2]:
    raise CheckpointError(
        f"pos_embedding width differs, cannot resample: checkpoint "
        f"{old.shape} vs model {new_shape}"
    )
  oh, ow = old_hw or (_square_side(old.shape[1], f"checkpoint pos_embedding {old.shape}"),) * 2
  nh, nw = new_hw or (_square_side(new_shape[1], f"model pos_embedding {new_shape}"),) * 2
  if oh * ow != old.shape[1] or nh * nw != new_shape[1]:
    raise CheckpointError(
        f"pos_embedding grids ({oh}, {ow}) -> ({nh}, {nw}) do not match "
        f"the shapes {old.shape} -> {new_shape}"
    )
  if (oh, ow) == (nh, nw):
    return old
  # scipy has no bfloat16; interpolate in float32 and cast back.
  grid = old.reshape(oh, ow, -1).astype(np.float32)
  grid = scipy.ndimage.zoom(grid, (nh / oh, nw / ow, 1), order=1)
  assert grid.shape[:2] == (nh, nw), (grid.shape, nh, nw)  # zoom rounds; exact ratios hit.
  return grid.reshape(new_shape).astype(old.dtype)


def zoom_matrix(n_in: int, n_out: int) -> np.ndarray:
  """[n_out, n_in] float32 weights of `resample_posemb`'s rule along one axis: the zoom is linear,
  so zooming the identity gives each output's weights over the inputs (the model's in-graph
  resampling, vit.resample_posemb_in_graph, applies them)."""
  eye = np.eye(n_in, dtype=np.float64)
  return scipy.ndimage.zoom(eye, (n_out / n_in, 1), order=1).astype(np.float32)


def resample_posemb_as(method: str, old: np.ndarray, new_shape: tuple[int, ...]) -> np.ndarray:
  """The position table resized the way its source framework does ('big_vision': bilinear;
  'torch_bicubic[_antialias]': torch's F.interpolate, as Hugging Face and timm do)."""
  if method == "big_vision" or tuple(old.shape) == tuple(new_shape):
    return resample_posemb(old, new_shape)
  if old.shape[2] != new_shape[2]:
    raise CheckpointError(f"pos_embedding width differs: {old.shape} vs model {new_shape}")
  side = _square_side(new_shape[1], f"model pos_embedding {tuple(new_shape)}")
  return resample_posemb_torch(old, (side, side), method.endswith("antialias"))


# ------------------------------------------------------------------------------------------------
# torch's F.interpolate(mode='bicubic', align_corners=False), as Hugging Face and timm resize.


def _cubic(x: np.ndarray, a: float) -> np.ndarray:
  x = np.abs(x)
  return np.where(
      x < 1,
      ((a + 2) * x - (a + 3)) * x * x + 1,
      np.where(x < 2, (((x - 5) * x + 8) * x - 4) * a, 0.0),
  )


def _torch_bicubic_matrix(n_in: int, n_out: int, antialias: bool) -> np.ndarray:
  """[n_out, n_in] weights of torch's 1-d bicubic resize (separable, so 2-d is two of these)."""
  m = np.zeros((n_out, n_in))
  scale = n_in / n_out
  if not antialias:  # aten upsample_bicubic2d: a = -0.75, 4 taps, clamped at the border
    for i in range(n_out):
      real = (i + 0.5) * scale - 0.5
      x0 = math.floor(real)
      t = real - x0
      for j, w in zip(range(x0 - 1, x0 + 3), _cubic(np.array([t + 1, t, 1 - t, 2 - t]), -0.75)):
        m[i, min(max(j, 0), n_in - 1)] += w
    return m
  # aten _upsample_bicubic2d_aa (PIL's filter): a = -0.5, support widened when shrinking.
  support = 2.0 * scale if scale >= 1 else 2.0
  inv = 1.0 / scale if scale >= 1 else 1.0
  for i in range(n_out):
    center = scale * (i + 0.5)
    lo = max(int(center - support + 0.5), 0)
    hi = min(int(center + support + 0.5), n_in)
    w = _cubic((np.arange(lo, hi) - center + 0.5) * inv, -0.5)
    m[i, lo:hi] = w / w.sum()
  return m


def resample_posemb_torch(
    posemb: np.ndarray, new_grid: tuple[int, int], antialias: bool
) -> np.ndarray:
  """[1, h·w, D] (square h = w) -> [1, H·W, D] as torch's bicubic interpolate, in float64."""
  n, d = posemb.shape[1], posemb.shape[2]
  side = math.isqrt(n)
  if side * side != n:
    raise CheckpointError(f"position table of {n} entries is not a square grid")
  grid = posemb.reshape(side, side, d).astype(np.float64)
  my = _torch_bicubic_matrix(side, new_grid[0], antialias)
  mx = _torch_bicubic_matrix(side, new_grid[1], antialias)
  out = np.einsum("ij,jkd,lk->ild", my, grid, mx)
  return out.reshape(1, new_grid[0] * new_grid[1], d).astype(posemb.dtype)
