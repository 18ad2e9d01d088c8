"""convert_folder's argument errors (issue 40): each one line naming the argument, raised before
any compute and before the workdir exists; and `knn=auto`, which measures k-NN where
Fashion-MNIST is installed and says why not elsewhere."""

import os

import numpy as np
import pytest
from PIL import Image

from linvit_jax import preflight
from linvit_jax import run as run_lib
from linvit_jax.runtime.errors import UserError
from tests.helpers import tiny_teacher
from tests.helpers.tiny_teacher import convert_folder_config as _config


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
  """The tiny headless teacher convert_folder's tests write."""
  path = str(tmp_path_factory.mktemp("teacher") / "t.npz")
  tiny_teacher.headless_checkpoint(path)
  return path


def _photos(folder, n):
  os.makedirs(folder, exist_ok=True)
  rs = np.random.RandomState(0)
  for i in range(n):
    Image.fromarray((rs.rand(48, 40, 3) * 255).astype(np.uint8)).save(f"{folder}/p{i}.png")
  return str(folder)


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
  return _photos(tmp_path_factory.mktemp("photos"), 4)


def _run_fails(config, workdir, error=UserError) -> str:
  """The message of the error `run` raises; the workdir it was given must not exist."""
  with pytest.raises(error) as e:
    run_lib.run(config, str(workdir))
  assert not os.path.exists(workdir), os.listdir(workdir)
  message = str(e.value)
  assert "\n" not in message and len(message) < 700, message
  return message


@pytest.mark.parametrize(
    "res, fragments",
    [
        (20, ["config.data.image_size=20", "res=20", "8-px patch", "last 4 px", "16 or 24"]),
        (4, ["res=4", "8-px patch", "smaller than one patch", "nearest valid: 8"]),
    ],
)
def test_res_must_be_a_multiple_of_the_teachers_patch(teacher, photos, tmp_path, res, fragments):
  config = _config(teacher, photos, f",res={res},knn=none")
  message = _run_fails(config, tmp_path / "work")
  for fragment in fragments:
    assert fragment in message, message


@pytest.mark.parametrize(
    "extra, message",
    [
        (",max_images=0", "max_images=0: expected at least batch=4"),
        (",max_images=-5", "max_images=-5: expected at least batch=4"),
        (",holdout=1.5", "holdout=1.5: expected a fraction in (0, 1) of the photos"),
        (",holdout=0.0", "holdout=0.0: expected a fraction in (0, 1)"),
        (",distill_fraction=0.0", "distill_fraction=0.0: expected in (0, 1]"),
        (",gelu=erf", "gelu='erf': expected one of"),
    ],
)
def test_an_argument_out_of_range_is_named_by_the_config(photos, extra, message):
  with pytest.raises(ValueError) as e:
    _config("t.npz", photos, extra)
  assert str(e.value).startswith(message), str(e.value)


def test_a_text_file_as_init_is_not_a_checkpoint(photos, tmp_path):
  notes = tmp_path / "notes.npz"
  notes.write_text("not weights\n")
  message = _run_fails(_config(str(notes), photos, ",knn=none"), tmp_path / "work")
  assert "not an .npz (a zip archive of arrays), a .safetensors file or a model folder" in message
  assert "allow_pickle" not in message


def test_an_unknown_knn_name_lists_the_nearest_not_every_name(teacher, photos, tmp_path):
  message = _run_fails(_config(teacher, photos, ",knn=cifar11"), tmp_path / "work")
  assert message.startswith("config.eval.knn.dataset='cifar11': no such TFDS dataset"), message
  assert "cifar10" in message and "image_folder:<DIR>" in message, message
  assert "abstract_reasoning" not in message  # TFDS's own error lists all ~450 names


def test_a_folder_of_one_photo_fails_before_the_workdir(teacher, tmp_path):
  one = _photos(tmp_path / "one", 1)
  message = _run_fails(_config(teacher, one, ",knn=none"), tmp_path / "work")
  assert "holds 1 readable photo and this split gets none" in message, message
  assert "need at least 2 photos" in message, message


def test_an_empty_folder_fails_before_the_workdir(teacher, tmp_path):
  (tmp_path / "empty").mkdir()
  message = _run_fails(_config(teacher, tmp_path / "empty", ",knn=none"), tmp_path / "work")
  assert "no image files in" in message, message


def test_the_writability_check_leaves_nothing_behind(tmp_path):
  preflight.prepare_workdir(str(tmp_path / "w"))
  assert os.listdir(tmp_path / "w") == []


@pytest.fixture
def no_fashion_mnist(tmp_path, monkeypatch):
  """A machine without Fashion-MNIST: no IDX files, and no prepared copy in knn_data_dir."""
  monkeypatch.setenv("LINVIT_FASHION_MNIST_DIR", str(tmp_path / "no_idx"))
  return f",knn_data_dir={tmp_path / 'no_tfds'}"


def test_knn_auto_is_the_default_and_says_why_it_measures_nothing(photos, no_fashion_mnist):
  config = _config("t.npz", photos, no_fashion_mnist)
  assert config.eval.knn.dataset == preflight.KNN_AUTO
  resolved, reason = preflight.resolve_knn(config)
  assert resolved.eval.knn.dataset == "" and config.eval.knn.dataset == "auto"
  assert reason.startswith("k-NN not measured: knn=auto found no Fashion-MNIST"), reason
  for fix in ("dataset-fashion-mnist", "LINVIT_FASHION_MNIST_DIR", "knn=image_folder:DIR"):
    assert fix in reason, reason


@pytest.mark.skipif(
    not os.path.exists("/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz"),
    reason="dataset-fashion-mnist not installed",
)
def test_knn_auto_measures_fashion_mnist_where_installed(photos, monkeypatch):
  monkeypatch.delenv("LINVIT_FASHION_MNIST_DIR", raising=False)
  resolved, reason = preflight.resolve_knn(_config("t.npz", photos))
  assert (resolved.eval.knn.dataset, reason) == ("fashion_mnist_local", "")


def test_knn_none_and_other_sets_are_not_resolved(photos):
  for knn in ("none", "image_folder:/x"):
    config = _config("t.npz", photos, f",knn={knn}")
    assert preflight.resolve_knn(config) == (config, "")


def test_an_explicit_fashion_mnist_that_is_missing_names_the_fixes(
    teacher, photos, tmp_path, no_fashion_mnist
):
  config = _config(teacher, photos, f",knn=fashion_mnist_local{no_fashion_mnist}")
  message = _run_fails(config, tmp_path / "work")
  assert message.startswith("config.eval.knn.dataset='fashion_mnist_local': Fashion-MNIST not")
  for fix in ("apt-get install -y dataset-fashion-mnist", "knn=none", "knn=auto"):
    assert fix in message, message


def test_validate_accepts_knn_auto_unresolved():
  preflight.check_knn_dataset(preflight.KNN_AUTO, "")  # resolve_knn decides when the run starts
