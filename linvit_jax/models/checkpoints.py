"""big_vision-compatible params checkpoints: read/write .npz (local or gs://), strict merge.

A big_vision params checkpoint is an uncompressed .npz whose keys are '/'-joined flax module
paths ("Transformer/encoderblock_0/MlpBlock_0/Dense_0/kernel"). Everything here works on plain
nested dicts of numpy arrays (no 'params' top key) and is pure: inputs are never mutated. Nothing
here knows a model: what makes a checkpoint fit the ViT (old layouts, scan <-> loop, posemb
resampling, `vit.load`) is in models/vit_checkpoint.py, which builds on this module.
"""

from __future__ import annotations

import io
import os
import re
import zipfile
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ml_dtypes
import numpy as np

from linvit_jax.runtime import gfile
from linvit_jax.runtime import tree as tree_lib
from linvit_jax.runtime.errors import UserError

Params = dict[str, Any]  # nested dict of arrays


class CheckpointError(UserError, ValueError):
  """A checkpoint that cannot be read or does not fit the model; the message says what and where.

  `problems` holds one line per problem when several were collected (merge_params).
  """

  def __init__(self, message: str, problems: Sequence[str] = ()):
    super().__init__(message)
    self.problems = list(problems)


# ------------------------------------------------------------------------------------------------
# Flat <-> nested.


def flatten(params: Mapping[str, Any]) -> dict[str, Any]:
  """Nested dict -> {'a/b/c': leaf}, names sorted (tree.flatten; errors are CheckpointErrors)."""
  return tree_lib.flatten(params, error=CheckpointError)


def unflatten(flat: Mapping[str, Any]) -> Params:
  """{'a/b/c': leaf} -> nested dict (tree.unflatten; errors are CheckpointErrors)."""
  return tree_lib.unflatten(flat, error=CheckpointError)


# ------------------------------------------------------------------------------------------------
# .npz reading and writing.

