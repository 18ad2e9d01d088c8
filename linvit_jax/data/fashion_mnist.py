"""Fashion-MNIST from the Debian package `dataset-fashion-mnist`, as a local TFDS dataset.

The embedded default dataset: 60k train / 10k test real 28x28 grayscale images, 10 classes. It is a
TFDS dataset named `fashion_mnist_local` (features `image` uint8 28x28x1, PNG-encoded on disk like
any TFDS image, and `label` in 0..9; splits `train`, `test`), so it runs through the same input
pipeline and pp strings as ImageNet, e.g.
`decode(channels=1)|value_range(-1,1)|onehot(10, key="label", key_result="labels")|keep("image",
"labels")`.

`prepare(data_dir)` builds it from the IDX files in /usr/share/datasets/fashion-mnist (or
$LINVIT_FASHION_MNIST_DIR) into `data_dir` (default: TFDS's, ~/tensorflow_datasets) once, with no
network.
The input pipeline calls it on first use.
"""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import os
import struct
import zlib

import numpy as np
import tensorflow_datasets as tfds

NAME = "fashion_mnist_local"
DEFAULT_DIR = "/usr/share/datasets/fashion-mnist"
ENV_DIR = "LINVIT_FASHION_MNIST_DIR"
CLASS_NAMES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
_FILES = {  # split -> (images, labels)
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}


def source_dir() -> str:
  return os.environ.get(ENV_DIR) or DEFAULT_DIR


def _check_files(directory: str) -> None:
  missing = [
      f for pair in _FILES.values() for f in pair if not os.path.exists(os.path.join(directory, f))
  ]
  if missing:
    raise FileNotFoundError(
        f"Fashion-MNIST not found at {directory} (missing {', '.join(missing)}); install it with: "
        f"apt-get update && apt-get install -y dataset-fashion-mnist (or set ${ENV_DIR})"
    )


def unavailable(data_dir: str | None = None) -> str:
  """Why the dataset cannot be read here, with how to install it; "" when it can: its IDX files
  are present to prepare it from, or it is prepared in `data_dir` already."""
  try:
    _check_files(source_dir())
    return ""
  except FileNotFoundError as e:
    return "" if FashionMnistLocal(data_dir=data_dir).is_prepared() else str(e)


def read_idx(path: str) -> np.ndarray:
  """Reads a gzipped IDX file (big-endian header: magic, dims; then uint8 data)."""
  with gzip.open(path, "rb") as f:
    raw = f.read()
  magic = int.from_bytes(raw[:4], "big")
  if magic >> 8 != 0x08:  # 0x08: unsigned byte data; low byte: number of dims.
    raise ValueError(f"{path}: not an IDX uint8 file (magic {magic:#x})")
  ndim = magic & 0xFF
  shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
  data = np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim)
  if data.size != int(np.prod(shape)):
    raise ValueError(f"{path}: header says {shape}, found {data.size} bytes")
  return data.reshape(shape)


def encode_png_gray(image: np.ndarray) -> bytes:
  """A HxW uint8 array as a grayscale PNG.

  Written out here because preparing 70k images is otherwise dominated by encoding: TFDS's eager
  tf.io.encode_png costs ~1 ms an image here, PIL ~0.25 ms, this (fastest zlib level) ~0.05 ms.
  """
  h, w = image.shape

  def chunk(tag: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

  rows = np.concatenate([np.zeros((h, 1), np.uint8), image], axis=1)  # Filter byte 0 per row.
  header = struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0)  # 8-bit gray, no interlace.
  data = zlib.compress(rows.tobytes(), 1)  # Fastest level: a few % larger files.
  return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", data) + chunk(b"IEND", b"")


