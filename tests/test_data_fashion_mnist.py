"""The embedded Fashion-MNIST: prepared from the Debian package into a temporary TFDS data_dir."""

import collections
import os

import numpy as np
import pytest

from linvit_jax.data import fashion_mnist
from linvit_jax.data import input_pipeline

if not os.path.exists(os.path.join(fashion_mnist.source_dir(), "t10k-labels-idx1-ubyte.gz")):
  pytest.skip(
      "needs: apt-get update && apt-get install -y dataset-fashion-mnist", allow_module_level=True
  )

PP = (
    'decode(channels=1)|value_range(-1,1)|onehot(10, key="label", key_result="labels")|'
    'keep("image", "labels")'
)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  """Prepared once per session (~20 s on 2 cores), through the pipeline's auto-preparation."""
  data_dir = str(tmp_path_factory.mktemp("tfds"))
  assert input_pipeline.num_examples("fashion_mnist_local", "test", data_dir) == 10_000
  return data_dir


def test_sizes_and_classes(data_dir):
  assert input_pipeline.num_examples("fashion_mnist_local", "train", data_dir) == 60_000
  for split, n in [("train", 60_000), ("test", 10_000)]:
    labels = collections.Counter()
    for batch in input_pipeline.make_eval_iterator(
        dataset="fashion_mnist_local",
        split=split,
        pp='keep("label")',
        global_batch_size=10_000,
        data_dir=data_dir,
    ):
      labels.update(batch["label"][batch["_mask"]].tolist())
    assert labels == {c: n // 10 for c in range(10)}


def test_images_are_the_idx_images(data_dir):
  idx = fashion_mnist.read_idx(
      os.path.join(fashion_mnist.source_dir(), "t10k-images-idx3-ubyte.gz")
  )
  batch = next(
      input_pipeline.make_eval_iterator(
          dataset="fashion_mnist_local",
          split="test[:16]",
          pp='decode(channels=1)|keep("image")',
          global_batch_size=16,
          data_dir=data_dir,
      )
  )
  assert batch["image"].shape == (16, 28, 28, 1) and batch["image"].dtype == np.uint8
  np.testing.assert_array_equal(batch["image"][..., 0], idx[:16])  # Lossless, in file order.


def test_train_batches(data_dir):
  it = input_pipeline.make_train_iterator(
      dataset="fashion_mnist_local",
      split="train",
      pp=PP,
      global_batch_size=32,
      seed=0,
      data_dir=data_dir,
  )
  batch = next(it)
  assert batch["image"].shape == (32, 28, 28, 1) and batch["image"].dtype == np.float32
  assert batch["image"].min() == -1 and batch["image"].max() == 1
  np.testing.assert_array_equal(batch["labels"].sum(1), 1)


def test_missing_package_says_what_to_install(tmp_path, monkeypatch):
  monkeypatch.setenv(fashion_mnist.ENV_DIR, str(tmp_path / "nowhere"))
  with pytest.raises(
      FileNotFoundError,
      match=r"Fashion-MNIST not found at .*nowhere.*"
      r"apt-get update && apt-get install -y dataset-fashion-mnist",
  ):
    input_pipeline.num_examples("fashion_mnist_local", "train", str(tmp_path / "tfds"))


def test_preparing_is_serialised_across_processes(tmp_path):
  """prepare() holds an flock while it prepares: a second holder (another worker or process)
  waits until the first lets go, then finds the dataset prepared instead of racing TFDS's
  rename."""
  import threading
  import time

  entered = []

  def second():
    with fashion_mnist.prepare_lock(str(tmp_path)):
      entered.append(time.monotonic())

  with fashion_mnist.prepare_lock(str(tmp_path)):
    thread = threading.Thread(target=second)
    thread.start()
    time.sleep(0.5)
    assert not entered  # blocked while the first holds the lock
    released = time.monotonic()
  thread.join(timeout=10)
  assert entered and entered[0] >= released
  assert (tmp_path / f".{fashion_mnist.NAME}.lock").exists()


def test_write_folder_writes_the_idx_images_as_grayscale_pngs(tmp_path):
  from PIL import Image

  out = str(tmp_path / "fm")
  assert fashion_mnist.main([out, "--split", "test", "--start", "9997", "--count", "3"]) == 0
  idx = fashion_mnist.read_idx(
      os.path.join(fashion_mnist.source_dir(), "t10k-images-idx3-ubyte.gz")
  )
  assert sorted(os.listdir(out)) == ["fm_9997.png", "fm_9998.png", "fm_9999.png"]
  for i in (9997, 9998, 9999):
    image = Image.open(os.path.join(out, f"fm_{i}.png"))
    assert image.mode == "L"
    np.testing.assert_array_equal(np.asarray(image), idx[i])
  with pytest.raises(ValueError, match=r"images \[9999, 10001\) are outside the 10000 of 'test'"):
    fashion_mnist.write_folder(out, "test", 9999, 2)
