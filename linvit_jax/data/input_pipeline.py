"""Train and eval input pipelines (tf.data, big_vision-style) yielding per-process numpy batches.

  it = make_train_iterator(dataset="imagenet2012", split="train[:99%]", pp=PP_TRAIN,
                           global_batch_size=1024, seed=0, data_dir="gs://bucket/tfds",
                           start_step=resumed_step)
  batch = next(it)   # {"image": float32 [1024 // process_count, 224, 224, 3], "labels": ...}

  for batch in make_eval_iterator(dataset="imagenet2012", split="validation", pp=PP_EVAL,
                                  global_batch_size=1024):
    ...  # batch["_mask"]: bool [local batch], False on padding

  num_examples("fashion_mnist_local", "train") == 60000

Datasets
  * any TFDS name (optionally `name:version`, or a subsplit like "train[:99%]"), already prepared in
    `data_dir` (local or gs://; None = TFDS's default). Image features are read *encoded*: the pp
    string decodes them (`decode`, or `decode_jpeg_and_inception_crop` which decodes only the crop).
  * `fashion_mnist_local`: the embedded Fashion-MNIST (fashion_mnist.py), prepared on first use.
    pp example: 'decode(channels=1)|value_range(-1,1)|onehot(10, key="label", key_result="labels")|
    keep("image", "labels")'.
  * `jft:<glob>`: JFT-style TFRecords (jft.py) of {"image": JPEG bytes, "labels": id list};
    pp ends with e.g. 'multi_hot(18291)' for the sigmoid loss.
  * `image_folder` (the folder is `data_dir`) or `image_folder:<DIR>`: a local directory of image
    files (image_folder.py), read recursively in sorted path order, of {"image": encoded bytes,
    "label": int32, "file": relative path}. "label" only when every image is in a first-level
    sub-folder (the sorted sub-folder names are the classes). Splits: "all"; "train" / "holdout",
    a stable split by a hash of each path holding out 20%, or F with "train@F" / "holdout@F". So a
    separate eval folder is `eval_dataset="image_folder:<DIR>"` with split "all". Every file is
    checked once with PIL: unreadable ones are skipped and named in a warning; formats other than
    JPEG and PNG (TF's decode gets some of them wrong) are handed on as RGB PNG bytes.
    pp example: 'decode|resize(224)|value_range(-1,1)|onehot(C, key="label", key_result="labels")|
    keep("image", "labels")'.

Per process: each of `process_count` processes (default: jax's) reads its own
`tfds.even_splits(split, process_count)[process_index]` (for `jft:`, its share of the files, or of
the records when there are fewer files than processes; for `image_folder`, the split's files
process_index, process_index + process_count, ...) and yields local batches of
`global_batch_size // process_count` examples.

Train order. The stream is epoch after epoch of the process's share, drop-remainder batched across
epoch boundaries. Epoch e is read in an order that depends only on (seed, e): the share is cut into
up to 16 contiguous blocks read in a random order (like big_vision's file shuffling, and also for
one-file datasets; for `jft:` the files themselves; an `image_folder` share is permuted whole),
then a `shuffle_buffer` shuffle seeded by (seed, e). Random pp ops are stateless, seeded by (seed,
process, position of the example in the stream). So a seed fixes every batch, and `start_step=k`
starts at epoch (k * local_batch) // epoch_size, skipping only the raw (still encoded) records
before the offset inside that epoch: no image of a skipped step is decoded (but `image_folder`
files that need conversion are converted when read).
(`tf.random.set_seed` changes the shuffle order, as it does for any tf.data shuffle.)

Eval: one pass over the process's share in file order, padded with zero examples (`_mask` False) to
the same number of full batches on every process, so each example is seen exactly once overall.
The eval pp must give fixed-size tensors.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from linvit_jax.data import fashion_mnist
from linvit_jax.data import image_folder
from linvit_jax.data import jft
from linvit_jax.data.preprocess import RNG_KEY
from linvit_jax.data.preprocess import get_preprocess_fn

Example = dict[str, Any]

# A share is cut into at most this many blocks, none smaller than _MIN_BLOCK_EXAMPLES: enough to
# vary the order between epochs, few enough to keep the open readers (and their buffers) cheap.
_MAX_BLOCKS = 16
_MIN_BLOCK_EXAMPLES = 10_000
_BLOCK_CYCLE = 4  # Blocks read at once, alternating examples.
_FOREVER = 2**62
# Independent stateless streams derived from the user's seed.
_ORDER, _AUGMENT, _EVAL, _MIXUP = 0, 1, 2, 3


@dataclasses.dataclass(frozen=True)
class _Share:
  """One process's share of a split.

  read(key): the share's raw examples, one epoch; the order depends only on `key` (a stateless
  seed tensor), or is the fixed file order when `key` is None.
  """

  num_examples: int
  read: Callable[[tf.Tensor | None], tf.data.Dataset]


class _TfdsSource:
  """A split of a prepared TFDS dataset."""

  def __init__(self, name: str, split: str, data_dir: str | None):
    if name == fashion_mnist.NAME:
      self.builder = fashion_mnist.prepare(data_dir)
    else:
      self.builder = tfds.builder(name, data_dir=data_dir)
    self.name, self.split = name, split
    features = self.builder.info.features
    # Images stay encoded: decoding is the pp string's job (cheaper crops, skipped steps free).
    self.decoders = {
        k: tfds.decode.SkipDecoding()
        for k, f in features.items()
        if isinstance(f, tfds.features.Image)
    } or None

  def _read(self, split) -> tf.data.Dataset:
    try:
      return self.builder.as_dataset(
          split=split,
          shuffle_files=False,
          decoders=self.decoders,
          read_config=tfds.ReadConfig(try_autocache=False),
      )
    except AssertionError as err:  # TFDS's way of saying "not prepared".
      raise FileNotFoundError(
          f"TFDS dataset {self.name!r} is not prepared in {self.builder.data_dir}: prepare it "
          f"there first (ImageNet: see the README) or pass the right data_dir. ({err})"
      ) from None

  def _size(self, split) -> int:
    try:
      return self.builder.info.splits[split].num_examples
    except (KeyError, ValueError):  # No metadata (e.g. tfds.testing.mock_data): ask the reader.
      return _cardinality(self._read(split), f"{self.name} {split}")

  def sizes(self, count: int) -> list[int]:
    return [self._size(s) for s in tfds.even_splits(self.split, count)]

  def share(self, index: int, count: int, cache: bool = False) -> _Share:
    local = tfds.even_splits(self.split, count)[index]
    n = self._size(local)
    num_blocks = max(1, min(_MAX_BLOCKS, n // _MIN_BLOCK_EXAMPLES))
    block_splits = tfds.even_splits(local, num_blocks) if num_blocks > 1 else [local]
    blocks = [self._read(s) for s in block_splits]
    sizes = [_cardinality(b, f"{self.name} {s}") for b, s in zip(blocks, block_splits)]
    if cache:
      blocks = [b.cache() for b in blocks]  # In memory, filled during the first epoch.

    def read(key: tf.Tensor | None) -> tf.data.Dataset:
      if key is None or len(blocks) == 1:
        return blocks[0] if len(blocks) == 1 else _concatenate(blocks)
      perm = tf.random.experimental.stateless_shuffle(tf.range(len(blocks), dtype=tf.int64), key)
      block_sizes = tf.constant(sizes, tf.int64)
      # Which block each next example comes from: blocks in `perm` order, _BLOCK_CYCLE at a time.
      choice = tf.data.Dataset.from_tensor_slices(perm).interleave(
          lambda b: tf.data.Dataset.from_tensors(b).repeat(block_sizes[b]),
          cycle_length=_BLOCK_CYCLE,
          block_length=1,
      )
      return tf.data.Dataset.choose_from_datasets(blocks, choice)

    return _Share(sum(sizes), read)


class _JftSource:
  """JFT-style TFRecords `jft:<glob>` (see jft.py)."""

  def __init__(self, pattern: str, split: str):
    self.files = jft.list_files(pattern, split)
    self.counts = jft.count_examples(self.files)

  def _assignment(self, index: int, count: int) -> tuple[list[int], bool]:
    """File indices read by process `index`, and whether records (not files) are dealt out."""
    if len(self.files) >= count:
      return list(range(index, len(self.files), count)), False
    return list(range(len(self.files))), True  # Fewer files than processes.

  def sizes(self, count: int) -> list[int]:
    total = sum(self.counts)
    if len(self.files) < count:
      return [len(range(i, total, count)) for i in range(count)]
    return [sum(self.counts[f] for f in self._assignment(i, count)[0]) for i in range(count)]

  def share(self, index: int, count: int, cache: bool = False) -> _Share:
    file_ids, by_record = self._assignment(index, count)
    names = tf.constant([self.files[i] for i in file_ids])
    cycle = min(16, len(file_ids))

    def records(key: tf.Tensor | None) -> tf.data.Dataset:
      # The file order (not the file assignment) changes with the epoch, same on every process,
      # so dealing out records below still splits each epoch disjointly.
      files = (
          names
          if key is None
          else tf.gather(
              names, tf.random.experimental.stateless_shuffle(tf.range(len(file_ids)), key)
          )
      )
      ds = tf.data.Dataset.from_tensor_slices(files).interleave(
          tf.data.TFRecordDataset,
          cycle_length=cycle,
          block_length=1,
          num_parallel_calls=cycle,
          deterministic=True,
      )
      return ds.shard(count, index) if by_record else ds

    cached = records(None).cache() if cache else None

    def read(key: tf.Tensor | None) -> tf.data.Dataset:
      ds = cached if cached is not None else records(key)  # A cache has one (file) order.
      return ds.map(jft.parse_example, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)

    return _Share(self.sizes(count)[index], read)


# (root, describe(), split, size) of each image-folder summary this process has logged.
_FOLDER_SUMMARIES_LOGGED: set[tuple[str, str, str, int]] = set()


class _ImageFolderSource:
  """A split of a folder of images (see image_folder.py); process i reads files i, i + n, ..."""

  def __init__(self, dataset: str, split: str, data_dir: str | None):
    folder = dataset[len(image_folder.NAME) + 1 :] or data_dir
    if not folder:
      raise ValueError(
          f"dataset {dataset!r} needs the folder: data_dir=DIR, or "
          f"dataset='{image_folder.NAME}:DIR'"
      )
    self.index = image_folder.scan(folder)
    self.positions = image_folder.split_positions(self.index, split)
    summary = (self.index.root, self.index.describe(), split, len(self.positions))
    if summary not in _FOLDER_SUMMARIES_LOGGED:
      # Every stage (and every Python-API call) opens its data again; the summary is worth one
      # line per folder and split in a process, and again only when the folder changed.
      _FOLDER_SUMMARIES_LOGGED.add(summary)
      logging.info("image_folder %s: %s; split %r: %d images", *summary)

  def sizes(self, count: int) -> list[int]:
    return [len(range(i, len(self.positions), count)) for i in range(count)]

  def share(self, index: int, count: int, cache: bool = False) -> _Share:
    positions = self.positions[index::count]
    cached = image_folder.read_examples(self.index, positions, None).cache() if cache else None

    def read(key: tf.Tensor | None) -> tf.data.Dataset:
      if cached is not None:
        return cached  # A cache has one (file) order; the shuffle buffer still mixes it.
      return image_folder.read_examples(self.index, positions, key)

    return _Share(len(positions), read)


def _source(dataset: str, split: str, data_dir: str | None):
  if dataset.startswith("jft:"):
    return _JftSource(dataset[len("jft:") :], split)
  if dataset == image_folder.NAME or dataset.startswith(image_folder.NAME + ":"):
    return _ImageFolderSource(dataset, split, data_dir)
  return _TfdsSource(dataset, split, data_dir)


def _cardinality(ds: tf.data.Dataset, what: str) -> int:
  n = int(ds.cardinality())
  if n < 0:
    raise ValueError(f"{what}: the reader does not know its number of examples")
  return n


def _concatenate(datasets: list[tf.data.Dataset]) -> tf.data.Dataset:
  out = datasets[0]
  for ds in datasets[1:]:
    out = out.concatenate(ds)
  return out


def _processes(process_index: int | None, process_count: int | None) -> tuple[int, int]:
  index = jax.process_index() if process_index is None else process_index
  count = jax.process_count() if process_count is None else process_count
  if not 0 <= index < count:
    raise ValueError(f"process_index must be in [0, {count}), got {index}")
  return index, count


def _local_batch(global_batch_size: int, count: int) -> int:
  if global_batch_size <= 0 or global_batch_size % count:
    raise ValueError(
        f"global_batch_size={global_batch_size} must be a positive multiple of the "
        f"process count {count}"
    )
  return global_batch_size // count


def _key(seed: int, stream: int) -> tf.Tensor:
  return tf.constant([seed, stream], tf.int64)


def _fold(key: tf.Tensor, data: tf.Tensor) -> tf.Tensor:
  return tf.cast(tf.random.experimental.stateless_fold_in(key, data), tf.int64)


def _preprocess(pp: str, index: int, count: int, key: tf.Tensor) -> Callable:
  """pp over (stream position, example), with a per-example stateless `_rng`."""
  preprocess = get_preprocess_fn(pp)

  def fn(position: tf.Tensor, example: Example) -> Example:
    rng = _fold(key, position * count + index)  # Distinct per process and position.
    out = preprocess({**example, RNG_KEY: rng})
    out.pop(RNG_KEY, None)
    return out

  return fn


def _options(ds: tf.data.Dataset) -> tf.data.Dataset:
  options = tf.data.Options()
  options.deterministic = True
  # Keeps tf.data from adding prefetch buffers everywhere (RAM) ; we prefetch the batches.
  options.experimental_optimization.inject_prefetch = False
  return ds.with_options(options)


def make_train_iterator(
    *,
    dataset: str,
    split: str,
    pp: str,
    global_batch_size: int,
    seed: int,
    data_dir: str | None = None,
    shuffle_buffer: int = 10_000,
    start_step: int = 0,
    cache: bool = False,
    process_index: int | None = None,
    process_count: int | None = None,
    compose: float = 0.0,
    mixup: float = 0.0,
) -> Iterator[dict[str, np.ndarray]]:
  """Infinite iterator of this process's training batches, fixed by `seed`.

  Yields dicts of numpy arrays with `global_batch_size // process_count` examples; with
  `start_step=k` the first batch is the one an iterator from step 0 would yield k-th. `cache`
  keeps the share's raw (encoded) examples in memory after the first epoch. `compose`: that
  fraction of each batch's images become 2×2 mosaics of four of its images (`compose_2x2`;
  deterministic, so resuming still yields the same batches). `mixup` p > 0: every image of each
  batch is blended with the batch's previous one (`mix_with_previous`), each with its own weight
  λ ~ Beta(p, p) drawn from `seed` and the batch's step, so resuming yields the same blends.
  """
  _check_stream_args(compose, mixup, start_step, shuffle_buffer)
  index, count = _processes(process_index, process_count)
  local_batch = _local_batch(global_batch_size, count)
  if mixup and local_batch < 2:
    raise ValueError(f"mixup blends images within a batch: {local_batch} image per process")
  share = _source(dataset, split, data_dir).share(index, count, cache=cache)
  if share.num_examples == 0:
    raise ValueError(f"{dataset} {split!r}: process {index} of {count} has no examples")
  first_epoch, offset = divmod(start_step * local_batch, share.num_examples)
  ds = _shuffled_epochs(share, _key(seed, _ORDER), first_epoch, shuffle_buffer)
  ds = ds.skip(offset)  # Raw records only: nothing decoded for the skipped steps.
  ds = ds.map(
      _preprocess(pp, index, count, _key(seed, _AUGMENT)),
      num_parallel_calls=tf.data.AUTOTUNE,
      deterministic=True,
  )
  ds = ds.batch(local_batch, drop_remainder=True)
  n_composed = int(round(compose * local_batch))
  if n_composed:
    ds = ds.map(lambda b: {**b, "image": compose_2x2(b["image"], n_composed)})
  if mixup:
    ds = _mixed_up(ds, seed, index, local_batch, mixup, start_step)
  ds = ds.prefetch(2)
  return _options(ds).as_numpy_iterator()


def _check_stream_args(compose: float, mixup: float, start_step: int, shuffle_buffer: int) -> None:
  if not 0.0 <= compose <= 1.0:
    raise ValueError(f"data.compose is a fraction of each batch in [0, 1], got {compose}")
  if not (math.isfinite(mixup) and mixup >= 0):
    raise ValueError(f"mixup is a Beta concentration (0: off), must be finite >= 0, got {mixup}")
  if start_step < 0 or shuffle_buffer < 0:
    raise ValueError(
        f"start_step and shuffle_buffer must be >= 0, got {start_step}, {shuffle_buffer}"
    )


def _shuffled_epochs(
    share: _Share, order_key: tf.Tensor, first_epoch: int, shuffle_buffer: int
) -> tf.data.Dataset:
  """(stream position, raw example) from epoch `first_epoch` on, forever: epoch e reads the share
  in the order fold_in(order_key, e) gives, shuffled within `shuffle_buffer`."""
  n = share.num_examples

  def epoch(e: tf.Tensor) -> tf.data.Dataset:
    key = _fold(order_key, e)
    ds = share.read(key)
    if shuffle_buffer > 1:
      shuffle_seed = tf.random.stateless_uniform([], _fold(key, -1), 0, 2**31 - 1, tf.int64)
      ds = ds.shuffle(shuffle_buffer, seed=shuffle_seed, reshuffle_each_iteration=False)
    return tf.data.Dataset.zip((tf.data.Dataset.range(e * n, (e + 1) * n), ds))

  return tf.data.Dataset.range(first_epoch, _FOREVER).flat_map(epoch)


def _mixed_up(
    ds: tf.data.Dataset, seed: int, index: int, local_batch: int, mixup: float, start_step: int
) -> tf.data.Dataset:
  """Every batch's images blended with the batch's previous one (`mix_with_previous`), weights
  drawn from `seed`, this process and the batch's step (so resuming yields the same blends)."""
  mixup_key = _fold(_key(seed, _MIXUP), tf.constant(index, tf.int64))  # processes differ

  def mix(step: tf.Tensor, batch: Example) -> Example:
    weights = beta_weights(_fold(mixup_key, step), local_batch, mixup)
    return {**batch, "image": mix_with_previous(batch["image"], weights)}

  steps = tf.data.Dataset.range(start_step, _FOREVER)
  return tf.data.Dataset.zip((steps, ds)).map(mix)


