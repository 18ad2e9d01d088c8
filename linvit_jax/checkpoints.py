"""big_vision-compatible ViT checkpoints: read/write .npz, fix old layouts, merge into a model.

A big_vision params checkpoint is an uncompressed .npz whose keys are '/'-joined flax module
paths ("Transformer/encoderblock_0/MlpBlock_0/Dense_0/kernel"). Everything here works on plain
nested dicts of numpy arrays (no 'params' top key) and is pure: inputs are never mutated.

The one path in is `load_vit_params` (what models/vit.py's `load()` delegates to):
    load_npz -> fix_old_checkpoints -> pyloop/scan layout -> merge_params -> resample_posemb -> cast
"""

from __future__ import annotations

import io
import math
import os
import re
import tempfile
import zipfile
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ml_dtypes
import numpy as np
import scipy.ndimage

from linvit_jax.errors import UserError
from linvit_jax.models.variants import decode_variant

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
    """Nested dict -> {'a/b/c': leaf}, names sorted (the order big_vision writes them in).

    Empty sub-dicts vanish, as in big_vision's tree_flatten_with_names.
    """
    flat: dict[str, Any] = {}

    def visit(node: Mapping[str, Any], prefix: str) -> None:
        for key in sorted(node):
            if not isinstance(key, str) or not key or "/" in key:
                raise CheckpointError(f"param name {key!r} under '{prefix or '<root>'}' must be a "
                                      "non-empty string without '/' to be saved as an npz key")
            value = node[key]
            if isinstance(value, Mapping):
                visit(value, prefix + key + "/")
            else:
                flat[prefix + key] = value

    if not isinstance(params, Mapping):
        raise CheckpointError(f"expected a nested dict of params, got {type(params).__name__}")
    visit(params, "")
    return flat


def unflatten(flat: Mapping[str, Any]) -> Params:
    """{'a/b/c': leaf} -> nested dict. A name that is both a leaf and a prefix is an error."""
    tree: Params = {}
    for name in sorted(flat):
        parts = name.split("/")
        node = tree
        for depth, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise CheckpointError(f"key {name!r} nests under '{'/'.join(parts[:depth + 1])}', "
                                      "which is itself an array")
            node = child
        if parts[-1] in node:
            raise CheckpointError(f"key {name!r} is both an array and a prefix of other keys")
        node[parts[-1]] = flat[name]
    return tree


def _copy_tree(tree: Mapping[str, Any]) -> Params:
    """Copies the dict structure (not the arrays), so callers' trees are never mutated."""
    return {k: _copy_tree(v) if isinstance(v, Mapping) else v for k, v in tree.items()}


# ------------------------------------------------------------------------------------------------
# .npz reading and writing.

def _is_remote(path: str) -> bool:
    return "://" in path


def _gfile():
    # TensorFlow costs seconds and >1 GB to import; only remote paths (gs://, ...) need it.
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    return tf.io.gfile