# big_vision's short checkpoint names, accepted wherever a checkpoint path is (teacher.init,
# `init=` of configs/convert_folder.py, vit.load, load_npz): `init=i1k-s16-300ep` works as in
# big_vision. Copied verbatim from big_vision/models/vit.py `VANITY_NAMES` (google-research/
# big_vision commit 0127fb6b, 2025-05-19); keep the two in sync. A ':img' suffix selects the
# image tower of a SigLIP two-tower checkpoint (see `_split_selector`).
SHORT_NAMES: dict[str, str] = {
    # Recommended models from https://arxiv.org/abs/2106.10270 (AugReg-era layout, fixed on load).
    "howto-i21k-Ti/16": "gs://vit_models/augreg/Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0.npz",
    "howto-i21k-S/32": "gs://vit_models/augreg/S_32-i21k-300ep-lr_0.001-aug_none-wd_0.1-do_0.0-sd_0.0.npz",
    "howto-i21k-S/16": "gs://vit_models/augreg/S_16-i21k-300ep-lr_0.001-aug_light1-wd_0.03-do_0.0-sd_0.0.npz",
    "howto-i21k-B/32": "gs://vit_models/augreg/B_32-i21k-300ep-lr_0.001-aug_light1-wd_0.1-do_0.0-sd_0.0.npz",
    "howto-i21k-B/16": "gs://vit_models/augreg/B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0.npz",
    "howto-i21k-B/8": "gs://vit_models/augreg/B_8-i21k-300ep-lr_0.001-aug_medium2-wd_0.1-do_0.0-sd_0.0.npz",
    "howto-i21k-L/16": "gs://vit_models/augreg/L_16-i21k-300ep-lr_0.001-aug_strong1-wd_0.1-do_0.0-sd_0.0.npz",
    # Better plain vit-s16 baselines from https://arxiv.org/abs/2205.01580
    "i1k-s16-90ep": "gs://big_vision/vit_s16_i1k_90ep.npz",
    "i1k-s16-150ep": "gs://big_vision/vit_s16_i1k_150ep.npz",
    "i1k-s16-300ep": "gs://big_vision/vit_s16_i1k_300ep.npz",
    # DeiT-3 checkpoints from https://github.com/facebookresearch/deit/blob/main/README_revenge.md
    # First layer converted to take inputs in [-1,1]
    "deit3_S_224_1k": "gs://big_vision/zoo/deit3/bv_deit_3_small_224_1k.npz",
    "deit3_S_224_21k": "gs://big_vision/zoo/deit3/bv_deit_3_small_224_21k.npz",
    "deit3_S_384_1k": "gs://big_vision/zoo/deit3/bv_deit_3_small_384_1k.npz",
    "deit3_S_384_21k": "gs://big_vision/zoo/deit3/bv_deit_3_small_384_21k.npz",
    "deit3_B_224_1k": "gs://big_vision/zoo/deit3/bv_deit_3_base_224_1k.npz",
    "deit3_B_224_21k": "gs://big_vision/zoo/deit3/bv_deit_3_base_224_21k.npz",
    "deit3_B_384_1k": "gs://big_vision/zoo/deit3/bv_deit_3_base_384_1k.npz",
    "deit3_B_384_21k": "gs://big_vision/zoo/deit3/bv_deit_3_base_384_21k.npz",
    "deit3_L_224_1k": "gs://big_vision/zoo/deit3/bv_deit_3_large_224_1k.npz",
    "deit3_L_224_21k": "gs://big_vision/zoo/deit3/bv_deit_3_large_224_21k.npz",
    "deit3_L_384_1k": "gs://big_vision/zoo/deit3/bv_deit_3_large_384_1k.npz",
    "deit3_L_384_21k": "gs://big_vision/zoo/deit3/bv_deit_3_large_384_21k.npz",
    # SigLIP image encoder checkpoints from https://arxiv.org/abs/2303.15343
    "SigLIP B/16 224": "gs://big_vision/siglip/webli_en_b16_224_63724782.npz:img",
    "SigLIP B/16 256": "gs://big_vision/siglip/webli_en_b16_256_60500360.npz:img",
    "SigLIP B/16 384": "gs://big_vision/siglip/webli_en_b16_384_68578854.npz:img",
    "SigLIP B/16 512": "gs://big_vision/siglip/webli_en_b16_512_68580893.npz:img",
    "SigLIP L/16 256": "gs://big_vision/siglip/webli_en_l16_256_60552751.npz:img",
    "SigLIP L/16 384": "gs://big_vision/siglip/webli_en_l16_384_63634585.npz:img",
    "SigLIP So400m/14 224": "gs://big_vision/siglip/webli_en_so400m_224_57633886.npz:img",
    "SigLIP So400m/14 384": "gs://big_vision/siglip/webli_en_so400m_384_58765454.npz:img",
    "SigLIP B/16-i18n 256": "gs://big_vision/siglip/webli_i18n_b16_256_66117334.npz:img",
    # SigLIP 2 image encoder checkpoints from https://arxiv.org/abs/2502.14786
    "SigLIP2 B/16 224": "gs://big_vision/siglip2/siglip2_b16_224.npz:img",
    "SigLIP2 B/16 256": "gs://big_vision/siglip2/siglip2_b16_256.npz:img",
    "SigLIP2 B/16 384": "gs://big_vision/siglip2/siglip2_b16_384.npz:img",
    "SigLIP2 B/16 512": "gs://big_vision/siglip2/siglip2_b16_512.npz:img",
    "SigLIP2 B/32 256": "gs://big_vision/siglip2/siglip2_b32_256.npz:img",
    "SigLIP2 L/16 256": "gs://big_vision/siglip2/siglip2_l16_256.npz:img",
    "SigLIP2 L/16 384": "gs://big_vision/siglip2/siglip2_l16_384.npz:img",
    "SigLIP2 L/16 512": "gs://big_vision/siglip2/siglip2_l16_512.npz:img",
    "SigLIP2 So400m/14 224": "gs://big_vision/siglip2/siglip2_so400m14_224.npz:img",
    "SigLIP2 So400m/14 384": "gs://big_vision/siglip2/siglip2_so400m14_384.npz:img",
    "SigLIP2 So400m/16 256": "gs://big_vision/siglip2/siglip2_so400m16_256.npz:img",
    "SigLIP2 So400m/16 384": "gs://big_vision/siglip2/siglip2_so400m16_384.npz:img",
    "SigLIP2 So400m/16 512": "gs://big_vision/siglip2/siglip2_so400m16_512.npz:img",
    "SigLIP2 g-opt/16 256": "gs://big_vision/siglip2/siglip2_g-opt16_256.npz:img",
    "SigLIP2 g-opt/16 384": "gs://big_vision/siglip2/siglip2_g-opt16_384.npz:img",
    # SigLIP 2 NaFlex image encoder checkpoints (big_vision reads them with its naflex_vit model
    # and its own preprocessing; listed for completeness).
    "SigLIP2 B/16 NaFlex": "gs://big_vision/siglip2/siglip2_b16_naflex.npz:img",
    "SigLIP2 So400m/16 NaFlex": "gs://big_vision/siglip2/siglip2_so400m16_naflex.npz:img",
}


