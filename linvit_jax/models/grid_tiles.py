"""A square patch grid cut into t×t tiles for local (w×w window) attention as dense matmuls.

Each tile's t² queries are scored against the (t + 2r)² keys of the tile and a halo of r = w // 2
patches around it, masked to each query's w×w neighbourhood (`Tiling.band`). A query thus costs
(t + 2r)² key products instead of w², but as batched [t², E]·[E, (t + 2r)²] matmuls, which XLA
runs far faster than w² shifted elementwise products with their slice copies (measured on CPU,
ViT-S/14 at 4096 patches, window 3: the hybrid's forward 4-5x faster). Every tile array is
head-major, [B, H, T, rows, E] (T tiles): the layout whose matmuls, and the linear branch's
φ(q)·(φ(k)ᵀv) on the same rows, need no transposes (XLA:CPU's transposes are slow). The grid
is zero-padded to a multiple of t; padded query slots are cut by `untile`, padded keys masked.
Linear in N: O(N·(t + 2r)²·E). models/exact_set.py's window part uses it.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

_TILE_SIZES = (8, 7, 6)  # candidates: the one padding the grid least (ties: the larger)


def grid_side(n_patches: int, what: str) -> int:
  """The side of a square grid of n_patches tokens; a ValueError naming `what` otherwise."""
  side = int(round(n_patches**0.5))
  if side * side != n_patches:
    raise ValueError(f"attention {what} needs a square patch grid; got {n_patches} patch tokens")
  return side


@dataclasses.dataclass(frozen=True)
class Tiling:
  """side: the grid's; tile: t; radius: r, the window's half-width (the halo)."""

  side: int
  tile: int
  radius: int

  @property
  def per_side(self) -> int:
    return -(-self.side // self.tile)

  def _grid(self, x: jax.Array, before: int, after: int) -> jax.Array:
    """Patch tokens [B,M,H,E] as a grid [B,S',S',H,E], zero-padded by before / after (+ the
    padding up to a multiple of t) on both axes."""
    b, _, h, e = x.shape
    after += self.per_side * self.tile - self.side
    grid = x.reshape(b, self.side, self.side, h, e)
    return jnp.pad(grid, ((0, 0), (before, after), (before, after), (0, 0), (0, 0)))

  def queries(self, x: jax.Array) -> jax.Array:
    """Patch tokens [B,M,H,E] as tiles [B,H,T,t²,E]."""
    b, _, h, e = x.shape
    n, t = self.per_side, self.tile
    tiles = self._grid(x, 0, 0).reshape(b, n, t, n, t, h, e).transpose(0, 5, 1, 3, 2, 4, 6)
    return tiles.reshape(b, h, n * n, t * t, e)

  def keys(self, x: jax.Array) -> jax.Array:
    """Patch tokens [B,M,H,E] as haloed tiles [B,H,T,(t+2r)²,E] (overlapping: each row and
    column band is a slice, so the backward is pads and adds)."""
    b, _, h, e = x.shape
    n, t, r = self.per_side, self.tile, self.radius
    grid = self._grid(x, r, r)
    rows = jnp.stack([grid[:, i * t : i * t + t + 2 * r] for i in range(n)], axis=1)
    tiles = jnp.stack([rows[:, :, :, j * t : j * t + t + 2 * r] for j in range(n)], axis=2)
    return tiles.transpose(0, 5, 1, 2, 3, 4, 6).reshape(b, h, n * n, (t + 2 * r) ** 2, e)

  def untile(self, y: jax.Array) -> jax.Array:
    """Tiles [B,H,T,t²,...] back to patch tokens [B,M,H,...] (padded slots dropped)."""
    b, h, _, _, *rest = y.shape
    n, t = self.per_side, self.tile
    grid = y.reshape(b, h, n, n, t, t, *rest)
    grid = grid.transpose(0, 2, 4, 3, 5, 1, *range(6, grid.ndim))
    grid = grid.reshape(b, n * t, n * t, h, *rest)[:, : self.side, : self.side]
    return grid.reshape(b, self.side * self.side, h, *rest)

  def positions(self) -> tuple[np.ndarray, np.ndarray]:
    """Grid row and column of every query slot, each [T, t²] (≥ side in the padding)."""
    n, t = self.per_side, self.tile
    tile_i, tile_j = np.divmod(np.arange(n * n), n)
    x_i, x_j = np.divmod(np.arange(t * t), t)
    return tile_i[:, None] * t + x_i[None], tile_j[:, None] * t + x_j[None]

  def band(self) -> np.ndarray:
    """[T, t², (t+2r)²]: key slot y of a tile's halo lies in query slot x's w×w neighbourhood
    and inside the grid."""
    n, t, r = self.per_side, self.tile, self.radius
    x_i, x_j = np.divmod(np.arange(t * t), t)
    y_i, y_j = np.divmod(np.arange((t + 2 * r) ** 2), t + 2 * r)
    near = (np.abs(y_i[None] - r - x_i[:, None]) <= r) & (np.abs(y_j[None] - r - x_j[:, None]) <= r)
    key_i = np.arange(n)[:, None] * t + y_i[None] - r  # [n, (t+2r)²] per tile row (column alike)
    key_j = np.arange(n)[:, None] * t + y_j[None] - r
    inside_i = (key_i >= 0) & (key_i < self.side)
    inside_j = (key_j >= 0) & (key_j < self.side)
    inside = (inside_i[:, None] & inside_j[None]).reshape(n * n, 1, -1)
    return near[None] & inside


def tiling(side: int, window: int) -> Tiling:
  """The tiling of a side×side grid for a w×w window: t from _TILE_SIZES (the whole grid when it
  is smaller)."""
  if side <= _TILE_SIZES[0]:
    return Tiling(side, side, window // 2)
  tile = min(_TILE_SIZES, key=lambda t: (-(-side // t) * t, -t))
  return Tiling(side, tile, window // 2)