def compose_2x2(images: tf.Tensor, n: int) -> tf.Tensor:
  """The first n images of a batch [B,H,W,C] replaced by mosaics: image i's quadrants are images
  i, i+1, i+2, i+3 (mod B), each area-resized to its quadrant; the rest unchanged."""
  h, w = images.shape[1], images.shape[2]
  h0, w0 = h // 2, w // 2
  rolled = [tf.roll(images, -s, axis=0)[:n] for s in range(4)]

  def fit(x, hh, ww):
    return tf.cast(tf.image.resize(x, (hh, ww), method="area"), images.dtype)

  top = tf.concat([fit(rolled[0], h0, w0), fit(rolled[1], h0, w - w0)], axis=2)
  bottom = tf.concat([fit(rolled[2], h - h0, w0), fit(rolled[3], h - h0, w - w0)], axis=2)
  return tf.concat([tf.concat([top, bottom], axis=1), images[n:]], axis=0)


def beta_weights(key: tf.Tensor, n: int, concentration: float) -> tf.Tensor:
  """n stateless draws of λ ~ Beta(c, c), as G1 / (G1 + G2) with G ~ Gamma(c)."""
  gammas = tf.random.stateless_gamma([2, n], key, alpha=concentration)
  return gammas[0] / tf.maximum(gammas[0] + gammas[1], 1e-30)


