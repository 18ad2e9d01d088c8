"""gfile.py: one set of file functions for local paths and URLs.

`ram://` is TensorFlow's in-memory file system, reached through the same tf.io.gfile layer as
gs://, so what works there works on a gs:// workdir (no network needed).
"""

import os

import pytest

from linvit_jax.evaluation import plots
from linvit_jax.runtime import gfile


@pytest.fixture(params=["local", "ram"])
def root(request, tmp_path):
  return str(tmp_path) if request.param == "local" else f"ram://gfile_test_{os.getpid()}"


def test_is_remote():
  assert gfile.is_remote("gs://bucket/x") and gfile.is_remote("ram://x")
  assert not gfile.is_remote("/tmp/x") and not gfile.is_remote("workdirs/demo")


def test_files_round_trip(root):
  folder = os.path.join(root, "a", "b")
  gfile.makedirs(folder)
  gfile.makedirs(folder)  # an existing folder is fine
  assert gfile.isdir(folder)
  path = os.path.join(folder, "x.json")
  assert gfile.read_text(path) is None and not gfile.exists(path)
  gfile.write_text(path, "one")
  gfile.write_text(path, "two")  # replaced, through a temporary file that does not stay
  assert gfile.read_text(path) == "two"
  assert sorted(gfile.listdir(folder)) == ["x.json"]
  gfile.copy(path, os.path.join(folder, "y.json"))
  with gfile.open(os.path.join(folder, "y.json"), "rb") as f:
    assert f.read() == b"two"
  gfile.rename(os.path.join(folder, "y.json"), path)
  assert sorted(gfile.listdir(folder)) == ["x.json"]
  gfile.remove(path)
  assert not gfile.exists(path)


def test_ablation_plot_goes_through_gfile(root):
  gfile.makedirs(root)
  runs = {
      "copy_same": [
          {
              "histories": {
                  "finetune": [{"step": 1, "eval/top1": 0.5}, {"step": 2, "eval/top1": 0.6}]
              }
          }
      ]
  }
  path = os.path.join(root, "ablation.png")
  plots.plot_ablation_curves(runs, path, teacher_top1=0.7)
  with gfile.open(path, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_atomic_open_replaces_only_a_complete_file(root):
  folder = os.path.join(root, "atomic")  # (ram:// outlives a test: a folder of its own)
  gfile.makedirs(folder)
  path = os.path.join(folder, "x.bin")
  with gfile.atomic_open(path, "wb") as f:
    f.write(b"old")
  with pytest.raises(RuntimeError, match="cut short"):
    with gfile.atomic_open(path, "wb") as f:
      f.write(b"half of the new")
      raise RuntimeError("cut short")
  with gfile.open(path, "rb") as f:
    assert f.read() == b"old"  # the failed write left the old file
  assert gfile.listdir(folder) == ["x.bin"]  # and no temporary file
  if not gfile.is_remote(
      folder
  ):  # the file is shared like any the user writes (not mkstemp's 0600)
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(path).st_mode & 0o777 == 0o666 & ~umask