# big_vision's short checkpoint names, accepted wherever a checkpoint path is (teacher.init,
# `init=` of configs/convert_folder.py, vit.load, load_npz): `init=i1k-s16-300ep` works as in
# big_vision. Copied verbatim from big_vision/models/vit.py `VANITY_NAMES` (google-research/
# big_vision commit 0127fb6b, 2025-05-19); keep the two in sync. A ':img' suffix selects the
# image tower of a SigLIP two-tower checkpoint (see `_split_selector`).
SHORT_NAMES: dict[str, str] = {
    # pylint: disable=line-too-long
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
    # pylint: enable=line-too-long
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
    if m is None or (not _is_remote(path) and os.path.exists(path)):
        return path, None
    return m.group(1), m.group(2).rstrip("/")


# Seconds a remote (gs://, ...) read may take before it is reported instead of waited for: without
# network or credentials the GCS client can otherwise retry for many minutes.
REMOTE_TIMEOUT_S = float(os.environ.get("LINVIT_REMOTE_TIMEOUT_S", "120"))


def _remote_call(path: str, what: str, fn: Callable[[], Any]) -> Any:
    """fn() with a deadline; storage errors become CheckpointErrors that say what to check."""
    import threading  # pylint: disable=import-outside-toplevel
    box: dict[str, Any] = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as e:  # pylint: disable=broad-except  (re-raised in the caller)
            box["error"] = e

    worker = threading.Thread(target=target, name=f"read {path}", daemon=True)
    worker.start()
    worker.join(REMOTE_TIMEOUT_S)
    scheme = path.split("://", 1)[0]
    hint = ("is there network access and are there Google Cloud credentials (`gcloud auth "
            "application-default login` or GOOGLE_APPLICATION_CREDENTIALS)?" if scheme == "gs"
            else f"is there network access and are there credentials for {scheme}://?")
    if worker.is_alive():
        raise CheckpointError(f"checkpoint '{path}': no answer within {REMOTE_TIMEOUT_S:.0f} s "
                              f"while trying to {what} (LINVIT_REMOTE_TIMEOUT_S sets the limit); "
                              f"{hint}")
    error = box.get("error")
    if error is None:
        return box.get("value")
    if isinstance(error, CheckpointError) or not hasattr(error, "error_code"):
        raise error  # ours, or not a storage (tf.errors.OpError) failure
    detail = " ".join(str(getattr(error, "message", error)).split())
    raise CheckpointError(f"checkpoint '{path}': cannot {what}: {type(error).__name__}: "
                          f"{detail[:300]}. Check the path; {hint}") from None


def _open(path: str):
    """A readable binary file object, or a CheckpointError naming the file and what is wrong."""
    if _is_remote(path):
        gfile = _gfile()

        def fetch() -> bytes:
            if not gfile.exists(path):
                raise CheckpointError(f"checkpoint '{path}': file not found")
            if gfile.isdir(path):
                raise CheckpointError(f"checkpoint '{path}': is a directory, expected an .npz "
                                      "file")
            # np.load needs seeks, which remote files do poorly: read it all, as big_vision does.
            with gfile.GFile(path, "rb") as f:
                return f.read()
        return io.BytesIO(_remote_call(path, "read it", fetch))
    if not os.path.exists(path):
        raise CheckpointError(f"checkpoint '{path}': file not found (cwd {os.getcwd()!r})")
    if os.path.isdir(path):
        raise CheckpointError(f"checkpoint '{path}': is a directory, expected an .npz file "
                              "(orbax/tensorstore checkpoint folders are not read here)")
    return open(path, "rb")  # pylint: disable=consider-using-with  (closed by the caller)


def _recover_dtype(name: str, a: np.ndarray, path: str) -> np.ndarray:
    # np.savez has no bfloat16: it writes such arrays as 2-byte void ('|V2'); view them back.
    if a.dtype.type is np.void:
        if a.dtype.itemsize != 2:
            raise CheckpointError(f"checkpoint '{path}': key {name!r} has an opaque dtype "
                                  f"{a.dtype.str} that is not a bfloat16 (2-byte) array")
        return a.view(ml_dtypes.bfloat16)
    return a


def _read_npz(path: str) -> dict[str, np.ndarray]:
    """All arrays of an .npz file as a flat dict; errors name the file and the cause."""
    with _open(path) as f:
        if not f.read(1):
            raise CheckpointError(f"checkpoint '{path}': file is empty (0 bytes)")
        f.seek(0)
        try:
            loaded = np.load(f, allow_pickle=False)
            flat = None  # None: a lone np.save array, not an archive.
            if isinstance(loaded, np.lib.npyio.NpzFile):
                with loaded:  # Read every array while the file is open: NpzFile is lazy.
                    flat = {k: loaded[k] for k in loaded.files}
        except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError) as e:
            raise CheckpointError(f"checkpoint '{path}': truncated or corrupt, not a readable "
                                  f".npz zip archive ({type(e).__name__}: {e})") from e
    if flat is None:
        raise CheckpointError(f"checkpoint '{path}': holds a single array (np.save), expected "
                              "an .npz of named params")
    if not flat:
        raise CheckpointError(f"checkpoint '{path}': empty checkpoint, the .npz has no arrays")
    return {k: _recover_dtype(k, v, path) for k, v in flat.items()}


