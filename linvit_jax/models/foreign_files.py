"""The PyTorch ecosystem's files, read without torch: .safetensors (through the `safetensors`
package), a Hugging Face / timm folder's weights (one file or shards), its JSON files, and the
pickle files that are refused (they can run code).

Every file is read through `runtime/gfile` or `safe_open` as `read_safetensors` explains, so that
inside `gfile.read_once` (models/checkpoint_record.py) each file is opened once and the bytes
parsed are the bytes its digest hashes.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
import safetensors

from linvit_jax.models.checkpoints import CheckpointError
from linvit_jax.runtime import gfile

PICKLE_SUFFIXES = (".pth", ".pt", ".bin", ".ckpt", ".pkl")

# Every safetensors dtype code numpy can hold, by its header code: the package's
# `safetensors.numpy.load` (bytes) has no BF16 in its table (numpy has no bfloat16), so arrays
# parsed from bytes are viewed through this one, bfloat16 as ml_dtypes'. artifacts/ reads an
# exported student's bytes through it too.
SAFETENSORS_DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "BF16": ml_dtypes.bfloat16,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U64": np.uint64,
    "U32": np.uint32,
    "U16": np.uint16,
    "U8": np.uint8,
    "BOOL": np.bool_,
}
# The ones a ViT checkpoint is read in. Other codes (F8_*, U16, ...) are refused by name, on both
# paths below, rather than half-supported.
_DTYPES = {
    k: SAFETENSORS_DTYPES[k]
    for k in ("F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "BOOL")
}


def read_safetensors(path: str) -> dict[str, np.ndarray]:
  """All tensors of one .safetensors file, in name order, as numpy arrays of their own (not
  views of the file; bfloat16 as ml_dtypes.bfloat16). The `safetensors` package parses the file
  and checks its header, offsets and coverage.

  Two ways in, the same arrays bit for bit:
  - inside `gfile.read_once` (a checkpoint record, whose digest hashes the bytes read), or for a
    remote path: the file is read once, whole, through gfile, and those bytes are parsed
    (`safetensors.deserialize`). Neither lazy nor mapped: the record keeps the bytes for its
    digest anyway, and each tensor is copied out of them once. `safe_open` there would open the
    file a second time by its path, and what it parsed could differ from what was hashed (a file
    replaced in between) — hence the bytes;
  - otherwise (import_weights, tools): `safe_open` memory-maps the file and copies each tensor out
    of the mapping, so the process never holds the whole file besides the arrays.
  """
  try:
    if gfile.reading_once() or gfile.is_remote(path):
      return tensors_of_bytes(gfile.read_bytes(path), lambda c, n: _dtype(c, n, path))
    return _tensors_of_file(path)
  except OSError as e:
    raise CheckpointError(f"checkpoint '{path}': cannot read it ({e.strerror or e})") from e
  except safetensors.SafetensorError as e:
    raise CheckpointError(f"checkpoint '{path}': not a readable .safetensors file ({e})") from e


def _dtype(code: str, name: str, path: str) -> Any:
  if code not in _DTYPES:
    raise CheckpointError(
        f"checkpoint '{path}': tensor {name!r} has dtype {code!r}, not one of {sorted(_DTYPES)}"
    )
  return _DTYPES[code]


def tensors_of_bytes(
    raw: bytes, dtype_of: Callable[[str, str], Any] = lambda code, name: SAFETENSORS_DTYPES[code]
) -> dict[str, np.ndarray]:
  """The tensors of a .safetensors file's bytes, in name order, each viewed as
  `dtype_of(code, name)` (numpy's dtype for the header's code; bfloat16 as ml_dtypes')."""
  out = {}
  # In no fixed order (a hash map's); each tensor's data a bytearray of its own.
  for name, info in sorted(safetensors.deserialize(raw), key=lambda item: item[0]):
    out[name] = np.frombuffer(info["data"], dtype_of(info["dtype"], name)).reshape(info["shape"])
  return out


def _tensors_of_file(path: str) -> dict[str, np.ndarray]:
  with safetensors.safe_open(path, framework="numpy") as f:
    names = f.keys()  # in name order, as the bytes path gives them
    for name in names:  # every dtype checked before any tensor is copied
      _dtype(f.get_slice(name).get_dtype(), name, path)
    return {name: f.get_tensor(name) for name in names}


def read_folder_tensors(folder: str) -> tuple[dict[str, np.ndarray], str]:
  """The weights of a Hugging Face / timm folder (model.safetensors or its sharded index), and
  the file named in messages."""
  index = os.path.join(folder, "model.safetensors.index.json")
  single = os.path.join(folder, "model.safetensors")
  if os.path.exists(single):
    return read_safetensors(single), single
  if os.path.exists(index):
    shards = sorted(set(json.loads(gfile.read_bytes(index))["weight_map"].values()))
    tensors = {}
    for shard in shards:
      tensors.update(read_safetensors(os.path.join(folder, shard)))
    return tensors, index
  pickles = [n for n in sorted(os.listdir(folder)) if n.endswith(PICKLE_SUFFIXES)]
  if pickles:
    raise_pickle_error(os.path.join(folder, pickles[0]))
  raise CheckpointError(
      f"checkpoint '{folder}': a folder without model.safetensors (or its sharded index); "
      f"it holds: {', '.join(sorted(os.listdir(folder))[:8]) or 'nothing'}"
  )


def read_json(path: str) -> dict[str, Any] | None:
  """A config JSON of a model folder, None when there is none."""
  if not os.path.exists(path):
    return None
  try:
    return json.loads(gfile.read_bytes(path))
  except ValueError as e:
    raise CheckpointError(f"'{path}': not valid JSON ({e})") from e


def is_torch_zip(path: str) -> bool:
  """torch.save's zip format (an .npz reader would see a zip too and fail obscurely)."""
  if not os.path.isfile(path):
    return False
  import zipfile

  # Inside gfile.read_once the bytes are kept: the npz reader that follows opens nothing again.
  source = io.BytesIO(gfile.read_bytes(path)) if gfile.reading_once() else path
  try:
    with zipfile.ZipFile(source) as z:
      return any(n.endswith("data.pkl") for n in z.namelist()[:8])
  except (zipfile.BadZipFile, OSError):
    return False


def raise_pickle_error(path: str) -> None:
  """A PyTorch pickle is refused, with the one line that turns it into safetensors."""
  raise CheckpointError(
      f"checkpoint '{path}': a PyTorch pickle file, which is not read here (it can run code); "
      'turn it into safetensors first, e.g. `python -c "import torch, safetensors.torch as st; '
      f"st.save_file(torch.load('{os.path.basename(path)}', map_location='cpu'), "
      "'model.safetensors')\"` (a state dict), or `model.save_pretrained(dir)` for Hugging Face"
  )
