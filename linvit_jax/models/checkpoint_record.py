"""A checkpoint read once: its tree, what it declares, and the digest of the bytes read.

A run resolves its teacher (and an exported student it continues) into one `CheckpointRecord`
when it starts; the architecture, the input channels, the declared normalisation, the load and
the workdir's identity (run_identity) all take that record, so the file is opened once, and what
is loaded is what the digest describes. Every reader below (checkpoints.load_npz, foreign.read,
the sidecar JSON) reads through `gfile.read_bytes` inside one `gfile.read_once` block: each file
is opened once and its bytes hashed.

The functions of vit_checkpoint take a path or a record; a path is read into a record there.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Mapping
from typing import Any

from linvit_jax.models import foreign
from linvit_jax.models import hub
from linvit_jax.models.checkpoints import Params
from linvit_jax.models.checkpoints import load_npz
from linvit_jax.models.checkpoints import resolve_name
from linvit_jax.models.foreign_layout import Imported
from linvit_jax.runtime import gfile


@dataclasses.dataclass(frozen=True, eq=False)
class CheckpointRecord:
  """A checkpoint as read: `tree` (a big_vision .npz's params, before fix_old_checkpoints) or
  `imported` (a Hugging Face / timm source in big_vision's layout), the sidecar JSON beside an
  .npz, and `digest` {"sha256", "bytes", "files"} of every file read for it."""

  path: str
  tree: Params | None
  imported: Imported | None
  sidecar: Mapping[str, Any]
  digest: Mapping[str, Any]


def sidecar(path: str) -> dict[str, Any]:
  """The JSON beside an .npz (`x.npz` -> `x.json`) when it describes the model (written by
  import_weights, or by hand as in big_vision-layout conversions): {} otherwise."""
  if "://" in path or not path.endswith(".npz"):
    return {}
  side = foreign.sidecar_path(path)
  if not os.path.isfile(side):
    return {}
  try:
    info = json.loads(gfile.read_bytes(side))
  except ValueError:
    return {}
  return info if isinstance(info, dict) and isinstance(info.get("model_config"), dict) else {}


def _digest(path: str, files: Mapping[str, bytes]) -> dict[str, Any]:
  """sha256 over the files read, each named by its path relative to the checkpoint (a folder) or
  its folder (a file, itself and its sidecar named by their roles), in name order; a selector
  (`x.npz:img`) is part of it. The same bytes under another folder or name give the same
  digest."""
  target = resolve_name(hub.resolve(path) if hub.is_hub_name(path) else path)
  file, selector = target, ""
  if not os.path.exists(target) and ":" in target.rsplit("/", 1)[-1]:
    file, selector = target.rsplit(":", 1)
  folder = os.path.isdir(file)
  root = os.path.realpath(file if folder else os.path.dirname(file) or ".")
  # A checkpoint file is named by its role, not its name: the same bytes renamed are the same.
  roles = {} if folder else {os.path.realpath(file): "<checkpoint>"}
  if not folder and file.endswith(".npz"):
    roles[os.path.realpath(foreign.sidecar_path(file))] = "<sidecar>"

  def name(key: str) -> str:
    if gfile.is_remote(key):
      return "<checkpoint>" if key == file else key
    return roles.get(key) or os.path.relpath(key, root)

  named = sorted((name(key), data) for key, data in files.items())
  digest = hashlib.sha256(f"selector={selector}\n".encode())
  for rel, data in named:
    digest.update(f"\n{rel}\n{len(data)}\n".encode())
    digest.update(data)
  return {"sha256": digest.hexdigest(), "bytes": sum(len(d) for _, d in named), "files": len(named)}


def read(path: str) -> CheckpointRecord:
  """Reads a checkpoint once (any form vit_checkpoint takes: an .npz, a short name, gs://, a hub
  name, a Hugging Face / timm folder or .safetensors file); errors are the readers' own."""
  with gfile.read_once() as files:
    if foreign.is_foreign(path):
      tree, imported = None, foreign.read(path)
    else:
      tree, imported = load_npz(path), None
    side = sidecar(path)
  return CheckpointRecord(path, tree, imported, side, _digest(path, files))


def of(source: str | CheckpointRecord) -> CheckpointRecord:
  """`source` itself when it is a record, else the checkpoint at that path, read."""
  return source if isinstance(source, CheckpointRecord) else read(source)