class FashionMnistLocal(tfds.core.GeneratorBasedBuilder):
  """Fashion-MNIST read from local IDX files (Debian `dataset-fashion-mnist`); no downloads."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "From the Debian package dataset-fashion-mnist."}

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(
        description="Fashion-MNIST (Zalando), from the Debian package dataset-fashion-mnist.",
        features=tfds.features.FeaturesDict(
            {
                "image": tfds.features.Image(shape=(28, 28, 1)),
                "label": tfds.features.ClassLabel(names=CLASS_NAMES),
            }
        ),
        supervised_keys=("image", "label"),
        homepage="https://github.com/zalandoresearch/fashion-mnist",
        # Keep the IDX order (example i is image i of the file): the input pipeline shuffles anyway,
        # and TFDS's shuffler would roughly double the preparation time.
        disable_shuffling=True,
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # Nothing to download.
    directory = source_dir()
    _check_files(directory)
    return {
        split: self._generate_examples(
            os.path.join(directory, images), os.path.join(directory, labels)
        )
        for split, (images, labels) in _FILES.items()
    }

  def _generate_examples(self, images_path: str, labels_path: str):
    images, labels = read_idx(images_path), read_idx(labels_path)
    if images.shape[1:] != (28, 28) or len(images) != len(labels):
      raise ValueError(
          f"{images_path}, {labels_path}: unexpected shapes {images.shape}, " f"{labels.shape}"
      )
    for i, (image, label) in enumerate(zip(images, labels)):
      # Encoded bytes are stored as they are; TFDS would encode with one eager TF op per image.
      yield i, {"image": encode_png_gray(image), "label": int(label)}


def prepare(data_dir: str | None = None) -> tfds.core.DatasetBuilder:
  """Returns the builder, preparing the dataset into `data_dir` first if needed (no network).

  Several processes may ask at once (test workers, the processes of a run): one prepares, the
  others wait on a lock and then find it prepared (TFDS's own rename would fail for them)."""
  builder = FashionMnistLocal(data_dir=data_dir)
  if builder.is_prepared():
    return builder
  with prepare_lock(os.path.dirname(os.path.dirname(builder.data_dir))):
    builder = FashionMnistLocal(data_dir=data_dir)  # another process may have prepared it
    if builder.is_prepared():
      return builder
    _check_files(source_dir())
    try:
      import importlib_resources  # noqa: F401
    except ImportError:
      raise ImportError(
          "preparing a TFDS dataset needs the package importlib_resources, which "
          "tensorflow-datasets 4.9.x forgets to require on Python >= 3.9 "
          "(tensorflow/datasets#11212): pip install importlib_resources"
      ) from None
    builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(
            compute_stats=tfds.download.ComputeStatsMode.SKIP, try_download_gcs=False
        )
    )
  return builder


@contextlib.contextmanager
def prepare_lock(directory: str):
  """An exclusive lock (flock on `directory`/.fashion_mnist_local.lock) while preparing; none
  for a remote directory (gs://...), where only one process should prepare."""
  if "://" in directory:
    yield
    return
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, f".{NAME}.lock"), "a") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(f, fcntl.LOCK_UN)


def write_folder(
    out_dir: str, split: str = "train", start: int = 58_000, count: int = 2_000
) -> int:
  """Writes images [start, start + count) of `split` as grayscale PNGs `fm_<index>.png` into
  `out_dir`, no labels: an image folder for convert_folder on the shipped Fashion-MNIST teacher.
  The default is the end of the train split, apart from the k-NN check's references (its first
  1,000) and its queries (the test split). Returns how many were written."""
  images_file, _ = _FILES[split]
  directory = source_dir()
  _check_files(directory)
  images = read_idx(os.path.join(directory, images_file))
  if not 0 <= start < start + count <= len(images):
    raise ValueError(
        f"images [{start}, {start + count}) are outside the {len(images)} of {split!r}"
    )
  os.makedirs(out_dir, exist_ok=True)
  for i in range(start, start + count):
    with open(os.path.join(out_dir, f"fm_{i}.png"), "wb") as f:
      f.write(encode_png_gray(images[i]))
  return count


def main(argv: list[str] | None = None) -> int:
  import argparse

  parser = argparse.ArgumentParser(
      description="Write Fashion-MNIST images as a folder of grayscale PNGs (no labels)."
  )
  parser.add_argument("out_dir")
  parser.add_argument("--split", default="train", choices=sorted(_FILES))
  parser.add_argument("--start", type=int, default=58_000)
  parser.add_argument("--count", type=int, default=2_000)
  args = parser.parse_args(argv)
  n = write_folder(args.out_dir, args.split, args.start, args.count)
  print(f"wrote {n} images to {args.out_dir}")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