def resolve_name(path: str) -> str:
  """A big_vision short name ('i1k-s16-300ep', see SHORT_NAMES) -> its gs:// path; else `path`.

  A local file that happens to carry such a name is read as that file: a name only stands in
  for a path that does not exist.
  """
  if path in SHORT_NAMES and not os.path.exists(path):
    return SHORT_NAMES[path]
  return path


def _split_selector(path: str) -> tuple[str, str | None]:
  """'x.npz:img/head' -> ('x.npz', 'img/head'); 'gs://b/x.npz' -> ('gs://b/x.npz', None).

  Like big_vision's load_params. The selector must start with a word character, so the
  '://' of a URL never reads as one; a local file whose name really contains ':' wins.
  """
  m = re.fullmatch(r"(.+):(\w[\w/]*)", path)
  if m is None or (not gfile.is_remote(path) and os.path.exists(path)):
    return path, None
  return m.group(1), m.group(2).rstrip("/")


# Seconds a remote (gs://, ...) read may take before it is reported instead of waited for: without
# network or credentials the GCS client can otherwise retry for many minutes.
REMOTE_TIMEOUT_S = float(os.environ.get("LINVIT_REMOTE_TIMEOUT_S", "120"))


def _remote_call(path: str, what: str, fn: Callable[[], Any]) -> Any:
  """fn() with a deadline; storage errors become CheckpointErrors that say what to check."""
  import threading

  box: dict[str, Any] = {}

  def target():
    try:
      box["value"] = fn()
    except BaseException as e:  # (re-raised in the caller)
      box["error"] = e

  worker = threading.Thread(target=target, name=f"read {path}", daemon=True)
  worker.start()
  worker.join(REMOTE_TIMEOUT_S)
  scheme = path.split("://", 1)[0]
  hint = (
      "is there network access and are there Google Cloud credentials (`gcloud auth "
      "application-default login` or GOOGLE_APPLICATION_CREDENTIALS)?"
      if scheme == "gs"
      else f"is there network access and are there credentials for {scheme}://?"
  )
  if worker.is_alive():
    raise CheckpointError(
        f"checkpoint '{path}': no answer within {REMOTE_TIMEOUT_S:.0f} s "
        f"while trying to {what} (LINVIT_REMOTE_TIMEOUT_S sets the limit); "
        f"{hint}"
    )
  error = box.get("error")
  if error is None:
    return box.get("value")
  if isinstance(error, CheckpointError) or not hasattr(error, "error_code"):
    raise error  # ours, or not a storage (tf.errors.OpError) failure
  detail = " ".join(str(getattr(error, "message", error)).split())
  raise CheckpointError(
      f"checkpoint '{path}': cannot {what}: {type(error).__name__}: "
      f"{detail[:300]}. Check the path; {hint}"
  ) from None