def _top_keys(tree: Mapping[str, Any]) -> str:
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
                avail = _top_keys(node) if isinstance(node, dict) else "none (it is an array)"
                raise CheckpointError(f"checkpoint '{file}': no subtree {selector!r} "
                                      f"({part!r} not found under {where}); available: {avail}")
            node = node[part]
        if not isinstance(node, dict):
            raise CheckpointError(f"checkpoint '{file}': {selector!r} is a single array, "
                                  "expected a subtree of params")
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
    if _is_remote(path):
        gfile = _gfile()
        buf = io.BytesIO()
        np.savez(buf, **flat)
        tmp = f"{path}.tmp-{os.getpid()}"
        parent = path.rsplit("/", 1)[0]
        gfile.makedirs(parent)
        try:
            with gfile.GFile(tmp, "wb") as f:
                f.write(buf.getvalue())
            gfile.rename(tmp, path, overwrite=True)
        except BaseException:
            if gfile.exists(tmp):
                gfile.remove(tmp)
            raise
        return
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **flat)  # A file object, so np.savez does not append '.npz' to the name.
            f.flush()
            os.fsync(f.fileno())
        # mkstemp makes the file owner-only; a checkpoint is shared like any file the user writes.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


# ------------------------------------------------------------------------------------------------
# Old checkpoint layouts.

_NUMBERED = re.compile(r"(.+)_(\d+)")


def convert_pre_linen(tree: Mapping[str, Any]) -> Params:
    """Renumbers pre-linen submodule names, as flax.training.checkpoints.convert_pre_linen.

    Pre-linen flax numbered submodules globally within their parent (LayerNorm_0,
    MultiHeadDotProductAttention_1, LayerNorm_2, MlpBlock_3); linen counts per module type
    (LayerNorm_0, MultiHeadDotProductAttention_0, LayerNorm_1, MlpBlock_0). Within each parent,
    names of the same type are renumbered 0, 1, 2, ... in order of their old number. Already-linen
    trees come back unchanged (numbers are already 0..n-1 per type).
    """
    def order(name: str) -> tuple[str, int]:
        m = _NUMBERED.fullmatch(name)
        return (m.group(1), int(m.group(2))) if m else (name, -1)

    out: Params = {}
    counts: dict[str, int] = {}
    for name in sorted(tree, key=order):
        value = tree[name]
        m = _NUMBERED.fullmatch(name)
        if m:
            kind = m.group(1)
            new = f"{kind}_{counts.get(kind, 0)}"
            counts[kind] = counts.get(kind, 0) + 1
        else:
            new = name
        out[new] = convert_pre_linen(value) if isinstance(value, Mapping) else value
    return out


def _has_cls_slot(n: int) -> bool:
    return math.isqrt(n - 1) ** 2 == n - 1 and n > 1


def fix_old_checkpoints(params: Mapping[str, Any], *, model_posemb_len: int | None = None
                        ) -> Params:
    """Brings older ViT checkpoints (original ViT paper, AugReg, ViT-G era) to today's names.

    - pre-linen module numbering (see convert_pre_linen);
    - `Transformer/posembed_input/pos_embedding` and `Transformer/pos_embedding` -> `pos_embedding`;
    - a posemb with a [cls] slot (N = g*g + 1; old ViTs concatenated [cls] before adding the
      posemb): the slot is split off and added into `cls`, which is exactly equivalent;
    - an inlined MAP head (`probe` at the top level) -> `MAPHead_0`.
    The [cls]-slot test is big_vision's (N = g*g + 1), which would misread a non-square grid with
    h*w = g*g + 1 (2x5, 4x5, ...), as today's checkpoints of non-square models have. So a
    top-level posemb that already has `model_posemb_len` positions (the model it is loaded into;
    load_vit_params passes it) is taken as is. Old-location posembs are always from square models.
    """
    params = convert_pre_linen(params)
    enc = params.get("Transformer")
    old_location = False
    if isinstance(enc, dict):
        if "posembed_input" in enc:
            params["pos_embedding"] = enc.pop("posembed_input")["pos_embedding"]
            old_location = True
        if "pos_embedding" in enc:
            params["pos_embedding"] = enc.pop("pos_embedding")
            old_location = True

    pe = params.get("pos_embedding")
    if (pe is not None and np.ndim(pe) == 3 and _has_cls_slot(pe.shape[1])
            and (old_location or pe.shape[1] != model_posemb_len)):
        params["pos_embedding"] = pe[:, 1:]
        if "cls" in params:
            params["cls"] = params["cls"] + pe[:, :1]

    if "probe" in params:
        head_parts = ("probe", "MlpBlock_0", "MultiHeadDotProductAttention_0", "LayerNorm_0")
        params["MAPHead_0"] = {k: params.pop(k) for k in head_parts if k in params}
    return params


