"""The tiling of a patch grid behind the window hybrid: query tiles round-trip, haloed key
tiles hold the right neighbours, the band is exactly each query's w×w neighbourhood."""

import jax
import numpy as np
import pytest

from linvit_jax.models import grid_tiles


@pytest.mark.parametrize("side, window", [(4, 7), (10, 3), (13, 5), (16, 3)])
def test_tiles_hold_each_query_and_its_window_neighbours(side, window):
  tiles = grid_tiles.tiling(side, window)
  x = jax.random.normal(jax.random.PRNGKey(0), (2, side * side, 3, 5))
  x_np, q, k = np.asarray(x), np.asarray(tiles.queries(x)), np.asarray(tiles.keys(x))
  np.testing.assert_array_equal(np.asarray(tiles.untile(tiles.queries(x))), x_np)
  band, (rows, cols) = tiles.band(), tiles.positions()
  r = window // 2
  for tile in range(band.shape[0]):
    for slot in range(band.shape[1]):
      i, j = rows[tile, slot], cols[tile, slot]
      if i >= side or j >= side:  # a padded slot: zeros, dropped by untile
        assert not q[:, :, tile, slot].any()
        continue
      np.testing.assert_array_equal(q[:, :, tile, slot], x_np[:, i * side + j])  # [B,H,E]
      near = [
          a * side + b
          for a in range(max(i - r, 0), min(i + r + 1, side))
          for b in range(max(j - r, 0), min(j + r + 1, side))
      ]  # row-major, as the halo slots are
      keys = k[:, :, tile][:, :, band[tile, slot]]  # [B,H,|window ∩ grid|,E]
      np.testing.assert_array_equal(keys, x_np[:, near].swapaxes(1, 2))


def test_tile_size_pads_the_grid_least():
  assert grid_tiles.tiling(64, 3).tile == 8
  assert grid_tiles.tiling(73, 3).tile == 7  # 77 > 73, not 80
  assert grid_tiles.tiling(5, 3).tile == 5  # a small grid is one tile
  with pytest.raises(ValueError, match="window needs a square patch grid; got 15"):
    grid_tiles.grid_side(15, "window")
