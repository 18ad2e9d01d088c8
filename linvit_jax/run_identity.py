"""What made a workdir's run, by content, and one run per workdir.

A finished or interrupted workdir is only ever resumed by the run that made it. config.json says
which config (preflight.check_same_run compares it); this module adds what a config only names:

* the **teacher** (and an exported student that `student.init` continues): a sha256 of the
  bytes the run loads (models/checkpoint_record.py: every file its loader reads, by relative path),
  taken from the one read of the checkpoint when the run starts;
* the **photos** of every image folder the run trains or is measured on (the files
  image_folder.walk lists): a manifest digest of the relative names, sizes and contents (a folder above `CONTENT_LIMIT_BYTES` in all: names, sizes
  and modification times, so that a large folder is not read twice).

They are written to `identity.json` beside config.json when the run's inputs have loaded. A rerun
whose identity differs is refused with one line naming what differs, before anything in the
workdir is written: a teacher reached by another path with the same bytes, or photos copied to
another machine, are the same run.

`locked(workdir)` holds an advisory lock (flock) on `<workdir>/.lock` for the whole run: a second
run on a busy workdir is refused within seconds, naming the other process; the kernel releases the
lock when the process dies, so a kill -9 leaves no stale lock. It also removes the temporary files
a killed atomic write left (`gfile.atomic_open`'s `.<name>.<random>.tmp`), which only the lock
holder may do.

preflight and run call it; it reads image folders as data/image_folder lists them, and knows no
model and no config schema beyond the field names it reads.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import logging
import os
import re
import socket
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from linvit_jax.data import image_folder
from linvit_jax.data import sources
from linvit_jax.runtime import gfile
from linvit_jax.runtime.errors import ConfigError
from linvit_jax.runtime.errors import shorten

IDENTITY_FILE = "identity.json"
LOCK_FILE = ".lock"
# A photo folder up to this size is digested by content; a larger one by names, sizes and
# modification times (hashing ImageNet at every start would cost minutes).
CONTENT_LIMIT_BYTES = 2 << 30
_CHUNK = 1 << 22
# gfile.atomic_open's temporary files: `.<name>.<8 random chars>.tmp`.
_STALE_TMP = re.compile(r"^\..+\.[A-Za-z0-9_]{8}\.tmp$")


# ------------------------------------------------------------------------------------ digests


def _hash_file(path: str, digest: Any) -> int:
  size = 0
  with open(path, "rb") as f:
    while chunk := f.read(_CHUNK):
      digest.update(chunk)
      size += len(chunk)
  return size


def photo_manifest(folder: str) -> dict[str, Any]:
  """{"sha256", "photos", "bytes", "by"} of an image folder's files (what image_folder reads:
  non-hidden files with an image extension, recursively): their relative names and sizes, and
  their contents ("by": "content") or, above CONTENT_LIMIT_BYTES, their modification times."""
  names = [n for n in image_folder.walk(folder) if os.path.isfile(os.path.join(folder, n))]
  paths = [os.path.join(folder, *n.split("/")) for n in names]
  stats = [os.stat(p) for p in paths]
  total = sum(s.st_size for s in stats)
  by = "content" if total <= CONTENT_LIMIT_BYTES else "mtime"
  digest = hashlib.sha256()
  for name, path, st in zip(names, paths, stats):
    digest.update(f"{name}\0{st.st_size}\0".encode())
    if by == "content":
      _hash_file(path, digest)
    else:
      digest.update(str(st.st_mtime_ns).encode())
  return {"sha256": digest.hexdigest(), "photos": len(names), "bytes": total, "by": by}


# ----------------------------------------------------------------------- a run's identity


def image_folders(config: Any) -> dict[str, str]:
  """{role: local folder} of the image folders a config reads: "train", "eval" (when another
  folder), "knn" (an image_folder k-NN set). Remote folders and other datasets are left out (the
  config names them)."""
  data = config.data
  out: dict[str, str] = {}

  def local(folder: str | None) -> str | None:
    return folder if folder and not gfile.is_remote(folder) and os.path.isdir(folder) else None

  train = local(sources.image_folder_of(data.dataset, data.data_dir))
  if train:
    out["train"] = train
  evaluated = local(sources.image_folder_of(data.eval_dataset or data.dataset, data.data_dir))
  if evaluated and (not train or os.path.realpath(evaluated) != os.path.realpath(train)):
    out["eval"] = evaluated
  knn = config.eval.knn
  knn_folder = local(sources.image_folder_of(knn.dataset or "", knn.data_dir or ""))
  if knn_folder:
    out["knn"] = knn_folder
  return out


def of_run(config: Any, records: Mapping[str, Any]) -> dict[str, Any]:
  """The identity of a run: the digest of the teacher and of an exported student, from the
  records the run loads (role -> checkpoint_record.CheckpointRecord or None), and each image
  folder's manifest."""
  identity: dict[str, Any] = {}
  for role, init in (("teacher", config.teacher.init), ("student", config.student.init)):
    if init:
      identity[role] = {"path": init, **records[role].digest}
  photos = {
      role: {"folder": os.path.abspath(f), **photo_manifest(f)}
      for role, f in image_folders(config).items()
  }
  if photos:
    identity["photos"] = photos
  return identity


def differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
  """What differs between two identities, one phrase each ([] when they are the same run)."""
  out = []
  for role in ("teacher", "student"):
    a, b = old.get(role), new.get(role)
    if (a or None) == (b or None):
      continue
    if not a or not b:
      out.append(
          f"{role}.init: {'none' if not a else shorten(a['path'])} there, "
          f"{'none' if not b else shorten(b['path'])} now"
      )
    elif a["sha256"] != b["sha256"]:
      same = " (the same path: the file changed)" if a["path"] == b["path"] else ""
      out.append(
          f"{role} checkpoint: sha256 {a['sha256'][:12]} ({shorten(a['path'])}) there, "
          f"{b['sha256'][:12]} ({shorten(b['path'])}) now{same}"
      )
  old_photos, new_photos = old.get("photos") or {}, new.get("photos") or {}
  for role in sorted(set(old_photos) | set(new_photos)):
    a, b = old_photos.get(role), new_photos.get(role)
    if a and b and a["sha256"] == b["sha256"]:
      continue
    if not a or not b:
      out.append(
          f"{role} photos: {'none' if not a else shorten(a['folder'])} there, "
          f"{'none' if not b else shorten(b['folder'])} now"
      )
      continue
    what = "another folder" if a["folder"] != b["folder"] else "the same folder, changed"
    out.append(
        f"{role} photos: {what} ({a['photos']} photos, {a['bytes']} bytes there; "
        f"{b['photos']}, {b['bytes']} now)"
    )
  return out


def read(workdir: str) -> dict[str, Any] | None:
  """The identity recorded in workdir, or None (none recorded, or unreadable)."""
  try:
    text = gfile.read_text(os.path.join(workdir, IDENTITY_FILE))
    value = json.loads(text) if text else None
  except (OSError, ValueError):
    return None
  return value if isinstance(value, dict) else None


def check(workdir: str, identity: Mapping[str, Any]) -> None:
  """Refuses (ConfigError, one line) a rerun whose identity differs from the one recorded."""
  old = read(workdir)
  if old is None:
    return
  diffs = differences(old, identity)
  if diffs:
    more = f" (+{len(diffs) - 2} more)" if len(diffs) > 2 else ""
    raise ConfigError(
        f"workdir {shorten(workdir)!s} holds a run made from other inputs: {'; '.join(diffs[:2])}"
        f"{more}. Nothing in it was changed: pass a new --workdir, or delete that one to start "
        "over."
    )


def write(workdir: str, identity: Mapping[str, Any]) -> None:
  """Records identity in workdir (atomically)."""
  gfile.write_text(os.path.join(workdir, IDENTITY_FILE), json.dumps(identity, indent=1) + "\n")