def _block_index(name: str) -> int | None:
    m = re.fullmatch(r"encoderblock_(\d+)", name)
    return int(m.group(1)) if m else None


def pyloop_to_scan(params: Mapping[str, Any]) -> Params:
    """Stacks `Transformer/encoderblock_{i}` into `Transformer/encoderblock` (leading depth axis).

    A tree that is already scanned comes back unchanged.
    """
    params = _copy_tree(params)
    enc = params.get("Transformer", {})
    indices = sorted(i for i in map(_block_index, enc) if i is not None)
    if not indices:
        return params
    if "encoderblock" in enc:
        raise CheckpointError("'Transformer' has both 'encoderblock' (scan) and 'encoderblock_N' "
                              "(python loop) blocks")
    if indices != list(range(len(indices))):
        raise CheckpointError(f"'Transformer' blocks must be numbered 0..{len(indices) - 1} to be "
                              f"stacked, found encoderblock_{indices}")
    blocks = [flatten(enc.pop(f"encoderblock_{i}")) for i in indices]
    for i, block in enumerate(blocks[1:], 1):
        if block.keys() != blocks[0].keys():
            diff = sorted(block.keys() ^ blocks[0].keys())
            raise CheckpointError(f"cannot stack encoder blocks: encoderblock_{i} and "
                                  f"encoderblock_0 differ in params {diff}")
    stacked = {}
    for name in blocks[0]:
        shapes = {np.shape(b[name]) for b in blocks}
        if len(shapes) > 1:
            raise CheckpointError(f"cannot stack encoder blocks: 'encoderblock_N/{name}' has "
                                  f"different shapes across blocks {sorted(shapes)}")
        stacked[name] = np.stack([np.asarray(b[name]) for b in blocks])
    enc["encoderblock"] = unflatten(stacked)
    return params


def scan_to_pyloop(params: Mapping[str, Any]) -> Params:
    """Splits `Transformer/encoderblock` (leading depth axis) into `encoderblock_{i}`.

    A tree that is already per-block comes back unchanged.
    """
    params = _copy_tree(params)
    enc = params.get("Transformer", {})
    if "encoderblock" not in enc:
        return params
    flat = flatten(enc.pop("encoderblock"))
    depths = {np.shape(v)[0] if np.ndim(v) else None for v in flat.values()}
    if len(depths) != 1 or None in depths:
        raise CheckpointError("cannot unstack 'Transformer/encoderblock': its params disagree on "
                              f"the leading (depth) axis, sizes {sorted(map(str, depths))}")
    for i in range(depths.pop()):
        enc[f"encoderblock_{i}"] = unflatten({k: np.asarray(v)[i] for k, v in flat.items()})
    return params


# ------------------------------------------------------------------------------------------------
# Position embeddings.

def _square_side(n: int, what: str) -> int:
    side = math.isqrt(n)
    if side * side != n:
        raise CheckpointError(f"{what} has {n} positions, not a square grid; pass its (h, w) "
                              "explicitly to resample_posemb")
    return side


def resample_posemb(old: np.ndarray, new: Any, old_hw: tuple[int, int] | None = None,
                    new_hw: tuple[int, int] | None = None) -> np.ndarray:
    """Resizes a (1, h*w, D) learned posemb to another grid: bilinear, as big_vision does.

    `new` is the target array or its shape. Grids are square unless given as (h, w). Corners map to
    corners (scipy.ndimage.zoom, order=1, its default align-corners grid), like big_vision's
    "high-res fine-tuning".
    """
    old = np.asarray(old)
    new_shape = tuple(new.shape if hasattr(new, "shape") else new)
    if old.ndim != 3 or len(new_shape) != 3 or old.shape[0] != 1 or new_shape[0] != 1:
        raise CheckpointError(f"pos_embedding must be (1, N, D): got {old.shape} -> {new_shape}")
    if old.shape[2] != new_shape[2]:
        raise CheckpointError(f"pos_embedding width differs, cannot resample: checkpoint "
                              f"{old.shape} vs model {new_shape}")
    oh, ow = old_hw or (_square_side(old.shape[1], f"checkpoint pos_embedding {old.shape}"),) * 2
    nh, nw = new_hw or (_square_side(new_shape[1], f"model pos_embedding {new_shape}"),) * 2
    if oh * ow != old.shape[1] or nh * nw != new_shape[1]:
        raise CheckpointError(f"pos_embedding grids ({oh}, {ow}) -> ({nh}, {nw}) do not match "
                              f"the shapes {old.shape} -> {new_shape}")
    if (oh, ow) == (nh, nw):
        return old
    # scipy has no bfloat16; interpolate in float32 and cast back.
    grid = old.reshape(oh, ow, -1).astype(np.float32)
    grid = scipy.ndimage.zoom(grid, (nh / oh, nw / ow, 1), order=1)
    assert grid.shape[:2] == (nh, nw), (grid.shape, nh, nw)  # zoom rounds; exact ratios hit.
    return grid.reshape(new_shape).astype(old.dtype)


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


