"""Features that every run computes the same way, kept on disk by what they depend on.

The k-NN check runs the teacher over ~1,500 fixed images in every run (on 2 CPU cores a
ViT-S/14 forward runs ~6 images/s: about four minutes), although the same teacher on the same
images gives the same features each time. This cache keeps them, keyed by content, never by a
path or a name alone:

* the teacher's params: sha256 of every leaf's name, dtype, shape and bytes, in sorted-name
  order, so a big_vision npz, a Hugging Face folder and an exported student holding the same
  numbers share an entry, and one changed number misses;
* the model's config (GELU form, epsilon, pooling, ...), the backend and the jax version (a float
  op may round differently elsewhere);
* what was read and how: dataset, split, count, pp string, image size, and the sha256 of the
  very batches the model saw (pixels, labels, masks). A folder whose photos changed, a new pp op
  or another TFDS version miss instead of returning stale features;
* `FORMAT_VERSION`, bumped when an entry's meaning changes.

Entries are .npz files under $LINVIT_CACHE_DIR (default ~/.cache/linvit_jax/features; "" or
"off" turns the cache off), written atomically. A cache is an optimisation, never a reason to
fail: an unreadable entry is computed again and rewritten, and a failed write is a warning.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import jax
import numpy as np

from linvit_jax.runtime import gfile
from linvit_jax.runtime import tree

# Bump when what an entry holds, or what its key covers, changes: older entries then miss.
FORMAT_VERSION = 1
ENV_VAR = "LINVIT_CACHE_DIR"
_OFF = ("", "0", "off", "none", "false", "no")
_PARTS = "__key_parts__"  # the key's parts, stored beside the arrays and checked on read


def default_dir() -> str:
  return os.path.join(os.path.expanduser("~"), ".cache", "linvit_jax", "features")


def cache_dir() -> str | None:
  """$LINVIT_CACHE_DIR, default_dir() when it is unset, None when it turns the cache off."""
  value = os.environ.get(ENV_VAR)
  if value is None:
    return default_dir()
  return None if value.strip().lower() in _OFF else value


def _update_with_array(h: Any, name: str, value: Any) -> None:
  array = np.ascontiguousarray(np.asarray(value))
  # name, dtype and shape first: equal bytes under another shape or dtype are another array.
  h.update(f"{name}|{array.dtype.str}|{array.shape}|".encode())
  if array.dtype.hasobject:  # (bytes of an object array are pointers: hash the values)
    h.update(repr(array.tolist()).encode())
  else:  # a uint8 view, not tobytes(): no copy, ~3x faster (~1 GB/s here)
    h.update(array.reshape(-1).view(np.uint8))


def params_digest(params: Mapping[str, Any]) -> str | None:
  """sha256 of a nested dict of arrays (names, dtypes, shapes, bytes, in sorted-name order); None
  when a leaf is not on this host in full (a multi-host sharded array), which no cache can key."""
  h = hashlib.sha256()
  for name, leaf in tree.flatten(params).items():
    if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
      return None
    # One leaf on the host at a time: the digest never holds a second copy of the whole model.
    _update_with_array(h, name, jax.device_get(leaf))
  return h.hexdigest()


class BatchDigest:
  """An iterable of batches (dicts of arrays) passed through unchanged, hashing them on the way:
  sha256 over every batch's keys, dtypes, shapes and bytes, in order. Read `hexdigest()` once
  the batches have been consumed."""

  def __init__(self, batches: Iterable[Mapping[str, Any]]):
    self._batches = batches
    self._hash = hashlib.sha256()
    self.num_batches = 0

  def __iter__(self) -> Iterator[Mapping[str, Any]]:
    for batch in self._batches:
      for key in sorted(batch):
        _update_with_array(self._hash, f"{self.num_batches}/{key}", batch[key])
      self.num_batches += 1
      yield batch

  def hexdigest(self) -> str:
    return self._hash.hexdigest()


def _parts_text(parts: Mapping[str, Any]) -> str:
  return json.dumps({"format": FORMAT_VERSION, **parts}, sort_keys=True, default=str)


def key_of(parts: Mapping[str, Any]) -> str:
  """The entry's name: sha256 of the parts (JSON, sorted keys) and FORMAT_VERSION."""
  return hashlib.sha256(_parts_text(parts).encode()).hexdigest()


class FeatureCache:
  """Arrays on disk under `directory`, one .npz per key (`key_of(parts)`)."""

  def __init__(self, directory: str):
    self.directory = directory

  @classmethod
  def from_env(cls) -> FeatureCache | None:
    """The cache at cache_dir(), or None when $LINVIT_CACHE_DIR turns it off."""
    directory = cache_dir()
    return cls(directory) if directory else None

  def path(self, parts: Mapping[str, Any]) -> str:
    return os.path.join(self.directory, f"{key_of(parts)}.npz")

  def get(self, parts: Mapping[str, Any]) -> dict[str, np.ndarray] | None:
    """The arrays stored under `parts`, or None (absent, unreadable, or another key's entry)."""
    path = self.path(parts)
    try:
      if not gfile.exists(path):
        return None
      with gfile.open(path, "rb") as f, np.load(f, allow_pickle=False) as data:
        arrays = {k: np.asarray(data[k]) for k in data.files}
    except Exception as e:  # a torn or foreign file: compute again (and `put` rewrites it)
      logging.warning("feature cache: %s is unreadable (%s: %s); computing again", path,
                      type(e).__name__, e)  # fmt: skip
      return None
    stored = arrays.pop(_PARTS, None)
    if stored is None or str(stored) != _parts_text(parts):
      logging.warning("feature cache: %s holds another key's entry; computing again", path)
      return None
    return arrays

  def put(self, parts: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> bool:
    """Stores `arrays` under `parts` atomically; False (and a warning) when it could not."""
    path = self.path(parts)
    try:
      gfile.makedirs(self.directory)
      with gfile.atomic_open(path, "wb") as f:
        np.savez(f, **{_PARTS: np.asarray(_parts_text(parts))}, **arrays)
    except Exception as e:  # a read-only or full disk must not fail the run that computed them
      logging.warning("feature cache: could not write %s (%s: %s)", path, type(e).__name__, e)
      return False
    return True
