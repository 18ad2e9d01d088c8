"""The tiny Hugging Face and timm ViTs of tests/data/foreign (tools/make_import_fixtures.py) and the
ways tests damage a copy of one: a tensor dropped, a config field changed."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping

import numpy as np

FOREIGN = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "foreign"
)


def write_safetensors(path: str, tensors: Mapping[str, np.ndarray]) -> None:
  """`tensors` as float32 in a .safetensors file (the safetensors package's numpy API, no torch)."""
  from safetensors.numpy import save_file

  save_file({k: np.ascontiguousarray(a, np.float32) for k, a in tensors.items()}, path)


def copy_folder(tmp_path, family: str, drop=(), config_edit: Mapping | None = None) -> str:
  """A copy of the `family` folder under `tmp_path`, without the tensors named in `drop` and with
  `config_edit` merged into its config.json; returns its path."""
  from linvit_jax.models import foreign_files

  dst = tmp_path / family
  shutil.copytree(os.path.join(FOREIGN, family), dst)
  if drop:
    tensors = foreign_files.read_safetensors(str(dst / "model.safetensors"))
    write_safetensors(
        str(dst / "model.safetensors"), {k: v for k, v in tensors.items() if k not in drop}
    )
  if config_edit:
    with open(dst / "config.json") as f:
      cfg = json.load(f)
    cfg.update(config_edit)
    with open(dst / "config.json", "w") as f:
      json.dump(cfg, f)
  return str(dst)
