"""Shared test fixtures: the real big_vision checkpoint shipped in tests/data, and the robustness
cases' tiny teacher and reference stage (tests/helpers/robust_config.py, tiny_task.py)."""

import pytest

from tests.helpers import bv_checkpoint


@pytest.fixture(scope="session", autouse=True)
def _feature_cache_in_a_temp_folder(tmp_path_factory):
  """The teacher-feature cache (feature_cache.py) of every test run goes to a temp folder, not the
  user's ~/.cache: a test must not read an entry an earlier run left behind."""
  import os

  previous = os.environ.get("LINVIT_CACHE_DIR")
  os.environ["LINVIT_CACHE_DIR"] = str(tmp_path_factory.mktemp("feature_cache"))
  yield
  if previous is None:
    os.environ.pop("LINVIT_CACHE_DIR", None)
  else:
    os.environ["LINVIT_CACHE_DIR"] = previous


@pytest.fixture(scope="session")
def bv_fixture():
  """(model_config, flat params, reference outputs) of the big_vision-made checkpoint."""
  return bv_checkpoint.load()


@pytest.fixture(scope="session")
def tiny_hf_conversion(tmp_path_factory):
  """`linvit_jax.convert` of the tiny Hugging Face DINOv2-with-registers (tests/data/foreign) on
  6 synthetic photos, 2 + 2 steps at 28 px, its softmax layer named (softmax_pick="1", not
  measured): (the returned Student, its workdir)."""
  import os

  import numpy as np
  from PIL import Image

  import linvit_jax

  tmp = tmp_path_factory.mktemp("tiny_hf")
  (tmp / "photos").mkdir()
  rs = np.random.RandomState(0)
  for i in range(6):
    smooth = (rs.rand(8, 9, 3) * 255).astype(np.uint8)
    Image.fromarray(smooth).resize((60, 50), Image.BICUBIC).save(tmp / "photos" / f"p{i}.png")
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  student = linvit_jax.convert(
      os.path.join(root, "tests", "data", "foreign", "hf_dinov2_registers"),
      images=str(tmp / "photos"),
      workdir=str(tmp / "work"),
      res=28,
      tiny=True,
      batch=4,
      max_images=8,
      softmax_pick="1",
  )
  return student, tmp / "work"


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
  """The path of a random softmax teacher .npz shaped for tests/helpers/robust_config.py."""
  from tests.helpers import robust_config as rc

  path = str(tmp_path_factory.mktemp("teacher") / "teacher.npz")
  rc.make_teacher(path)
  return path


@pytest.fixture(scope="module")
def tiny_reference(tmp_path_factory):
  """(flat params, history) of tiny_task's stage run once without interruption."""
  from tests.helpers import robust_common
  from tests.helpers import tiny_task as tt

  params, history = tt.run_stage(tmp_path_factory.mktemp("tiny_ref"))
  return robust_common.flat(params), history
