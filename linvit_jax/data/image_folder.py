"""A directory of image files as a dataset: scan, validation, held-out split, tf.data reading.

  index = scan("/data/photos")                    # FolderIndex; every file checked once (PIL)
  index.files, index.labels, index.class_names, index.skipped, index.converted, index.small
  positions = split_positions(index, "holdout@0.3")   # indices into index.files, sorted
  positions = split_positions(index, "test@0.3")      # half of that holdout (val: the other)
  ds = read_examples(index, positions, key)       # {"image": bytes, "label": int32, "file": str}

The input pipeline serves a folder as dataset `image_folder` (the folder is `data_dir`) or
`image_folder:<DIR>` (the folder in the name, so an eval folder can differ from the train one).

Files. Every file under DIR, recursively (symlinks followed, names starting with "." ignored), whose
extension is .jpg/.jpeg/.png or .bmp/.gif/.webp/.tif/.tiff, in any case; ordered by relative path
with "/" separators. Local paths only (PIL opens the files).

Labels (torchvision's ImageFolder convention). If every image lies under a first-level sub-folder,
the sorted names of those sub-folders are the classes 0..C-1 and each example has an int32 "label"
(deeper folders belong to their first-level one). If any image lies directly in DIR, the folder is
unlabelled and the examples have no "label" at all. The classes come from the files' names, before
validation, so a class whose files are all unreadable keeps the ids of the others stable. A
separate eval folder must have the same class sub-folders as the train one.

Splits. "all" (every file), "train" and "holdout": a file is held out when
int(sha1(relative path).hexdigest()[:8], 16) / 2**32 < F, with F = 0.2, or F from "train@F" /
"holdout@F" (0 < F < 1; "holdout@1", "val@1" and "test@1" hold out every file, for a folder
that only validates and tests). The rule looks at one path only, so adding or removing other files never
moves a file between train and holdout. Tiny folders: when the rule holds out no file, the one with
the smallest hash is held out; when it holds out every file (and there are >= 2), the one with the
largest hash goes to train.

"val" and "test" ("val@F", "test@F") are the two halves of "holdout@F": a held-out file is in val
when int(sha1("val/test:" + relative path).hexdigest()[:8], 16) / 2**32 < 0.5, else in test (a
second hash, independent of the first, so the halves do not depend on F either: raising F only
adds files to each). val is where a run makes its choices (hybrid layers, curves, calibration);
test is reported and never chosen on. Tiny holdouts: when the rule puts every held-out file in
test, the one with the smallest second hash goes to val; when it puts them all in val (and there
are >= 2), the one with the largest goes to test. A single held-out file is val's, and test is
empty (`split_positions(..., "test")` raises; `split_files` returns the empty list).

Validation. scan() opens and decodes every file with PIL (JPEGs at 1/8 scale via `draft`, cheap),
in a thread pool. A file that fails (corrupt, truncated, not an image) is skipped: counted, and
named in a logging.warning (the first 20, then a count). Files smaller than `min_size` on their
shorter side are only counted ("small"): the pp resizes them. Scans are memoized per folder while
no file is added, removed or modified (and log only the first time), so building the train and
eval iterators again is cheap.

Conversion. What tf.io.decode_image(channels=3) (the pp's `decode`) decodes like PIL, checked on
TF 2.21 against PIL 13 with one file per case:
  read as is: JPEG (gray, RGB, CMYK), PNG of every mode (1/8-bit gray, gray+alpha, RGB, RGBA,
    palette with or without transparency, 16-bit gray/RGB/RGBA, which TF scales by >> 8);
  converted: every other format. TF reads a BMP palette's indices as gray levels and fails on
    1-bit BMP, fails on WebP with alpha (when asked for 3 channels) and on TIFF (unknown format).
    GIF and RGB WebP/BMP decode right, but are converted too: one rule per format.
A converted file is read with PIL in the pipeline and handed on as 8-bit RGB PNG bytes: alpha is
dropped (colours kept, not composited onto a background: what TF does for RGBA PNG), 16-bit values
are scaled by >> 8 (not clipped), palettes / CMYK / others go through PIL's convert("RGB"), and
animations give their first frame. EXIF orientation is ignored, by both paths. The conversion
happens when the file is read, so also for the files a skip-ahead (`start_step`) passes over;
files read as they are are not decoded before the pp.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import io
import logging
import os
import re

import numpy as np
import tensorflow as tf
from PIL import Image

NAME = "image_folder"
NATIVE_EXTENSIONS = (".jpg", ".jpeg", ".png")
CONVERTED_EXTENSIONS = (".bmp", ".gif", ".webp", ".tif", ".tiff")
EXTENSIONS = NATIVE_EXTENSIONS + CONVERTED_EXTENSIONS
DEFAULT_HOLDOUT_FRACTION = 0.2
DEFAULT_MIN_SIZE = 224  # The usual ViT input side: smaller images get upsampled.
SPLITS = ("all", "train", "holdout", "val", "test")

_MAX_NAMED = 20  # Files named in one log line; the rest are counted.
_JPEG_FORMATS = ("JPEG", "MPO")  # MPO: camera JPEGs with extra frames; TF reads the first.
_NATIVE_JPEG_MODES = ("L", "RGB", "CMYK")
_SIXTEEN_BIT_MODES = ("I;16", "I;16B", "I;16L", "I;16N", "I")
_SPLIT_RE = re.compile(rf"({'|'.join(SPLITS)})(?:@(.+))?")


@dataclasses.dataclass(frozen=True)
class FolderIndex:
  """The readable images of a folder, in order, with what the loader needs to know about them.

  files: relative paths ("/"-separated), sorted. labels: int class ids aligned with `files`, or
  None for an unlabelled folder. needs_conversion: per file, whether the loader converts it with
  PIL (see the module docstring). skipped: (relative path, reason) of the files that failed.
  small: how many readable files are smaller than the scan's `min_size`.
  """

  root: str
  files: tuple[str, ...]
  labels: tuple[int, ...] | None
  class_names: tuple[str, ...]
  needs_conversion: tuple[bool, ...]
  skipped: tuple[tuple[str, str], ...]
  small: int

  @property
  def converted(self) -> int:
    return sum(self.needs_conversion)

  def path(self, i: int) -> str:
    return os.path.join(self.root, *self.files[i].split("/"))

  def describe(self) -> str:
    """One line: files, classes, skipped / converted / small counts."""
    classes = f"{len(self.class_names)} classes" if self.labels is not None else "unlabelled"
    return (
        f"{len(self.files)} images ({classes}), {len(self.skipped)} skipped, "
        f"{self.converted} converted, {self.small} small"
    )


def _needs_conversion(fmt: str | None, mode: str) -> bool:
  if fmt == "PNG":
    return False
  if fmt in _JPEG_FORMATS:
    return mode not in _NATIVE_JPEG_MODES
  return True


def _to_rgb(img: Image.Image) -> Image.Image:
  """8-bit RGB: alpha dropped, 16-bit scaled by >> 8 (PIL's convert would clip it)."""
  if img.mode in _SIXTEEN_BIT_MODES:
    values = np.clip(np.asarray(img).astype(np.int64), 0, 65535) >> 8
    return Image.fromarray(values.astype(np.uint8), "L").convert("RGB")
  return img.convert("RGB")


def _inspect(path: str) -> tuple[int, int, bool]:
  """(width, height, needs conversion) of a file PIL decodes; raises when it does not."""
  with Image.open(path) as img:
    width, height = img.size
    convert = _needs_conversion(img.format, img.mode)
    if img.format in _JPEG_FORMATS:
      # Decoding at 1/8 scale still reads all the entropy-coded data, so truncation shows.
      img.draft("RGB", (max(64, width // 8), max(64, height // 8)))
    if convert:
      _to_rgb(img)  # The loader will have to: check that the conversion works too.
    else:
      img.load()
  return width, height, convert


def _try_inspect(path: str) -> tuple[int, int, bool] | str:
  try:
    return _inspect(path)
  except Exception as err:  # # Any failure means "unreadable".
    return f"{type(err).__name__}: {err}"


def converted_png(path: str) -> bytes:
  """The file as 8-bit RGB PNG bytes (what the loader yields for files that need conversion)."""
  try:
    with Image.open(path) as img:
      out = io.BytesIO()
      _to_rgb(img).save(out, "PNG", compress_level=1)  # Decoded right after: compress little.
      return out.getvalue()
  except Exception as err:
    # Raised inside tf.data: say which file (it may have changed since the scan).
    raise ValueError(f"image_folder: cannot convert {path}: {type(err).__name__}: {err}") from err


def walk(root: str) -> list[str]:
  """Relative "/"-separated paths of the candidate image files under root, sorted."""
  found, seen = [], set()
  for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
    real = os.path.realpath(dirpath)
    if real in seen:  # A symlink loop, or a second link to a folder already read.
      dirnames[:] = []
      continue
    seen.add(real)
    dirnames[:] = [d for d in dirnames if not d.startswith(".")]
    rel_dir = os.path.relpath(dirpath, root)
    parts = [] if rel_dir == os.curdir else rel_dir.split(os.sep)
    for name in filenames:
      if not name.startswith(".") and os.path.splitext(name)[1].lower() in EXTENSIONS:
        found.append("/".join(parts + [name]))
  return sorted(found)


def _fingerprint(root: str, files: list[str]) -> str:
  digest = hashlib.sha1()
  for rel in files:
    try:
      st = os.stat(os.path.join(root, *rel.split("/")))
      stamp = f"{st.st_size}\0{st.st_mtime_ns}"
    except OSError:  # E.g. a dangling symlink: validation will skip it, with the reason.
      stamp = "-"
    digest.update(f"{rel}\0{stamp}\n".encode())
  return digest.hexdigest()


def _named(items: list[str]) -> str:
  more = len(items) - _MAX_NAMED
  return ", ".join(items[:_MAX_NAMED]) + (f" and {more} more" if more > 0 else "")


# (root, min_size) -> (fingerprint, index) of the last scan.
_SCANS: dict[tuple[str, int], tuple[str, FolderIndex]] = {}


def scan(
    data_dir: str, *, min_size: int = DEFAULT_MIN_SIZE, workers: int | None = None
) -> FolderIndex:
  """Lists, labels and validates the images of a folder (see the module docstring).

  Args:
    data_dir: the folder (local path).
    min_size: images whose shorter side is below this are counted as small (and logged).
    workers: threads decoding files in parallel; None = one per CPU (at most 32).

  Raises:
    FileNotFoundError: data_dir is not a directory.
    ValueError: no image files, or none of them readable.
  """
  if not os.path.isdir(data_dir):
    raise FileNotFoundError(f"image_folder: {data_dir!r} does not exist or is not a directory")
  root = os.path.abspath(data_dir)
  candidates = walk(root)
  if not candidates:
    raise ValueError(
        f"image_folder: no image files in {root} (looked recursively for "
        f"{', '.join(EXTENSIONS)}, any case; names starting with '.' are ignored)"
    )
  fingerprint = _fingerprint(root, candidates)
  memo = _SCANS.get((root, min_size))
  if memo is not None and memo[0] == fingerprint:
    return memo[1]

  tops = [rel.split("/")[0] if "/" in rel else None for rel in candidates]
  labelled = None not in tops
  class_names = tuple(sorted(set(tops))) if labelled else ()
  results = _inspect_all(root, candidates, workers)
  files, labels, convert, skipped, small = _sort_results(
      candidates, tops, results, class_names, min_size
  )
  _say_what_was_left(root, len(candidates), files, skipped, small, min_size, class_names)
  index = FolderIndex(
      root=root,
      files=tuple(files),
      labels=tuple(labels) if labelled else None,
      class_names=class_names,
      needs_conversion=tuple(convert),
      skipped=tuple(skipped),
      small=len(small),
  )
  _SCANS[(root, min_size)] = (fingerprint, index)
  return index


def _inspect_all(
    root: str, candidates: list[str], workers: int | None
) -> list[str | tuple[int, int, bool]]:
  """`_try_inspect` of each candidate, decoded by `workers` threads (None: one per CPU, <= 32)."""
  workers = workers or min(32, os.cpu_count() or 1)
  with concurrent.futures.ThreadPoolExecutor(workers) as pool:
    return list(pool.map(_try_inspect, [os.path.join(root, *rel.split("/")) for rel in candidates]))


def _sort_results(
    candidates: list[str],
    tops: list[str | None],
    results: list[str | tuple[int, int, bool]],
    class_names: tuple[str, ...],
    min_size: int,
) -> tuple[list[str], list[int], list[bool], list[tuple[str, str]], list[str]]:
  """(readable files, their labels (when `class_names`), whether each needs conversion, the
  skipped (file, reason) pairs, the small images described)."""
  class_ids = {name: i for i, name in enumerate(class_names)}
  files, labels, convert, skipped, small = [], [], [], [], []
  for rel, top, result in zip(candidates, tops, results):
    if isinstance(result, str):
      skipped.append((rel, result))
      continue
    width, height, needs = result
    files.append(rel)
    if class_names:
      labels.append(class_ids[top])
    convert.append(needs)
    if min(width, height) < min_size:
      small.append(f"{rel} ({width}x{height})")
  return files, labels, convert, skipped, small


def _say_what_was_left(
    root: str,
    num_candidates: int,
    files: list[str],
    skipped: list[tuple[str, str]],
    small: list[str],
    min_size: int,
    class_names: tuple[str, ...],
) -> None:
  """Logs the skipped files, the small images and the class folders left empty; no readable
  file at all is a ValueError naming why each was skipped."""
  if skipped:
    logging.warning(
        "image_folder %s: skipped %d unreadable file(s): %s",
        root,
        len(skipped),
        _named([f"{rel} ({reason})" for rel, reason in skipped]),
    )
  if not files:
    raise ValueError(
        f"image_folder: none of the {num_candidates} image files in {root} can be "
        f"read: {_named([f'{rel} ({reason})' for rel, reason in skipped])}"
    )
  if small:
    logging.info(
        "image_folder %s: %d image(s) smaller than %d px on the shorter side (the pp "
        "resizes them): %s",
        root,
        len(small),
        min_size,
        _named(small),
    )
  empty = sorted(set(class_names) - {f.split("/")[0] for f in files})
  if empty:
    logging.warning(
        "image_folder %s: no readable image in class folder(s) %s (their ids are kept)",
        root,
        ", ".join(empty),
    )


def parse_split(split: str) -> tuple[str, float]:
  """ "train@0.3" -> ("train", 0.3); "test" -> ("test", 0.2); "all" -> ("all", 0.2)."""
  match = _SPLIT_RE.fullmatch(split.strip())
  name, fraction = match.groups() if match else (None, None)
  usage = (
      f"image_folder: split must be 'all', 'train', 'holdout', 'val' or 'test', the last four "
      f"optionally with '@F' (F: the held-out fraction, 0 < F < 1; 1 for 'holdout', 'val' and "
      f"'test': every file), got {split!r}"
  )
  if name is None or (name == "all" and fraction is not None):
    raise ValueError(usage)
  try:
    value = DEFAULT_HOLDOUT_FRACTION if fraction is None else float(fraction)
  except ValueError:
    raise ValueError(usage) from None
  # F = 1 holds out every file: a separate folder to validate and test on ("val@1", "test@1").
  if not (0 < value < 1 or (value == 1 and name in ("holdout", "val", "test"))):  # nan too
    raise ValueError(usage)
  return name, value


def path_hash(rel: str) -> float:
  """The file's position in [0, 1) for the held-out rule."""
  return int(hashlib.sha1(rel.encode("utf-8")).hexdigest()[:8], 16) / 2**32


def holdout_mask(files: tuple[str, ...] | list[str], fraction: float) -> list[bool]:
  """Per file, whether it is held out (the rule and tiny-folder fallbacks of the docstring)."""
  hashes = [path_hash(rel) for rel in files]
  mask = [h < fraction for h in hashes]
  if files and not any(mask):
    mask[min(range(len(files)), key=lambda i: (hashes[i], files[i]))] = True
  elif len(files) >= 2 and all(mask) and fraction < 1:
    mask[max(range(len(files)), key=lambda i: (hashes[i], files[i]))] = False
  return mask


def val_hash(rel: str) -> float:
  """The held-out file's position in [0, 1) for the val / test rule (a second, salted hash)."""
  return path_hash("val/test:" + rel)


def val_mask(held_files: tuple[str, ...] | list[str]) -> list[bool]:
  """Per held-out file, whether it is in val (else test): the rule and tiny-holdout fallbacks of
  the module docstring."""
  hashes = [val_hash(rel) for rel in held_files]
  mask = [h < 0.5 for h in hashes]
  if held_files and not any(mask):
    mask[min(range(len(held_files)), key=lambda i: (hashes[i], held_files[i]))] = True
  elif len(held_files) >= 2 and all(mask):
    mask[max(range(len(held_files)), key=lambda i: (hashes[i], held_files[i]))] = False
  return mask


def split_files(files: tuple[str, ...] | list[str], split: str) -> list[int]:
  """Indices into `files` (relative paths) of a split, in order; may be empty."""
  name, fraction = parse_split(split)
  if name == "all":
    return list(range(len(files)))
  held = holdout_mask(files, fraction)
  if name in ("train", "holdout"):
    return [i for i, h in enumerate(held) if h == (name == "holdout")]
  held_positions = [i for i, h in enumerate(held) if h]
  in_val = val_mask([files[i] for i in held_positions])
  return [i for i, v in zip(held_positions, in_val) if v == (name == "val")]


def split_positions(index: FolderIndex, split: str) -> list[int]:
  """Indices into index.files of a split, in file order; an empty split is an error."""
  positions = split_files(index.files, split)
  if not positions:
    raise ValueError(
        f"image_folder {index.root}: split {split!r} is empty ({len(index.files)} "
        f"readable images); use split 'all', or add images"
    )
  return positions


def read_examples(
    index: FolderIndex, positions: list[int], key: tf.Tensor | None
) -> tf.data.Dataset:
  """The examples at `positions`, in that order (key None) or shuffled statelessly by `key`.

  Examples: {"image": encoded bytes, "label": int32 (labelled folders only), "file": relative
  path}. The bytes are the file's own, or PNG bytes of its RGB conversion.
  """
  paths = tf.constant([index.path(i) for i in positions], tf.string)
  files = tf.constant([index.files[i] for i in positions], tf.string)
  needs = [index.needs_conversion[i] for i in positions]
  convert = tf.constant(needs, tf.bool)
  labels = (
      tf.constant([index.labels[i] for i in positions], tf.int32)
      if index.labels is not None
      else None
  )
  any_conversion = any(needs)

  def png(path: tf.Tensor) -> bytes:
    return converted_png(path.numpy().decode("utf-8"))

  def load(i: tf.Tensor) -> dict[str, tf.Tensor]:
    path = paths[i]
    if any_conversion:  # Keeps Python (py_function) out of the graph when it is not needed.
      image = tf.cond(
          convert[i], lambda: tf.py_function(png, [path], tf.string), lambda: tf.io.read_file(path)
      )
      image.set_shape([])
    else:
      image = tf.io.read_file(path)
    example = {"image": image, "file": files[i]}
    if labels is not None:
      example["label"] = labels[i]
    return example

  order = tf.range(len(positions), dtype=tf.int64)
  if key is not None:
    order = tf.random.experimental.stateless_shuffle(order, key)
  return tf.data.Dataset.from_tensor_slices(order).map(
      load, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
  )
