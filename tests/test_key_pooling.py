"""studies/key_pooling: the pooled grid's side, the teacher pooled nowhere (a grid no wider than
key_grid) giving cosine 1, pooling that costs something at a wider grid, and the CLI's table,
JSON and one-line errors."""

import json

import jax
import numpy as np
import pytest

from linvit_jax.configuration import config_lib
from linvit_jax.models import attention_ops
from linvit_jax.models import checkpoints
from linvit_jax.models import vit
from linvit_jax.studies import key_pooling
from tests.helpers import tiny_teacher


@pytest.mark.parametrize(
    "grid,key_grid,side",
    [(16, 16, 16), (32, 16, 16), (64, 16, 16), (64, 32, 32), (10, 4, 4), (9, 4, 4), (17, 16, 16)],
)
def test_pooled_side_is_the_operators_block_grid(grid, key_grid, side):
  assert attention_ops.pooled_grid_side(grid, key_grid) == side


@pytest.mark.parametrize(
    "value,image_size,patch,side",
    [
        (32, 224, 14, 32),  # patches: as they are, whatever the size
        ("32", 448, 16, 32),
        (0, 224, 14, 0),
        ("2x", 224, 14, 32),  # twice the training grid of 16
        ("2x", 224, 16, 28),
        ("2x", 448, 14, 64),
        ("1.5x", 224, 14, 24),
        ("0.01x", 224, 14, 1),  # never 0 (which would mean every key)
        ("0.5x", 70, 14, 3),  # halves round up: 2.5 -> 3, as 3.5 -> 4
        ("0.5x", 98, 14, 4),
        (np.int64(24), 224, 14, 24),
    ],
)
def test_key_grid_in_patches(value, image_size, patch, side):
  assert config_lib.key_grid_patches(value, image_size, patch) == side


@pytest.mark.parametrize(
    "value", [-1, True, "-1", "x", "0x", "-2x", "infx", "2X", 2.0, "²", "٣", " 2x", "1e1x", "+2x"]
)
def test_key_grid_forms_refused(value):
  assert not config_lib.key_grid_valid(value)
  with pytest.raises(ValueError, match="expected a grid side in patches"):
    config_lib.key_grid_patches(value, 224, 14)


@pytest.mark.parametrize(
    "value,canonical", [("32", 32), (32, 32), ("2.0x", "2x"), ("2x", "2x"), ("1.50x", "1.5x")]
)
def test_key_grid_has_one_spelling(value, canonical):
  assert config_lib.key_grid_canonical(value) == canonical


@pytest.fixture(scope="module")
def teacher_and_photos(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("key_pooling")
  fields = dict(tiny_teacher.TINY, patch_size=(4, 4))  # a 4×4 grid at 16 px, 8×8 at 32
  model = vit.Model(**fields)
  params = jax.jit(model.init)(jax.random.PRNGKey(0), np.zeros((1, 16, 16, 3), np.float32))
  init = str(tmp / "teacher.npz")
  checkpoints.save_npz(init, jax.device_get(params["params"]))
  photos = str(tmp / "photos")
  tiny_teacher.smooth_photos(photos, n=3)
  return init, photos


def test_cli_prices_each_layer_and_every_layer(teacher_and_photos, tmp_path, capsys):
  init, photos = teacher_and_photos
  out = str(tmp_path / "k.json")
  argv = ["--teacher", init, "--photos", photos, "--res", "16", "--factors", "1,2"]
  assert key_pooling.main([*argv, "--grids", "2,4", "--out", out]) == 0
  with open(out) as f:
    results = json.load(f)
  blocks = {(b["res"], b["key_grid"]): b for b in results["sizes"]}
  assert sorted(blocks) == [(16, 2), (16, 4), (32, 2), (32, 4)] and results["n_photos"] == 3
  assert [r["layer"] for r in blocks[(16, 2)]["layers"]] == [0, 1, "every"]
  # 16 px with key_grid 4: the 4×4 grid is left whole, the teacher itself
  for row in blocks[(16, 4)]["layers"]:
    assert row["cls"] == pytest.approx(1, abs=1e-5) and row["patch_min"] == pytest.approx(
        1, abs=1e-5
    )
  # 32 px with key_grid 2: 8×8 patches pooled to 2×2 blocks cost something, every layer most
  coarse = {r["layer"]: r for r in blocks[(32, 2)]["layers"]}
  assert blocks[(32, 2)]["pooled_to"] == 2 and blocks[(32, 4)]["pooled_to"] == 4
  assert all(r["patch"] < 1 - 1e-5 and r["cls_min"] <= r["cls"] for r in coarse.values())
  assert coarse["every"]["patch"] <= min(coarse[0]["patch"], coarse[1]["patch"]) + 1e-6
  assert "keys pooled to 2²" in capsys.readouterr().out


def test_cli_errors_are_one_line(teacher_and_photos, capsys):
  init, photos = teacher_and_photos
  argv = ["--teacher", init, "--photos", photos, "--res", "16"]
  assert key_pooling.main([*argv, "--layers", "2"]) == 2
  assert "--layers '2': the teacher has layers 0..1" in capsys.readouterr().err
  assert key_pooling.main([*argv, "--grids", "0"]) == 2
  assert "--grids '0': expected numbers > 0 such as 16,32" in capsys.readouterr().err
  assert key_pooling.main([*argv, "--grids", "16,x"]) == 2
  assert "--grids '16,x': expected numbers such as 16,32" in capsys.readouterr().err
  assert key_pooling.main([*argv, "--factors", "1.1"]) == 2
  err = capsys.readouterr().err
  assert "not a multiple of the patch" in err and err.count("\n") == 1
