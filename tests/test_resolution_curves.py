"""tools/resolution_curves.py: every kept checkpoint of a finished (tiny) run, measured on its
validation photos at several sizes; the last checkpoint's point is the exported student's."""

import json
import os

import numpy as np
import pytest

from tests.helpers import tiny_teacher
from tools import resolution_curves


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
  from linvit_jax import run as run_lib

  tmp = tmp_path_factory.mktemp("curves")
  ckpt = str(tmp / "teacher.npz")
  tiny_teacher.headless_checkpoint(ckpt)
  tiny_teacher.smooth_photos(str(tmp / "photos"), n=12)
  config = tiny_teacher.convert_folder_config(ckpt, str(tmp / "photos"), ",holdout=0.5")
  workdir = str(tmp / "work")
  run_lib.run(config, workdir)
  return workdir


def test_every_kept_checkpoint_at_every_size(tiny_run):
  curves = resolution_curves.measure(tiny_run, factors=(1, 2), views=("whole",))
  stages = [
      s for s in ("distill_attention", "align") if resolution_curves.checkpoint_steps(tiny_run, s)
  ]
  assert stages == ["distill_attention", "align"]
  kept = sum(len(resolution_curves.checkpoint_steps(tiny_run, s)) for s in stages)
  assert curves["sizes"] == [32, 64] and curves["n_photos"] >= 1
  assert len(curves["points"]) == kept * 2
  seen = [p["images_seen"] for p in curves["points"] if p["size"] == 32]
  assert seen == sorted(seen) and len(set(seen)) == kept  # align continues after distillation
  for p in curves["points"]:
    assert -1.0 <= p["patch_cosine"] <= 1.0 + 1e-6 and -1.0 <= p["cls_cosine"] <= 1.0 + 1e-6


def test_the_last_checkpoint_is_the_exported_student(tiny_run):
  import linvit_jax

  student = linvit_jax.load_student(tiny_run)
  last = resolution_curves.checkpoint_steps(tiny_run, "align")[-1]
  params = resolution_curves.restore_params(tiny_run, "align", last)
  flat = lambda tree: {  # noqa: E731
      "/".join(str(getattr(k, "key", k)) for k in path): np.asarray(v)
      for path, v in __import__("jax").tree_util.tree_flatten_with_path(tree)[0]
  }
  restored, exported = flat(params), flat(student.params)
  assert restored.keys() == exported.keys()
  for name, value in exported.items():
    np.testing.assert_allclose(restored[name], value, rtol=1e-6, atol=1e-6, err_msg=name)


def test_cli_writes_the_json_and_the_plot(tiny_run, tmp_path):
  out, png = str(tmp_path / "c.json"), str(tmp_path / "c.png")
  relative = os.path.relpath(tiny_run)  # as a user types it (orbax wants absolute paths)
  assert resolution_curves.main([relative, "--factors", "1", "--out", out, "--plot", png]) == 0
  with open(out) as f:
    assert json.load(f)["sizes"] == [32]
  assert os.path.getsize(png) > 1000


def test_a_folder_that_is_not_a_run_is_named(tmp_path):
  with pytest.raises(SystemExit, match="not a finished run"):
    resolution_curves.measure(str(tmp_path))


def test_token_structure_measures_the_shared_part_and_the_deviations(tiny_run, tmp_path):
  from tools import token_structure

  out = str(tmp_path / "s.json")
  assert token_structure.main([tiny_run, "--factors", "1", "--out", out]) == 0
  with open(out) as f:
    result = json.load(f)
  (row,) = result["rows"]
  assert row["size"] == 32 and result["n_photos"] >= 1
  assert 0.0 < row["mean_token_share"] <= 1.0 + 1e-6  # |mean| ≤ mean |x|
  assert -1.0 <= row["deviation_cosine"] <= 1.0 + 1e-6 and -1.0 <= row["patch_cosine"] <= 1 + 1e-6
