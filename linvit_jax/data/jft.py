"""JFT-style data: TFRecords of (JPEG bytes, list of label ids), for multi-label sigmoid training.

Record format (tf.train.Example):  `image/encoded` bytes (JPEG),  `image/labels` int64 list.
Parsed examples are `{"image": <encoded bytes>, "labels": int64 [n]}`; `n` varies (may be 0).
The input pipeline names such data `jft:<glob>`, e.g. `jft:/data/jft/{split}-*.tfrecord`; a
`{split}` in the glob is replaced by the split name (without it, only split "train" is served).

  write_tfrecords(prefix, examples, num_shards=1) -> list[str]   (tests and small demos)
  parse_example(serialized) -> {"image", "labels"}
  count_examples(files) -> list[int]   (from `num_examples.json` beside the files when present)
  multi_hot(depth, key="labels", key_result=None, on=1.0, off=0.0)   pp op: ids -> [depth] float32

Counting a JFT-scale corpus means reading all of it, so the writer records the counts in
`num_examples.json` (file basename -> count) in each directory, and the reader trusts that file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence

import tensorflow as tf

from linvit_jax.data.ops_general import _check_depth
from linvit_jax.data.ops_general import multi_hot_vector
from linvit_jax.data.registry import Features
from linvit_jax.data.registry import Op
from linvit_jax.data.registry import register

COUNTS_FILE = "num_examples.json"

_FEATURES = {
    "image/encoded": tf.io.FixedLenFeature([], tf.string),
    "image/labels": tf.io.VarLenFeature(tf.int64),
}


def parse_example(serialized: tf.Tensor) -> dict[str, tf.Tensor]:
  """One serialized tf.train.Example -> {"image": bytes, "labels": int64 [n]}."""
  ex = tf.io.parse_single_example(serialized, _FEATURES)
  return {"image": ex["image/encoded"], "labels": tf.sparse.to_dense(ex["image/labels"])}


def _example(image: bytes, labels: Sequence[int]) -> bytes:
  feature = {
      "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image])),
      "image/labels": tf.train.Feature(int64_list=tf.train.Int64List(value=list(labels))),
  }
  return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def write_tfrecords(
    prefix: str, examples: Iterable[tuple[bytes, Sequence[int]]], num_shards: int = 1
) -> list[str]:
  """Writes (jpeg_bytes, label_ids) pairs round-robin into `{prefix}-0000i-of-0000n.tfrecord`.

  Also merges the per-file counts into `num_examples.json` beside them. Returns the file paths.
  """
  paths = [f"{prefix}-{i:05d}-of-{num_shards:05d}.tfrecord" for i in range(num_shards)]
  tf.io.gfile.makedirs(os.path.dirname(prefix) or ".")
  counts = [0] * num_shards
  writers = [tf.io.TFRecordWriter(p) for p in paths]
  try:
    for i, (image, labels) in enumerate(examples):
      writers[i % num_shards].write(_example(image, labels))
      counts[i % num_shards] += 1
  finally:
    for w in writers:
      w.close()
  counts_path = os.path.join(os.path.dirname(paths[0]), COUNTS_FILE)
  known = _read_counts(counts_path)
  known.update({os.path.basename(p): c for p, c in zip(paths, counts)})
  with tf.io.gfile.GFile(counts_path, "w") as f:
    json.dump(known, f, indent=1, sort_keys=True)
  return paths


def _read_counts(path: str) -> dict[str, int]:
  if not tf.io.gfile.exists(path):
    return {}
  with tf.io.gfile.GFile(path) as f:
    return {str(k): int(v) for k, v in json.load(f).items()}


def count_examples(files: Sequence[str]) -> list[int]:
  """Records per file: from `num_examples.json` where listed, else by reading the file."""
  known: dict[str, int] = {}
  for d in sorted({os.path.dirname(f) for f in files}):
    known.update(
        {os.path.join(d, k): v for k, v in _read_counts(os.path.join(d, COUNTS_FILE)).items()}
    )
  unknown = [f for f in files if f not in known]
  if unknown:
    # Only the record framing is read (no parsing); files in parallel.
    counted = tf.data.Dataset.from_tensor_slices(unknown).map(
        lambda f: tf.data.TFRecordDataset(f).reduce(tf.constant(0, tf.int64), lambda n, _: n + 1),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )
    known.update(zip(unknown, (int(n) for n in counted.as_numpy_iterator())))
  return [known[f] for f in files]


def list_files(pattern: str, split: str) -> list[str]:
  """The sorted files of `split` for a `jft:` glob; an empty match is an error."""
  if "{split}" in pattern:
    pattern = pattern.replace("{split}", split)
  elif split != "train":
    raise ValueError(
        f"jft:{pattern} has no {{split}} placeholder, so it only serves split "
        f"'train'; got split {split!r}"
    )
  files = sorted(tf.io.gfile.glob(pattern))
  if not files:
    raise FileNotFoundError(f"jft:{pattern}: no files match")
  return files


@register("multi_hot")
def get_multi_hot(
    depth: int,
    key: str = "labels",
    key_result: str | None = None,
    on: float = 1.0,
    off: float = 0.0,
) -> Op:
  """Label id list -> multi-hot [depth] float32, the target of the sigmoid loss."""
  _check_depth(depth)

  def multi_hot(data: Features) -> Features:
    if key not in data:
      raise KeyError(f"no key {key!r} in the example (keys: {', '.join(sorted(data))})")
    if data[key].shape.rank != 1:
      raise ValueError(f"expects a list of label ids under {key!r}, got shape {data[key].shape}")
    return {**data, key_result or key: multi_hot_vector(data[key], depth, on, off)}

  return multi_hot