def _open(path: str):
  """A readable binary file object, or a CheckpointError naming the file and what is wrong."""
  if gfile.is_remote(path):
    gfile.tf_gfile()  # TensorFlow's import (seconds) happens here, not inside the deadline.

    def fetch() -> bytes:
      if not gfile.exists(path):
        raise CheckpointError(f"checkpoint '{path}': file not found")
      if gfile.isdir(path):
        raise CheckpointError(f"checkpoint '{path}': is a directory, expected an .npz " "file")
      # np.load needs seeks, which remote files do poorly: read it all, as big_vision does.
      with gfile.open(path, "rb") as f:
        return f.read()

    return io.BytesIO(gfile.read_bytes(path, lambda: _remote_call(path, "read it", fetch)))
  if not os.path.exists(path):
    raise CheckpointError(f"checkpoint '{path}': file not found (cwd {os.getcwd()!r})")
  if os.path.isdir(path):
    raise CheckpointError(
        f"checkpoint '{path}': is a directory, expected an .npz file "
        "(orbax/tensorstore checkpoint folders are not read here)"
    )
  if gfile.reading_once():  # the bytes are kept for the checkpoint's digest (read once)
    return io.BytesIO(gfile.read_bytes(path))
  return open(path, "rb")  # (closed by the caller)


def _recover_dtype(name: str, a: np.ndarray, path: str) -> np.ndarray:
  # np.savez has no bfloat16: it writes such arrays as 2-byte void ('|V2'); view them back.
  if a.dtype.type is np.void:
    if a.dtype.itemsize != 2:
      raise CheckpointError(
          f"checkpoint '{path}': key {name!r} has an opaque dtype "
          f"{a.dtype.str} that is not a bfloat16 (2-byte) array"
      )
    return a.view(ml_dtypes.bfloat16)
  return a


def _read_npz(path: str) -> dict[str, np.ndarray]:
  """All arrays of an .npz file as a flat dict; errors name the file and the cause."""
  with _open(path) as f:
    head = f.read(6)
    if not head:
      raise CheckpointError(f"checkpoint '{path}': file is empty (0 bytes)")
    if not head.startswith((b"PK", b"\x93NUMPY")):  # zip (.npz), or np.save's single array
      # np.load would take it for a pickle and advise allow_pickle, which is never the fix.
      raise CheckpointError(
          f"checkpoint '{path}': not an .npz (a zip archive of arrays), a .safetensors file "
          f"or a model folder (it starts with {head!r})"
      )
    f.seek(0)
    try:
      loaded = np.load(f, allow_pickle=False)
      flat = None  # None: a lone np.save array, not an archive.
      if isinstance(loaded, np.lib.npyio.NpzFile):
        with loaded:  # Read every array while the file is open: NpzFile is lazy.
          flat = {k: loaded[k] for k in loaded.files}
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError) as e:
      raise CheckpointError(
          f"checkpoint '{path}': truncated or corrupt, not a readable "
          f".npz zip archive ({type(e).__name__}: {e})"
      ) from e
  if flat is None:
    raise CheckpointError(
        f"checkpoint '{path}': holds a single array (np.save), expected " "an .npz of named params"
    )
  if not flat:
    raise CheckpointError(f"checkpoint '{path}': empty checkpoint, the .npz has no arrays")
  return {k: _recover_dtype(k, v, path) for k, v in flat.items()}


def top_keys(tree: Mapping[str, Any]) -> str:
  """The top-level names of a tree, for error messages that say what is there instead."""
  return ", ".join(repr(k) for k in sorted(tree))


