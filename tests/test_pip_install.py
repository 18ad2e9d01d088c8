"""Issue 40's done criterion: a fresh `pip install` outside the checkout converts the tiny Hugging
Face model it ships and encodes a folder of photos at two resolutions, without TensorFlow.

linvit_jax is pip-installed (not editable) from a copy of the checkout into a folder of its own
(tests/helpers/pip_target.py); each step runs in a fresh interpreter with only that folder on
PYTHONPATH and its cwd outside the checkout, so nothing can come from the checkout: not tests/,
not configs/, not the shipped model. Conversion in one interpreter (it uses TensorFlow's input
pipeline), loading and encoding in another, which must never import TensorFlow.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from tests.helpers import pip_target

RES = 28  # the tiny model's patch is 7: 28 and 56 are 4x4 and 8x8 patches
WIDTH = 32

CONVERT = """
import json, os, sys
import linvit_jax
photos, workdir, res = sys.argv[1:]
teacher = os.path.join(os.path.dirname(linvit_jax.__file__), "assets", "tiny_dinov2_registers")
linvit_jax.convert(
    teacher, images=photos, workdir=workdir, res=int(res), max_images=16, batch=8, knn="none",
    tiny=True,
)
print(json.dumps({"file": linvit_jax.__file__, "teacher": teacher}))
"""

ENCODE = """
import json, sys
import numpy as np
import linvit_jax
workdir, res, paths = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
s = linvit_jax.load_student(workdir)
small, large = s.encode(paths, image_size=res), s.encode(paths, image_size=2 * res)
print(json.dumps({
    "file": linvit_jax.__file__,
    "shapes": [list(small.shape), list(large.shape)],
    "dtypes": [str(small.dtype), str(large.dtype)],
    "finite": bool(np.isfinite(small).all() and np.isfinite(large).all()),
    "tensorflow": sorted(m for m in sys.modules if m.split(".")[0] == "tensorflow"),
}))
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory):
  return pip_target.install(tmp_path_factory.mktemp("pip_install"))


def _photos(folder, n=8):
  """n smooth random photos of a few sizes (PNG and JPEG), as a user's folder might hold."""
  folder.mkdir()
  rs = np.random.RandomState(0)
  paths = []
  for i in range(n):
    small = (rs.rand(6, 8, 3) * 255).astype(np.uint8)
    image = Image.fromarray(small).resize((64 + 8 * i, 48 + 4 * i), Image.BICUBIC)
    path = folder / f"photo_{i}.{'jpg' if i % 2 else 'png'}"
    image.save(path)
    paths.append(str(path))
  return paths


def _run(site, cwd, script, *args):
  proc = subprocess.run(
      [sys.executable, "-c", script, *map(str, args)],
      cwd=cwd,
      env=pip_target.env(site),
      capture_output=True,
      text=True,
      timeout=600,
  )
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


def _inside(path, folder):
  return os.path.realpath(path).startswith(os.path.realpath(folder) + os.sep)


def test_a_pip_install_converts_the_shipped_model_and_encodes_without_tensorflow(site, tmp_path):
  cwd = tmp_path / "elsewhere"  # not the checkout: `tests`, `configs` and `linvit_jax` absent
  cwd.mkdir()
  paths = _photos(tmp_path / "photos")
  workdir = tmp_path / "workdir"

  converted = _run(site, cwd, CONVERT, tmp_path / "photos", workdir, RES)
  assert _inside(converted["file"], site), converted
  assert not _inside(converted["file"], pip_target.ROOT), converted
  assert _inside(converted["teacher"], site), converted
  assert (workdir / "student_config.json").is_file() and (workdir / "results.json").is_file()

  encoded = _run(site, cwd, ENCODE, workdir, RES, *paths)  # a fresh interpreter
  assert _inside(encoded["file"], site), encoded
  assert encoded["shapes"] == [[len(paths), WIDTH], [len(paths), WIDTH]], encoded
  assert encoded["dtypes"] == ["float32", "float32"] and encoded["finite"], encoded
  assert encoded["tensorflow"] == [], encoded
