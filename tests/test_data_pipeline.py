"""Input pipelines: process shares, eval coverage, determinism, skip-ahead, mock ImageNet, JFT."""

import collections
import itertools
import os

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
from etils import epath

from linvit_jax.data import input_pipeline
from linvit_jax.data import jft

N_TRAIN, N_TEST = 96, 37
# Train pp with every kind of random op, so determinism covers augmentation too.
PP_TRAIN = 'decode|inception_crop(6)|flip_lr|value_range(-1,1)|keep("id", "image")'
PP_IDS = 'keep("id")'


class LinvitTestIds(tfds.core.GeneratorBasedBuilder):
  """A tiny real TFDS dataset whose examples carry their index, to check who reads what."""

  VERSION = tfds.core.Version("1.0.0")
  # TFDS looks for metadata files in the builder's package; a test module may be no package.
  pkg_dir_path = epath.Path(__file__).parent

  def _info(self):
    return self.dataset_info_from_configs(
        features=tfds.features.FeaturesDict(
            {
                "id": tfds.features.Scalar(np.int64),
                "image": tfds.features.Image(shape=(8, 8, 3), encoding_format="jpeg"),
                "label": tfds.features.ClassLabel(num_classes=5),
            }
        ),
        disable_shuffling=True,
    )

  def _split_generators(self, dl_manager):
    return {"train": self._generate_examples(N_TRAIN), "test": self._generate_examples(N_TEST)}

  def _generate_examples(self, n):
    for i in range(n):
      yield i, {"id": i, "image": np.full((8, 8, 3), 3 * i % 256, np.uint8), "label": i % 5}


@pytest.fixture(scope="module")
def ids_dir(tmp_path_factory):
  data_dir = str(tmp_path_factory.mktemp("tfds"))
  LinvitTestIds(data_dir=data_dir).download_and_prepare()
  return data_dir


def train(data_dir, **kw):
  args = dict(
      dataset="linvit_test_ids",
      split="train",
      pp=PP_TRAIN,
      global_batch_size=8,
      seed=0,
      data_dir=data_dir,
      shuffle_buffer=16,
  )
  return input_pipeline.make_train_iterator(**{**args, **kw})


def take(it, n):
  return list(itertools.islice(it, n))