def load_npz(path: str) -> Params:
  """Reads a big_vision .npz as nested params, whatever layout it was written in.

  Layouts: params-only (what big_vision publishes), a full train checkpoint with a `params/`
  subtree (optax era) or `opt/target/` (old flax.optim era). `file.npz:img` selects a subtree
  of the params (e.g. the image tower of a SigLIP two-tower checkpoint). A big_vision short
  name (`SHORT_NAMES`, e.g. 'i1k-s16-300ep') reads the gs:// checkpoint it names.
  """
  file, selector = _split_selector(resolve_name(path))
  try:
    tree = unflatten(_read_npz(file))
  except CheckpointError as e:
    if str(e).startswith("checkpoint '"):
      raise
    raise CheckpointError(f"checkpoint '{file}': {e}") from e
  if isinstance(tree.get("params"), dict):
    tree = tree["params"]
  elif isinstance(tree.get("opt"), dict) and isinstance(tree["opt"].get("target"), dict):
    tree = tree["opt"]["target"]
  if selector:
    node: Any = tree
    for depth, part in enumerate(selector.split("/")):
      if not isinstance(node, dict) or part not in node:
        where = "/".join(selector.split("/")[:depth]) or "the top level"
        avail = top_keys(node) if isinstance(node, dict) else "none (it is an array)"
        raise CheckpointError(
            f"checkpoint '{file}': no subtree {selector!r} "
            f"({part!r} not found under {where}); available: {avail}"
        )
      node = node[part]
    if not isinstance(node, dict):
      raise CheckpointError(
          f"checkpoint '{file}': {selector!r} is a single array, " "expected a subtree of params"
      )
    tree = node
  return tree


def _to_savable(name: str, value: Any) -> np.ndarray:
  a = np.asarray(value)  # also pulls jax arrays to host
  if a.dtype == ml_dtypes.bfloat16:
    return a.view(np.dtype("V2"))  # What np.savez would write anyway; big_vision reads it.
  if a.dtype.kind not in "biufc":
    raise CheckpointError(f"cannot save param {name!r}: dtype {a.dtype} is not numeric")
  return a


def save_npz(path: str, params: Mapping[str, Any]) -> None:
  """Writes params as a big_vision params-only .npz, atomically.

  The file is written next to `path` under a temporary name and renamed over it only when
  complete, so a crash or error never leaves a half-written checkpoint (or destroys the old one).
  """
  flat = {k: _to_savable(k, v) for k, v in flatten(params).items()}
  if not flat:
    raise CheckpointError(f"refusing to save an empty checkpoint to '{path}'")
  if gfile.is_remote(path):
    # Remote files seek poorly (np.savez's zip writer seeks back to fill in sizes): build the
    # archive in memory and write it in one piece.
    buf = io.BytesIO()
    np.savez(buf, **flat)
    gfile.makedirs(path.rsplit("/", 1)[0])
    with gfile.atomic_open(path, "wb") as f:
      f.write(buf.getvalue())
    return
  gfile.makedirs(os.path.dirname(os.path.abspath(path)))
  with gfile.atomic_open(path, "wb") as f:
    np.savez(f, **flat)  # A file object, so np.savez does not append '.npz' to the name.


# ------------------------------------------------------------------------------------------------
# Merging into a model's params.


def _dtype_class(dtype: np.dtype) -> str:
  kind = {"b": "bool", "i": "integer", "u": "integer", "f": "float", "c": "complex"}
  if dtype.kind in kind:
    return kind[dtype.kind]
  try:  # ml_dtypes' bfloat16, float8_*, int4 all report kind 'V'.
    ml_dtypes.finfo(dtype)
    return "float"
  except ValueError:
    pass
  try:
    ml_dtypes.iinfo(dtype)
    return "integer"
  except ValueError:
    return f"opaque {dtype.str}"


def count_non_finite(value: Any) -> int:
  """How many NaN/Inf entries a float leaf has (0 for non-floats)."""
  a = np.asarray(value)
  if _dtype_class(a.dtype) != "float":
    return 0
  if a.dtype not in (np.float16, np.float32, np.float64):
    a = a.astype(np.float32)
  return int(a.size - np.count_nonzero(np.isfinite(a)))


def shape_of(value: Any) -> tuple[int, ...]:
  """The shape of an array, a jax array or a jax.ShapeDtypeStruct, as ints."""
  # .shape first: init params may be jax.ShapeDtypeStruct (from jax.eval_shape), not arrays.
  return tuple(int(d) for d in (value.shape if hasattr(value, "shape") else np.shape(value)))


