"""Files on a local disk or behind a URL (gs://, ...), through one set of functions.

Local paths use os and the builtin `open`; anything with '://' goes through TensorFlow's file
layer (tf.io.gfile), which is imported on the first remote call only: TensorFlow costs seconds
and over a GB to import, and most runs never touch a remote path. Tests replace `tf_gfile` with a
fake to exercise the remote branch offline.
"""

from __future__ import annotations

import builtins
import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import IO, Any


def is_remote(path: str) -> bool:
  """Whether `path` is a URL (gs://, s3://, ram://, ...) rather than a local path."""
  return "://" in path


def tf_gfile() -> Any:
  """The `tf.io.gfile` module, imported now (callers with a deadline import it before it)."""
  import tensorflow as tf

  return tf.io.gfile


def open(path: str, mode: str = "r") -> IO[Any]:
  """A file object for `path`, local or remote; use it as a context manager."""
  if is_remote(path):
    return tf_gfile().GFile(path, mode)
  return builtins.open(path, mode)  # (closed by the caller)


def exists(path: str) -> bool:
  return tf_gfile().exists(path) if is_remote(path) else os.path.exists(path)


def isdir(path: str) -> bool:
  return tf_gfile().isdir(path) if is_remote(path) else os.path.isdir(path)


def makedirs(path: str) -> None:
  """Creates `path` and its parents; an existing directory is fine."""
  if is_remote(path):
    tf_gfile().makedirs(path)
  else:
    os.makedirs(path, exist_ok=True)


def listdir(path: str) -> list[str]:
  return list(tf_gfile().listdir(path)) if is_remote(path) else os.listdir(path)


def remove(path: str) -> None:
  if is_remote(path):
    tf_gfile().remove(path)
  else:
    os.remove(path)


def rename(src: str, dst: str) -> None:
  """Moves `src` over `dst`, replacing it (atomic on a local file system)."""
  if is_remote(src) or is_remote(dst):
    tf_gfile().rename(src, dst, overwrite=True)
  else:
    os.replace(src, dst)


def copy(src: str, dst: str) -> None:
  """Copies the file `src` to `dst`, replacing it; either side may be remote."""
  if is_remote(src) or is_remote(dst):
    tf_gfile().copy(src, dst, overwrite=True)
  else:
    shutil.copyfile(src, dst)


@contextlib.contextmanager
def atomic_open(path: str, mode: str = "w") -> Iterator[IO[Any]]:
  """A file object for writing whose contents replace `path` only when the block completes.

  The writes go to a temporary file beside `path`, renamed over it at the end, so that a reader
  never sees a half-written file and an error (or a kill) leaves the old file as it was; an error
  also removes the temporary file (a kill leaves it: `.<name>.<random>.tmp` locally,
  `<path>.tmp-<pid>` remotely). Local files are fsynced before the rename, so a crash of the
  machine cannot leave an empty file under the new name. The parent directory must exist.
  """
  if is_remote(path):
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
      with open(tmp, mode) as f:
        yield f
      rename(tmp, path)
    except BaseException:
      if exists(tmp):
        remove(tmp)
      raise
    return
  parent = os.path.dirname(os.path.abspath(path))
  fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
  try:
    with os.fdopen(fd, mode) as f:
      yield f
      f.flush()
      os.fsync(f.fileno())
    # mkstemp makes the file owner-only; the result is shared like any file the user writes.
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def write_text(path: str, text: str) -> None:
  """Writes `text` to `path` atomically (`atomic_open`): a reader sees the old text or the new."""
  with atomic_open(path, "w") as f:
    f.write(text)


def read_text(path: str) -> str | None:
  """The contents of `path`, or None when it does not exist."""
  if not exists(path):
    return None
  with open(path) as f:
    return f.read()


# ------------------------------------------------------------------------ each file read once

# The files read inside the innermost `read_once` block: real path -> bytes.
_READ_ONCE: list[dict[str, bytes]] = []


@contextlib.contextmanager
def read_once() -> Iterator[dict[str, bytes]]:
  """Within the block, every file read through `read_bytes` is opened once: its bytes are kept
  (in the dict yielded, by real path; a remote path as given) and served again to later reads,
  so that what a checkpoint's readers parse and what its digest hashes are the same bytes."""
  files: dict[str, bytes] = {}
  _READ_ONCE.append(files)
  try:
    yield files
  finally:
    _READ_ONCE.pop()


def reading_once() -> bool:
  """Whether a `read_once` block is open."""
  return bool(_READ_ONCE)


def read_bytes(path: str, fetch: Any = None) -> bytes:
  """The bytes of `path` (`fetch()` reads them, when given: e.g. a remote read with a deadline);
  inside `read_once`, the file is opened the first time only."""
  key = path if is_remote(path) else os.path.realpath(path)
  if _READ_ONCE and key in _READ_ONCE[-1]:
    return _READ_ONCE[-1][key]
  if fetch is not None:
    data = fetch()
  else:
    with open(path, "rb") as f:
      data = f.read()
  if _READ_ONCE:
    _READ_ONCE[-1][key] = data
  return data