# ------------------------------------------------------------------ where a workdir may be


def _inside(child: str, parent: str) -> bool:
  child, parent = os.path.realpath(child), os.path.realpath(parent)
  return child == parent or child.startswith(parent.rstrip(os.sep) + os.sep)


def check_workdir_place(
    workdir: str, folders: Mapping[str, str], inits: Mapping[str, str] | None = None
) -> None:
  """A workdir inside a photo folder (its plots would be read as photos by the next run) or a
  photo folder inside the workdir is refused; so is a workdir inside a model folder it reads
  (`inits`: role -> checkpoint path; a run writes config.json and README.md, a Hugging Face
  folder's own names) or the folder of a checkpoint file."""
  if gfile.is_remote(workdir):
    return
  for role, init in (inits or {}).items():
    if not init or gfile.is_remote(init) or not os.path.exists(init):
      continue
    if os.path.isdir(init) and _inside(workdir, init):
      raise ConfigError(
          f"--workdir {workdir!r} is inside the {role} checkpoint folder {init!r}: the run's "
          "config.json and README.md would overwrite the checkpoint's own; pass a --workdir "
          "outside it"
      )
    if os.path.isfile(init) and os.path.realpath(workdir) == os.path.dirname(
        os.path.realpath(init)
    ):
      raise ConfigError(
          f"--workdir {workdir!r} is the folder of the {role} checkpoint {init!r}: the run "
          "writes student files and config.json beside it; pass a --workdir of its own"
      )
  for role, folder in folders.items():
    if _inside(workdir, folder):
      raise ConfigError(
          f"--workdir {workdir!r} is inside the {role} photo folder {folder!r}: the run's plots "
          "would become photos of the next run; pass a --workdir outside it"
      )
    if _inside(folder, workdir):
      raise ConfigError(
          f"the {role} photo folder {folder!r} is inside --workdir {workdir!r}: pass a --workdir "
          "that does not hold the photos"
      )


# ------------------------------------------------------------------------------- the lock


def _holder(path: str) -> str:
  try:
    with open(path) as f:
      text = " ".join(f.read().split())
  except OSError:
    text = ""
  return text or "another process"


@contextlib.contextmanager
def locked(workdir: str, check: Callable[[], None] | None = None) -> Iterator[None]:
  """Holds `<workdir>/.lock` (flock, exclusive) for the block; a busy workdir is a ConfigError
  naming the process that holds it. Creates the workdir. `check()` runs once the lock is held and
  before anything is written (its refusal leaves the workdir as it was, the lock file included);
  then the lock file names this process and stale temporaries are removed. A remote workdir is
  not locked (gs:// has no advisory locks): one run at a time is then the user's to keep."""
  if gfile.is_remote(workdir):
    if check is not None:
      check()
    yield
    return
  import fcntl  # noqa: PLC0415 - POSIX only

  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, LOCK_FILE)
  fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError:
    os.close(fd)
    raise ConfigError(
        f"workdir {workdir!r} is in use by another run ({_holder(path)}); wait for it to end, "
        "or pass another --workdir"
    ) from None
  try:
    if check is not None:
      check()
    started = datetime.datetime.now().isoformat(timespec="seconds")
    os.ftruncate(fd, 0)
    os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}, started {started}\n".encode())
    remove_stale_temporaries(workdir)
    yield
  finally:
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


def remove_stale_temporaries(folder: str) -> list[str]:
  """Removes what killed atomic writes left in folder (not below it: orbax cleans its own); the
  caller holds the workdir's lock, so no live write owns them. Returns the names removed."""
  removed = []
  for name in sorted(os.listdir(folder)):
    path = os.path.join(folder, name)
    if _STALE_TMP.match(name) and os.path.isfile(path):
      os.remove(path)
      removed.append(name)
  if removed:
    logging.info("removed %d file(s) an interrupted write left: %s", len(removed), removed)
  return removed