def _non_finite(value: Any) -> int:
    """How many NaN/Inf entries a float leaf has (0 for non-floats)."""
    a = np.asarray(value)
    if _dtype_class(a.dtype) != "float":
        return 0
    if a.dtype not in (np.float16, np.float32, np.float64):
        a = a.astype(np.float32)
    return int(a.size - np.count_nonzero(np.isfinite(a)))


def _shape(value: Any) -> tuple[int, ...]:
    # .shape first: init params may be jax.ShapeDtypeStruct (from jax.eval_shape), not arrays.
    return tuple(int(d) for d in (value.shape if hasattr(value, "shape") else np.shape(value)))


def _dtype(value: Any) -> np.dtype:
    return np.dtype(value.dtype if hasattr(value, "dtype") else np.asarray(value).dtype)


def _is_posemb(name: str) -> bool:
    return name.rsplit("/", 1)[-1] == "pos_embedding"


def _compile(dont_load: Sequence[str]) -> list[re.Pattern]:
    if isinstance(dont_load, str):
        dont_load = (dont_load,)  # A lone string would otherwise be iterated per character.
    patterns = []
    for p in dont_load:
        try:
            patterns.append(re.compile(p))
        except re.error as e:
            raise CheckpointError(f"dont_load pattern {p!r} is not a valid regex: {e}") from e
    return patterns


def _raise_problems(source: str, problems: list[str], hint: str = "") -> None:
    if not problems:
        return
    where = f"checkpoint '{source}'" if source else "checkpoint"
    if len(problems) == 1:
        msg = f"{where}: {problems[0]}"
    else:
        msg = f"{where}: {len(problems)} problems:\n" + "\n".join(f"  {p}" for p in problems)
    raise CheckpointError(msg + hint, problems)


def merge_params(loaded: Mapping[str, Any], init: Mapping[str, Any],
                 dont_load: Sequence[str] = (), *, source: str = "") -> Params:
    """`init`'s structure with `loaded`'s values; strict, collecting every mismatch in one error.

    Every param of `init` must be in `loaded` with the same shape and kind of dtype (float, int,
    ...), every param of `loaded` must be in `init`, and loaded floats must be finite. Params whose
    '/'-joined name fully matches a `dont_load` regex keep their init value and are exempt.
    A `pos_embedding` may differ in its number of positions (load_vit_params resamples it).
    """
    patterns = _compile(dont_load)

    def skipped(name: str) -> bool:
        return any(p.fullmatch(name) for p in patterns)

    flat_loaded, flat_init = flatten(loaded), flatten(init)
    merged: dict[str, Any] = {}
    problems: list[str] = []
    for name, init_val in flat_init.items():
        want = _shape(init_val)
        if skipped(name):
            merged[name] = init_val
            continue
        if name not in flat_loaded:
            problems.append(f"missing {name!r} (expected shape {want})")
            continue
        val = flat_loaded[name]
        got = _shape(val)
        resamplable = (_is_posemb(name) and len(got) == len(want) == 3
                       and (got[0], got[2]) == (want[0], want[2]))
        if got != want and not resamplable:
            problems.append(f"shape mismatch at {name!r}: checkpoint {got} vs model {want}")
        got_cls, want_cls = _dtype_class(_dtype(val)), _dtype_class(_dtype(init_val))
        if got_cls != want_cls:
            problems.append(f"dtype mismatch at {name!r}: checkpoint {_dtype(val)} ({got_cls}) "
                            f"vs model {_dtype(init_val)} ({want_cls})")
        elif bad := _non_finite(val):
            problems.append(f"non-finite values at {name!r}: {bad} of {np.size(val)} entries "
                            "are NaN/Inf")
        merged[name] = val
    for name in sorted(flat_loaded.keys() - flat_init.keys()):
        if not skipped(name):
            problems.append(f"unexpected key {name!r} (shape {_shape(flat_loaded[name])}), "
                            "not in the model")
    hint = ""
    if any(p.startswith(("missing", "unexpected")) for p in problems):
        hint = ("\n(params to keep at their init value, or to ignore in the checkpoint, go in "
                "dont_load as regexes, e.g. dont_load=('head/.*',))")
    _raise_problems(source, problems, hint)
    return unflatten(merged)


