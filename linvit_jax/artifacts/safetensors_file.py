"""student.safetensors: an export's params under '/'-joined names, with its student_config.json
in the file's metadata, written and read through the safetensors package's numpy API (no torch).

Two shims, each for one gap of that API: the writer takes the file's bytes from
`safetensors.numpy.save` and writes them itself (atomically, and to gs:// as well), and a remote
file is parsed from its bytes with the bfloat16 tensors viewed here (numpy has no bfloat16).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np
import safetensors
from safetensors import numpy as st_numpy

from linvit_jax.models import foreign_files
from linvit_jax.runtime import gfile

METADATA_KEY = "student_config"


def write(path: str, flat: Mapping[str, Any], student_config: Mapping[str, Any]) -> None:
  """Writes `flat` ('/'-joined name -> array; bfloat16 included) and the student's config.

  `safetensors.numpy.save` makes the bytes (the same as its `save_file` would write); they go
  through `gfile.atomic_open`, since `save_file` writes in place and to a local path only, where
  an export writes each file beside itself and renames it over the old one (a killed run leaves
  no half-written student.safetensors) and may write to gs://."""
  arrays = {name: np.ascontiguousarray(np.asarray(a)) for name, a in flat.items()}
  data = st_numpy.save(arrays, metadata={METADATA_KEY: json.dumps(student_config)})
  with gfile.atomic_open(path, "wb") as f:
    f.write(data)


def read(path: str) -> dict[str, np.ndarray]:
  """Every tensor of a .safetensors file ('/'-joined name -> numpy array, bfloat16 included).

  A local file through `safetensors.safe_open` (memory-mapped, each tensor read once into its own
  array; its BF16 tensors come back as ml_dtypes.bfloat16, the numpy dtype ml_dtypes registers on
  import). safe_open reads local paths only: a remote file is read whole through gfile and parsed
  by `safetensors.deserialize`."""
  if gfile.is_remote(path):
    return from_bytes(gfile.read_bytes(path))
  with safetensors.safe_open(path, framework="numpy") as f:
    return {name: f.get_tensor(name) for name in f.keys()}


def from_bytes(data: bytes) -> dict[str, np.ndarray]:
  """The tensors of a .safetensors file's bytes (`read` of a remote file)."""
  return foreign_files.tensors_of_bytes(data)