def mix_with_previous(images: tf.Tensor, weights: tf.Tensor) -> tf.Tensor:
  """Image i becomes (1 − λ_i)·image i + λ_i·image i − 1 (mod B): mixup without labels, for
  function matching (the teacher and the student see the same blend; big_vision's distillation
  configs blend pairs with a Beta(1, 1) weight)."""
  lam = tf.reshape(tf.cast(weights, tf.float32), [-1] + [1] * (len(images.shape) - 1))
  x = tf.cast(images, tf.float32)
  mixed = (1 - lam) * x + lam * tf.roll(x, 1, axis=0)
  if images.dtype.is_integer:  # a pp without value_range: a convex blend stays in range
    return tf.cast(tf.round(mixed), images.dtype)
  return tf.cast(mixed, images.dtype)


def make_eval_iterator(
    *,
    dataset: str,
    split: str,
    pp: str,
    global_batch_size: int,
    data_dir: str | None = None,
    process_index: int | None = None,
    process_count: int | None = None,
) -> Iterator[dict[str, np.ndarray]]:
  """One pass over this process's share, as full local batches with a boolean `_mask`.

  Every process yields the same number of batches; across processes every example of the split
  appears exactly once with `_mask` True; padding examples are zeros with `_mask` False.
  """
  index, count = _processes(process_index, process_count)
  local_batch = _local_batch(global_batch_size, count)
  source = _source(dataset, split, data_dir)
  num_batches = math.ceil(max(source.sizes(count)) / local_batch)
  share = source.share(index, count)
  preprocess = _preprocess(pp, index, count, _key(0, _EVAL))

  def with_mask(position: tf.Tensor, example: Example) -> Example:
    return {**preprocess(position, example), "_mask": tf.constant(True)}

  ds = tf.data.Dataset.zip((tf.data.Dataset.range(_FOREVER), share.read(None)))
  ds = ds.map(with_mask, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  ds = ds.concatenate(_padding(ds, share.num_examples, pp))
  ds = ds.batch(local_batch, drop_remainder=True).take(num_batches).prefetch(2)
  return _options(ds).as_numpy_iterator()


def _padding(ds: tf.data.Dataset, num_real: int, pp: str) -> tf.data.Dataset:
  """Endless zero examples with `_mask` False, shaped like the real ones."""
  spec = ds.element_spec
  if all(s.shape.is_fully_defined() for s in spec.values()):
    zeros = {k: tf.zeros(s.shape, s.dtype) for k, s in spec.items()}
    return tf.data.Dataset.from_tensors({**zeros, "_mask": tf.constant(False)}).repeat()
  # Shapes only known at run time (e.g. decoded images with no resize): copy the first example's.
  if num_real == 0:
    raise ValueError(
        f"this process has no eval examples and pp {pp!r} gives run-time shapes "
        f"({ {k: tuple(s.shape) for k, s in spec.items()} }), so the padding batches "
        "cannot be shaped: resize/crop to a fixed size in the eval pp"
    )
  zeros = ds.take(1).map(
      lambda ex: {**tf.nest.map_structure(tf.zeros_like, ex), "_mask": tf.constant(False)}
  )
  return zeros.cache().repeat()


def num_examples(dataset: str, split: str, data_dir: str | None = None) -> int:
  """Number of examples in a split (all processes together)."""
  return sum(_source(dataset, split, data_dir).sizes(1))