# ------------------------------------------------------------------------------------------------
# The one entry point models/vit.py's load() delegates to.

def _check_against_config(params: Params, model_cfg: Mapping[str, Any],
                          skipped: Callable[[str], bool], source: str) -> None:
    """Clear errors when the checkpoint is plainly a different ViT than `model_cfg` describes.

    Only what is checkable from the params and stated in the config is compared, and only for
    params that will actually be loaded (not dont_load'ed).
    """
    cfg = {**decode_variant(model_cfg.get("variant")),
           **{k: model_cfg[k] for k in ("patch_size", "width", "num_heads", "mlp_dim")
              if model_cfg.get(k) is not None}}
    flat = flatten(params)
    problems = []
    emb = flat.get("embedding/kernel")
    if emb is not None and np.ndim(emb) == 4 and not skipped("embedding/kernel"):
        if "patch_size" in cfg:
            ps = cfg["patch_size"]
            ps = tuple(ps) if isinstance(ps, Sequence) else (ps, ps)
            if tuple(emb.shape[:2]) != tuple(ps):
                problems.append(f"patch size {tuple(emb.shape[:2])} (embedding/kernel "
                                f"{_shape(emb)}) but the model config says {ps}")
        if "width" in cfg and emb.shape[-1] != cfg["width"]:
            problems.append(f"width {emb.shape[-1]} (embedding/kernel {_shape(emb)}) but the "
                            f"model config says {cfg['width']}")
    block = next((n.rsplit("/", 2)[0] for n in sorted(flat)
                  if re.fullmatch(r"Transformer/encoderblock(_0)?/MultiHeadDotProductAttention_0"
                                  r"/query/kernel", n)), None)
    if block is not None and "num_heads" in cfg:
        name = block + "/query/kernel"
        q = flat[name]
        if not skipped(name) and q.shape[-2] != cfg["num_heads"]:
            problems.append(f"{q.shape[-2]} heads ({name} {_shape(q)}) but the model config "
                            f"says num_heads={cfg['num_heads']}")
    mlp = next((n for n in sorted(flat) if re.fullmatch(
        r"Transformer/encoderblock(_0)?/MlpBlock_0/Dense_0/kernel", n)), None)
    if mlp is not None and "mlp_dim" in cfg and not skipped(mlp):
        if flat[mlp].shape[-1] != cfg["mlp_dim"]:
            problems.append(f"mlp_dim {flat[mlp].shape[-1]} ({mlp} {_shape(flat[mlp])}) but the "
                            f"model config says {cfg['mlp_dim']}")
    _raise_problems(source, problems)