def assert_same_batches(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert sorted(x) == sorted(y)
    for k in x:
      np.testing.assert_array_equal(x[k], y[k], err_msg=k)


def test_num_examples(ids_dir):
  assert input_pipeline.num_examples("linvit_test_ids", "train", ids_dir) == N_TRAIN
  assert input_pipeline.num_examples("linvit_test_ids", "test[:10]", ids_dir) == 10


def test_train_batches_shapes_and_epochs(ids_dir):
  batches = take(train(ids_dir), 2 * N_TRAIN // 8)
  b = batches[0]
  assert b["image"].shape == (8, 6, 6, 3) and b["image"].dtype == np.float32
  assert -1 <= b["image"].min() and b["image"].max() <= 1 and sorted(b) == ["id", "image"]
  ids = np.concatenate([b["id"] for b in batches])
  # Each epoch is a permutation of the split, and the two epochs are ordered differently.
  assert sorted(ids[:N_TRAIN]) == sorted(ids[N_TRAIN:]) == list(range(N_TRAIN))
  assert not np.array_equal(ids[:N_TRAIN], ids[N_TRAIN:])
  assert not np.array_equal(ids[:N_TRAIN], np.arange(N_TRAIN))


def test_same_seed_same_batches_other_seed_other_batches(ids_dir):
  assert_same_batches(take(train(ids_dir), 5), take(train(ids_dir), 5))
  other = take(train(ids_dir, seed=1), 5)
  assert not np.array_equal(other[0]["id"], take(train(ids_dir), 1)[0]["id"])


def test_composed_batches_are_mosaics_of_the_batch_and_resume(ids_dir):
  """compose=0.5: the first half of each batch are 2×2 mosaics of images i..i+3 (area-resized
  quadrants); the rest and every id are unchanged; resuming gives the same batches."""
  import tensorflow as tf

  plain, composed = take(train(ids_dir), 3), take(train(ids_dir, compose=0.5), 3)
  for p, c in zip(plain, composed):
    np.testing.assert_array_equal(p["id"], c["id"])
    np.testing.assert_array_equal(p["image"][4:], c["image"][4:])
    x = p["image"]  # [8, 6, 6, 3]: quadrants of 3×3
    for i in range(4):
      for q, (r, col) in enumerate([(0, 0), (0, 3), (3, 0), (3, 3)]):
        ref = tf.image.resize(x[(i + q) % 8][None], (3, 3), method="area")[0].numpy()
        np.testing.assert_allclose(c["image"][i, r : r + 3, col : col + 3], ref, atol=1e-6)
  assert_same_batches(composed[2:], take(train(ids_dir, compose=0.5, start_step=2), 1))
  with pytest.raises(ValueError, match=r"data.compose is a fraction of each batch in \[0, 1\]"):
    train(ids_dir, compose=1.5)


def test_mixup_blends_each_image_with_its_neighbour_and_resumes(ids_dir):
  """mixup=1: image i is (1 − λ_i)·image i + λ_i·image i − 1 (mod B) of the plain batch, one λ_i
  in [0, 1] per image (the same at every pixel), varied; ids unchanged; resuming at a step gives
  the same blends; a negative concentration is refused."""
  plain, mixed = take(train(ids_dir), 3), take(train(ids_dir, mixup=1.0), 3)
  lams = []
  for p, m in zip(plain, mixed):
    np.testing.assert_array_equal(p["id"], m["id"])
    x, prev = p["image"], np.roll(p["image"], 1, axis=0)
    for i in range(8):
      diff = prev[i] - x[i]
      assert np.abs(diff).max() > 1e-3  # the fixture's images differ (each id its own grey)
      lam = np.sum((m["image"][i] - x[i]) * diff) / np.sum(diff * diff)
      assert -1e-6 <= lam <= 1 + 1e-6
      np.testing.assert_allclose(m["image"][i], (1 - lam) * x[i] + lam * prev[i], atol=1e-5)
      lams.append(lam)
  assert np.std(lams) > 0.1  # one weight per image, not one per batch
  assert_same_batches(mixed[2:], take(train(ids_dir, mixup=1.0, start_step=2), 1))
  for bad in (-1.0, float("nan")):
    with pytest.raises(ValueError, match=r"mixup is a Beta concentration .* got (-1|nan)"):
      train(ids_dir, mixup=bad)
  with pytest.raises(ValueError, match=r"mixup blends images within a batch: 1 image"):
    train(ids_dir, mixup=1.0, global_batch_size=1)


def test_mixup_of_integer_images_blends_and_rounds():
  """A pp without value_range leaves uint8 images: the blend is computed in float and rounded,
  not cast to λ = 0."""
  images = tf.constant(np.array([[[[0]]], [[[200]]]], np.uint8))
  mixed = input_pipeline.mix_with_previous(images, tf.constant([0.25, 0.5])).numpy()
  assert mixed.dtype == np.uint8
  np.testing.assert_array_equal(mixed.ravel(), [50, 100])  # 0.75·0 + 0.25·200; 0.5·200 + 0.5·0


@pytest.mark.parametrize("concentration", [0.2, 1.0, 5.0])
def test_mixup_weights_follow_beta(concentration):
  """beta_weights draws Beta(c, c): mean 1/2 and variance 1 / (4 (2c + 1)); stateless."""
  key = tf.constant([3, 7], tf.int64)
  lam = input_pipeline.beta_weights(key, 20_000, concentration).numpy()
  assert lam.min() >= 0 and lam.max() <= 1
  assert abs(lam.mean() - 0.5) < 0.01
  np.testing.assert_allclose(lam.var(), 1 / (4 * (2 * concentration + 1)), rtol=0.05)
  np.testing.assert_array_equal(lam, input_pipeline.beta_weights(key, 20_000, concentration))


@pytest.mark.parametrize("start_step, process_count", [(3, 1), (13, 1), (7, 2)])
def test_skip_ahead_equals_uninterrupted(ids_dir, start_step, process_count):
  # Steps 13 (x 8 examples) and 7 (x 4 per process, 48 per process) start in the second epoch.
  kw = dict(process_index=process_count - 1, process_count=process_count)
  full = take(train(ids_dir, **kw), start_step + 3)
  resumed = take(train(ids_dir, start_step=start_step, **kw), 3)
  assert_same_batches(full[start_step:], resumed)


def test_blocks_reorder_epochs_and_keep_skip_ahead(ids_dir, monkeypatch):
  # With blocks of 8 examples the share is read as 12 blocks in a per-epoch order.
  monkeypatch.setattr(input_pipeline, "_MIN_BLOCK_EXAMPLES", 8)
  batches = take(train(ids_dir, shuffle_buffer=0, pp=PP_IDS), 2 * N_TRAIN // 8)
  ids = np.concatenate([b["id"] for b in batches])
  assert sorted(ids[:N_TRAIN]) == sorted(ids[N_TRAIN:]) == list(range(N_TRAIN))
  assert not np.array_equal(ids[:N_TRAIN], ids[N_TRAIN:])
  resumed = take(train(ids_dir, shuffle_buffer=0, pp=PP_IDS, start_step=15), 2)
  assert_same_batches(batches[15:17], resumed)


def test_per_process_train_shares_are_disjoint_and_cover(ids_dir):
  count, local_batch = 3, 4  # 32 examples each: one epoch is 8 local batches.
  shares = []
  for index in range(count):
    it = train(
        ids_dir,
        pp=PP_IDS,
        global_batch_size=count * local_batch,
        process_index=index,
        process_count=count,
    )
    shares.append(set(np.concatenate([b["id"] for b in take(it, 8)]).tolist()))
  assert all(len(s) == N_TRAIN // count for s in shares)
  assert set.union(*shares) == set(range(N_TRAIN))


@pytest.mark.parametrize("count, global_batch", [(1, 10), (2, 8), (3, 6)])
def test_eval_covers_every_example_once(ids_dir, count, global_batch):
  seen, num_batches = collections.Counter(), set()
  for index in range(count):
    batches = list(
        input_pipeline.make_eval_iterator(
            dataset="linvit_test_ids",
            split="test",
            pp='decode|value_range(-1,1)|keep("id","image")',
            global_batch_size=global_batch,
            data_dir=ids_dir,
            process_index=index,
            process_count=count,
        )
    )
    num_batches.add(len(batches))
    for b in batches:
      assert b["_mask"].dtype == bool and b["image"].shape == (global_batch // count, 8, 8, 3)
      seen.update(b["id"][b["_mask"]].tolist())
      assert not b["image"][~b["_mask"]].any()  # Padding is zeros.
  assert len(num_batches) == 1  # Every process runs the same number of eval steps.
  assert seen == collections.Counter(range(N_TEST))


def test_errors_are_clear(ids_dir, tmp_path):
  with pytest.raises(ValueError, match="multiple of the process count 3"):
    train(ids_dir, global_batch_size=8, process_count=3, process_index=0)
  with pytest.raises(FileNotFoundError, match="'linvit_test_ids' is not prepared in"):
    train(str(tmp_path))
  with pytest.raises(ValueError, match=r"unknown preprocessing op 'decod'"):
    train(ids_dir, pp="decod")


def test_mock_imagenet2012():
  pp = (
      "decode|inception_crop(32)|flip_lr|value_range(-1,1)|"
      'onehot(1000,key="label",key_result="labels")|keep("image","labels")'
  )
  pp_eval = (
      "decode|resize_small(36)|central_crop(32)|value_range(-1,1)|"
      'onehot(1000,key="label",key_result="labels")|keep("image","labels")'
  )
  with tfds.testing.mock_data(num_examples=12):
    assert input_pipeline.num_examples("imagenet2012", "validation") == 12
    it = input_pipeline.make_train_iterator(
        dataset="imagenet2012", split="train", pp=pp, global_batch_size=8, seed=0, start_step=1
    )
    batch = next(it)
    evals = list(
        input_pipeline.make_eval_iterator(
            dataset="imagenet2012", split="validation", pp=pp_eval, global_batch_size=5
        )
    )
  assert batch["image"].shape == (8, 32, 32, 3) and batch["labels"].shape == (8, 1000)
  assert -1 <= batch["image"].min() and batch["image"].max() <= 1
  np.testing.assert_array_equal(batch["labels"].sum(1), 1)
  assert [e["_mask"].sum() for e in evals] == [5, 5, 2]
  assert evals[0]["image"].shape == (5, 32, 32, 3)


# --- JFT-style TFRecords -------------------------------------------------------------------------
N_JFT, DEPTH = 30, 1003


def jft_labels(i):
  """Example i's labels: its own id (< 1000, to recover it) and a class 1000 + i % 3."""
  return [i, 1000 + i % 3] if i % 4 else [i, 1000 + i % 3, i]  # Some with a repeated id.


@pytest.fixture(scope="module")
def jft_glob(tmp_path_factory):
  root = tmp_path_factory.mktemp("jft")
  jpeg = lambda i: tf.io.encode_jpeg(np.full((12, 10, 3), i, np.uint8)).numpy()
  examples = [(jpeg(i), jft_labels(i)) for i in range(N_JFT)]
  jft.write_tfrecords(str(root / "train"), examples[:21], num_shards=3)
  jft.write_tfrecords(str(root / "test"), examples[21:], num_shards=1)
  return str(root / "{split}-*.tfrecord")


def ids_of(batch):
  labels = batch["labels"][batch["_mask"]] if "_mask" in batch else batch["labels"]
  ids = labels[:, :1000].argmax(1)
  for i, row in zip(ids, labels):  # The multi-hot rows are exactly the written labels.
    np.testing.assert_array_equal(np.flatnonzero(row), sorted(set(jft_labels(int(i)))))
  return ids


def test_jft_counts_and_multi_hot(jft_glob):
  assert input_pipeline.num_examples(f"jft:{jft_glob}", "train") == 21
  files = jft.list_files(jft_glob, "train")
  assert len(files) == 3 and jft.count_examples(files) == [7, 7, 7]
  os.remove(os.path.join(os.path.dirname(files[0]), jft.COUNTS_FILE))  # Counted by reading.
  assert jft.count_examples(files) == [7, 7, 7]
  pp = f'decode|resize(4)|value_range(-1,1)|multi_hot({DEPTH})|keep("image","labels")'
  kw = dict(dataset=f"jft:{jft_glob}", split="train", pp=pp, global_batch_size=7, shuffle_buffer=5)
  batches = take(input_pipeline.make_train_iterator(**kw, seed=0), 6)
  assert batches[0]["labels"].dtype == np.float32 and batches[0]["image"].shape == (7, 4, 4, 3)
  ids = np.concatenate([ids_of(b) for b in batches])
  assert sorted(ids[:21]) == sorted(ids[21:]) == list(range(21))
  resumed = take(input_pipeline.make_train_iterator(**kw, seed=0, start_step=4), 2)
  assert_same_batches(batches[4:], resumed)


@pytest.mark.parametrize("count", [2, 4])  # Files dealt out (3 files, 2 processes), or records.
def test_jft_shares_and_eval(jft_glob, count):
  pp = f'multi_hot({DEPTH})|keep("labels")'
  seen = collections.Counter()
  for index in range(count):
    for b in input_pipeline.make_eval_iterator(
        dataset=f"jft:{jft_glob}",
        split="train",
        pp=pp,
        global_batch_size=2 * count,
        process_index=index,
        process_count=count,
    ):
      seen.update(ids_of(b).tolist())
  assert seen == collections.Counter(range(21))
  sizes = input_pipeline._JftSource(jft_glob, "train").sizes(count)
  shares = []
  for index in range(count):
    it = input_pipeline.make_train_iterator(
        dataset=f"jft:{jft_glob}",
        split="train",
        pp=pp,
        global_batch_size=count,
        seed=3,
        process_index=index,
        process_count=count,
    )
    shares.append(set(np.concatenate([ids_of(b) for b in take(it, sizes[index])]).tolist()))
  assert sum(map(len, shares)) == 21 and set.union(*shares) == set(range(21))


def test_jft_split_rules(jft_glob):
  assert input_pipeline.num_examples(f"jft:{jft_glob}", "test") == N_JFT - 21
  no_split = jft_glob.replace("{split}", "train")
  with pytest.raises(ValueError, match="only serves split 'train'"):
    input_pipeline.num_examples(f"jft:{no_split}", "test")
  with pytest.raises(FileNotFoundError, match="no files match"):
    input_pipeline.num_examples(f"jft:{jft_glob}", "validation")


def test_image_folder_summary_is_logged_once_per_folder_and_split(tmp_path, caplog):
  """Each stage opens its data again (and a Python-API caller with INFO on sees every line): the
  folder's summary is said once per (folder, split) in a process, and again if the folder changed.
  """
  from PIL import Image  # pylint: disable=g-import-not-at-top

  for i in range(10):
    Image.fromarray(np.full((8, 8, 3), 20 * i, np.uint8)).save(tmp_path / f"p{i}.png")

  def splits_said():
    messages = (r.getMessage() for r in caplog.records)
    ours = (m for m in messages if m.startswith(f"image_folder {tmp_path}: ") and "; split " in m)
    return [m.split("; ")[-1] for m in ours]

  with caplog.at_level("INFO"):
    for _ in range(3):  # three stages
      assert input_pipeline.num_examples("image_folder", "all", str(tmp_path)) == 10
    n = input_pipeline.num_examples("image_folder", "train@0.5", str(tmp_path))
    input_pipeline.num_examples("image_folder", "all", str(tmp_path))
    assert splits_said() == ["split 'all': 10 images", f"split 'train@0.5': {n} images"]
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "p10.png")
    input_pipeline.num_examples("image_folder", "all", str(tmp_path))
    input_pipeline.num_examples("image_folder", "all", str(tmp_path))
  assert splits_said()[2:] == ["split 'all': 11 images"]