def dtype_of(value: Any) -> np.dtype:
  """The numpy dtype of an array, a jax array or a jax.ShapeDtypeStruct."""
  return np.dtype(value.dtype if hasattr(value, "dtype") else np.asarray(value).dtype)


def is_posemb(name: str) -> bool:
  """Whether a '/'-joined param name is a learned position embedding (resampled, not merged)."""
  return name.rsplit("/", 1)[-1] == "pos_embedding"


def dont_load_matcher(dont_load: Sequence[str]) -> Callable[[str], bool]:
  """Whether a '/'-joined param name fully matches one of the `dont_load` regexes (one regex or
  several); a bad regex is a CheckpointError now, not at the first name."""
  patterns = tree_lib.compile_patterns(dont_load, error=CheckpointError, what="dont_load pattern")
  return lambda name: tree_lib.matches(name, patterns)


def raise_problems(source: str, problems: list[str], hint: str = "") -> None:
  """A CheckpointError naming `source` and every problem (one per line); none: returns."""
  if not problems:
    return
  where = f"checkpoint '{source}'" if source else "checkpoint"
  if len(problems) == 1:
    msg = f"{where}: {problems[0]}"
  else:
    msg = f"{where}: {len(problems)} problems:\n" + "\n".join(f"  {p}" for p in problems)
  raise CheckpointError(msg + hint, problems)


def merge_params(
    loaded: Mapping[str, Any],
    init: Mapping[str, Any],
    dont_load: Sequence[str] = (),
    *,
    source: str = "",
) -> Params:
  """`init`'s structure with `loaded`'s values; strict, collecting every mismatch in one error.

  Every param of `init` must be in `loaded` with the same shape and kind of dtype (float, int,
  ...), every param of `loaded` must be in `init`, and loaded floats must be finite. Params whose
  '/'-joined name fully matches a `dont_load` regex keep their init value and are exempt.
  A `pos_embedding` may differ in its number of positions (load_vit_params resamples it).
  """
  skipped = dont_load_matcher(dont_load)
  flat_loaded, flat_init = flatten(loaded), flatten(init)
  merged: dict[str, Any] = {}
  problems: list[str] = []
  for name, init_val in flat_init.items():
    want = shape_of(init_val)
    if skipped(name):
      merged[name] = init_val
      continue
    if name not in flat_loaded:
      problems.append(f"missing {name!r} (expected shape {want})")
      continue
    val = flat_loaded[name]
    got = shape_of(val)
    resamplable = (
        is_posemb(name) and len(got) == len(want) == 3 and (got[0], got[2]) == (want[0], want[2])
    )
    if got != want and not resamplable:
      problems.append(f"shape mismatch at {name!r}: checkpoint {got} vs model {want}")
    got_cls, want_cls = _dtype_class(dtype_of(val)), _dtype_class(dtype_of(init_val))
    if got_cls != want_cls:
      problems.append(
          f"dtype mismatch at {name!r}: checkpoint {dtype_of(val)} ({got_cls}) "
          f"vs model {dtype_of(init_val)} ({want_cls})"
      )
    elif bad := count_non_finite(val):
      problems.append(
          f"non-finite values at {name!r}: {bad} of {np.size(val)} entries " "are NaN/Inf"
      )
    merged[name] = val
  for name in sorted(flat_loaded.keys() - flat_init.keys()):
    if not skipped(name):
      problems.append(
          f"unexpected key {name!r} (shape {shape_of(flat_loaded[name])}), " "not in the model"
      )
  hint = ""
  if any(p.startswith(("missing", "unexpected")) for p in problems):
    hint = (
        "\n(params to keep at their init value, or to ignore in the checkpoint, go in "
        "dont_load as regexes, e.g. dont_load=('head/.*',))"
    )
  raise_problems(source, problems, hint)
  return unflatten(merged)