def infer_vit_config(path: str) -> dict[str, Any]:
    """The big_vision ViT fields a checkpoint's names and shapes decide, for `vit.Model(**...)`.

    patch_size and width (embedding/kernel), depth (blocks, per-block or scanned), num_heads
    (query/kernel [D, H, Dh]), mlp_dim (Dense_0), posemb ('learn' when a pos_embedding is stored,
    else 'sincos2d'), pool_type ('tok' with a cls token, 'map' with a MAP head, else 'gap': a
    'gap' / '0' / 'none' model stores nothing that tells them apart), num_classes (head/kernel,
    None when there is no head), rep_size (pre_logits/kernel). Also `posemb_grid`: the stored
    position-embedding grid (h, w), the resolution the checkpoint was trained at, for information.
    Any layout `load_vit_params` reads (old names, scanned) works.
    """
    params = fix_old_checkpoints(load_npz(path))
    flat = flatten(params)
    problems = []
    emb = flat.get("embedding/kernel")
    if emb is None or np.ndim(emb) != 4:
        _raise_problems(path, [f"no patch embedding 'embedding/kernel' [ph, pw, C, D] (top-level "
                               f"keys: {_top_keys(params)}): not a big_vision ViT checkpoint"])
    scanned = isinstance(params.get("Transformer"), dict) and "encoderblock" in params["Transformer"]
    block = "Transformer/encoderblock" if scanned else "Transformer/encoderblock_0"
    query = flat.get(f"{block}/MultiHeadDotProductAttention_0/query/kernel")
    dense0 = flat.get(f"{block}/MlpBlock_0/Dense_0/kernel")
    if query is None or dense0 is None:
        problems.append(f"no first encoder block with attention query and MLP kernels under "
                        f"{block!r}")
    _raise_problems(path, problems)
    if scanned:
        depth = int(query.shape[0])
    else:
        indices = [_block_index(n) for n in params["Transformer"]]
        depth = 1 + max(i for i in indices if i is not None)
    if "cls" in params:
        pool = "tok"
    elif "MAPHead_0" in params:
        pool = "map"
    else:
        pool = "gap"
    head = flat.get("head/kernel")
    rep = flat.get("pre_logits/kernel")
    pe = flat.get("pos_embedding")
    grid = None
    if pe is not None and np.ndim(pe) == 3:
        side = math.isqrt(pe.shape[1])
        grid = (side, side) if side * side == pe.shape[1] else None
    return dict(patch_size=tuple(int(x) for x in emb.shape[:2]), width=int(emb.shape[-1]),
                depth=int(depth), num_heads=int(query.shape[-2]), mlp_dim=int(dense0.shape[-1]),
                posemb="learn" if pe is not None else "sincos2d", pool_type=pool,
                num_classes=int(head.shape[-1]) if head is not None else None,
                rep_size=int(rep.shape[-1]) if rep is not None else False, posemb_grid=grid)


def load_vit_params(init_params: Mapping[str, Any] | None, init_file: str,
                    model_cfg: Mapping[str, Any], dont_load: Sequence[str] = ()) -> Params:
    """big_vision's `vit.load` semantics: a checkpoint made to fit the model `init_params` is from.

    Steps: read (any layout, `:subtree` selector) -> fix old names -> scan or per-block layout
    as `model_cfg['scan']` says -> check against model_cfg (patch size, width, heads, mlp_dim) ->
    strict merge into `init_params` (dont_load'ed params keep their init value) -> resample the
    posemb to the model's grid -> cast each param to the model's dtype. Returns numpy arrays.
    With `init_params=None` the fixed-up checkpoint is returned as is (after the config checks).
    """
    init_pe = (init_params or {}).get("pos_embedding")
    posemb_len = _shape(init_pe)[1] if init_pe is not None and len(_shape(init_pe)) == 3 else None
    params = fix_old_checkpoints(load_npz(init_file), model_posemb_len=posemb_len)
    if isinstance(params.get("Transformer"), dict):
        convert = pyloop_to_scan if model_cfg.get("scan") else scan_to_pyloop
        params = convert(params)
    patterns = _compile(dont_load)

    def skipped(name: str) -> bool:
        return any(p.fullmatch(name) for p in patterns)

    _check_against_config(params, model_cfg, skipped, init_file)

    if init_params is None:
        flat = flatten(params)
        _raise_problems(init_file, [f"non-finite values at {k!r}: {n} of {np.size(v)} entries are "
                                    "NaN/Inf" for k, v in flat.items() if (n := _non_finite(v))])
        return unflatten({k: np.asarray(v) for k, v in flat.items()})

    merged = flatten(merge_params(params, init_params, dont_load, source=init_file))
    flat_init = flatten(init_params)
    out = {}
    for name, value in merged.items():
        init_val = flat_init[name]
        if skipped(name):  # Init value, untouched (could be a jax array or a ShapeDtypeStruct).
            out[name] = np.asarray(init_val) if hasattr(init_val, "__array__") else init_val
            continue
        value = np.asarray(value)
        if _is_posemb(name) and value.shape != _shape(init_val):
            try:
                value = resample_posemb(value, _shape(init_val))
            except CheckpointError as e:
                raise CheckpointError(f"checkpoint '{init_file}': cannot resample {name!r}: "
                                      f"{e}") from e
        out[name] = value.astype(_dtype(init_val), copy=False)
    return unflatten(out)
