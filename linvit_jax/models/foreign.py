"""ViT weights from the PyTorch ecosystem, read without torch, in big_vision's layout.

Sources (`read(path)`): a Hugging Face model folder (config.json + model.safetensors, sharded or
not) or a timm folder (config.json with `architecture` + model.safetensors), or a bare
`.safetensors` file (its family told by its tensor names), or a hub name for either folder
(`hf:facebook/dinov2-small`, `timm:vit_small_patch14_dinov2`: huggingface_hub's cache). Families:

  Hugging Face  Dinov2Model, Dinov2WithRegistersModel, ViTModel / ViTForImageClassification
                (DeiT published as ViT), DeiTModel (its distillation token a register),
                SiglipVisionModel (and the vision tower of a SiglipModel), with a MAP head.
  timm          VisionTransformer state dicts: cls token or none, registers, position embedding
                with or without the prefix tokens, LayerScale, 'token' / 'map' / 'avg' pooling.

What big_vision has no slot for is folded exactly: LayerScale γ into the out projection and the
second MLP dense (γ·(Wx + b)); a prefix token's position embedding into the token itself (it is a
constant). Each source's position table is kept at its own grid and resampled the way the source
framework does at run time (torch's bicubic, with or without antialias) when the model's grid
differs. The architecture, GELU form, LayerNorm epsilon and input normalisation are read from the
source's config.json / preprocessor_config.json where it ships them.

Anything else (a ConvNeXt folder, a pickle `.pth`, a SwiGLU MLP, missing tensors, a config that
disagrees with the weights) is a `CheckpointError` naming the file and what is wrong.
"""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import math
import os
import re
import struct
from collections.abc import Mapping
from typing import Any

import ml_dtypes
import numpy as np

from linvit_jax.models import hub
from linvit_jax.models import layout
from linvit_jax.models.checkpoints import CheckpointError
from linvit_jax.models.checkpoints import unflatten
from linvit_jax.runtime import gfile

PICKLE_SUFFIXES = (".pth", ".pt", ".bin", ".ckpt", ".pkl")
HF_FAMILIES = (
    "dinov2",
    "dinov2_with_registers",
    "vit",
    "deit",
    "siglip_vision_model",
    "siglip",
)
# Hugging Face `hidden_act` / timm `act_layer` -> gelu_approximate.
_GELU_FORMS = {
    "gelu": False,
    "gelu_python": False,
    "gelu_new": True,
    "gelu_pytorch_tanh": True,
    "gelu_fast": True,
    "gelu_tanh": True,
    "approx_gelu": True,
}
# timm architecture names -> heads (their width is in the weights, their heads are not).
_TIMM_HEADS = {"tiny": 3, "small": 6, "medium": 8, "base": 12, "large": 16, "so400m": 16}
_TIMM_HEADS.update({"huge": 16, "giant": 16, "gigantic": 16})


@dataclasses.dataclass(frozen=True)
class Imported:
  """A foreign checkpoint in big_vision's layout.

  params: nested big_vision params (numpy, float32 or the source dtype), position table at the
    source's own grid. arch: `vit.Model` fields (plus `posemb_grid`, `image_size` where known).
  preprocessing: {"mean": [..], "std": [..]} on 0..1 pixels, or None when the source says nothing.
  posemb_resample: 'torch_bicubic' | 'torch_bicubic_antialias': how the source framework resizes
  its position table for another resolution. family, source: for messages and model cards.
  """

  params: dict[str, Any]
  arch: dict[str, Any]
  preprocessing: dict[str, list[float]] | None
  posemb_resample: str
  family: str
  source: str


# ------------------------------------------------------------------------------------------------
# Reading files.


def is_foreign(path: str) -> bool:
  """Whether `path` is for this module: a local folder, a .safetensors file, a pickle file or a
  hub name (`hf:org/name`, `timm:name`: linvit_jax.models.hub)."""
  if hub.is_hub_name(path):
    return True
  if "://" in path:
    return False
  base = path.split(":", 1)[0] if not os.path.exists(path) else path
  return (
      os.path.isdir(base)
      or base.endswith(".safetensors")
      or base.endswith(PICKLE_SUFFIXES)
      or _is_torch_zip(base)
  )


def _is_torch_zip(path: str) -> bool:
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


_ST_DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "BF16": ml_dtypes.bfloat16,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.bool_,
}


def read_safetensors(path: str) -> dict[str, np.ndarray]:
  """All tensors of one .safetensors file (its format is an 8-byte header size, a JSON header of
  dtype/shape/offsets, then raw little-endian data), bfloat16 included, torch-free."""
  try:
    raw = gfile.read_bytes(path)
  except OSError as e:
    raise CheckpointError(f"checkpoint '{path}': cannot read it ({e.strerror or e})") from e
  if len(raw) < 8:
    raise CheckpointError(f"checkpoint '{path}': truncated, not a .safetensors file")
  (size,) = struct.unpack("<Q", raw[:8])
  try:
    header = json.loads(raw[8 : 8 + size])
  except (ValueError, UnicodeDecodeError) as e:
    raise CheckpointError(f"checkpoint '{path}': not a .safetensors file (bad header: {e})") from e
  base = 8 + size
  out = {}
  for name, info in header.items():
    if name == "__metadata__":
      continue
    dtype = _ST_DTYPES.get(info.get("dtype"))
    if dtype is None:
      raise CheckpointError(
          f"checkpoint '{path}': tensor {name!r} has dtype {info.get('dtype')!r}, "
          f"not one of {sorted(_ST_DTYPES)}"
      )
    start, end = info["data_offsets"]
    if base + end > len(raw):
      raise CheckpointError(f"checkpoint '{path}': truncated (tensor {name!r} runs past the end)")
    a = np.frombuffer(
        raw, dtype=dtype, count=(end - start) // np.dtype(dtype).itemsize, offset=base + start
    )
    out[name] = a.reshape(info["shape"]).copy()
  return out


def _read_folder_tensors(folder: str) -> tuple[dict[str, np.ndarray], str]:
  """The weights of a Hugging Face / timm folder: model.safetensors or its sharded index."""
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
    _pickle_error(os.path.join(folder, pickles[0]))
  raise CheckpointError(
      f"checkpoint '{folder}': a folder without model.safetensors (or its sharded index); "
      f"it holds: {', '.join(sorted(os.listdir(folder))[:8]) or 'nothing'}"
  )


def _pickle_error(path: str) -> None:
  raise CheckpointError(
      f"checkpoint '{path}': a PyTorch pickle file, which is not read here (it can run code); "
      'turn it into safetensors first, e.g. `python -c "import torch, safetensors.torch as st; '
      f"st.save_file(torch.load('{os.path.basename(path)}', map_location='cpu'), "
      "'model.safetensors')\"` (a state dict), or `model.save_pretrained(dir)` for Hugging Face"
  )


def _read_json(path: str) -> dict[str, Any] | None:
  if not os.path.exists(path):
    return None
  try:
    return json.loads(gfile.read_bytes(path))
  except ValueError as e:
    raise CheckpointError(f"'{path}': not valid JSON ({e})") from e


# ------------------------------------------------------------------------------------------------
# Tensor layout helpers (torch Linear is [out, in]; flax Dense kernels are [in, out]).


def _dense(w: np.ndarray, b: np.ndarray | None) -> dict[str, np.ndarray]:
  return {"kernel": w.T, "bias": b if b is not None else np.zeros(w.shape[0], w.dtype)}


def _heads_in(w: np.ndarray, b: np.ndarray | None, heads: int) -> dict[str, np.ndarray]:
  """q/k/v: [H·Dh, D] -> kernel [D, H, Dh], bias [H, Dh]."""
  d_out, d_in = w.shape
  b = b if b is not None else np.zeros(d_out, w.dtype)
  return {"kernel": w.T.reshape(d_in, heads, d_out // heads), "bias": b.reshape(heads, -1)}


def _heads_out(w: np.ndarray, b: np.ndarray, heads: int, gamma=None) -> dict[str, np.ndarray]:
  """out projection: [D, H·Dh] -> kernel [H, Dh, D]; LayerScale γ folded: γ·(Wx + b)."""
  d_out, d_in = w.shape
  kernel, bias = w.T.reshape(heads, d_in // heads, d_out), b
  if gamma is not None:
    kernel, bias = _fold(kernel, gamma), bias * gamma
  return {"kernel": kernel, "bias": bias}


def _fold(kernel: np.ndarray, gamma: np.ndarray) -> np.ndarray:
  return (kernel.astype(np.float64) * gamma.astype(np.float64)).astype(kernel.dtype)


def _ln(w: np.ndarray, b: np.ndarray) -> dict[str, np.ndarray]:
  return {"scale": w, "bias": b}


def _conv(w: np.ndarray, b: np.ndarray) -> dict[str, np.ndarray]:
  return {"kernel": np.transpose(w, (2, 3, 1, 0)), "bias": b}  # [D, C, kh, kw] -> [kh, kw, C, D]


class _Tensors:
  """Named tensors under a prefix; a missing one is an error naming the file and the tensor."""

  def __init__(self, tensors: Mapping[str, np.ndarray], prefix: str, source: str):
    self.tensors, self.prefix, self.source = tensors, prefix, source
    self.used: set[str] = set()

  def has(self, name: str) -> bool:
    return self.prefix + name in self.tensors

  def __call__(self, name: str, optional: bool = False) -> np.ndarray | None:
    key = self.prefix + name
    if key not in self.tensors:
      if optional:
        return None
      raise CheckpointError(f"checkpoint '{self.source}': missing tensor {key!r}")
    self.used.add(key)
    return np.asarray(self.tensors[key])

  def check_shape(self, name: str, expected: tuple[int, ...], what: str) -> None:
    got = tuple(self(name).shape)
    if got != tuple(expected):
      raise CheckpointError(
          f"checkpoint '{self.source}': {self.prefix + name!r} has shape {got}, but {what} "
          f"says {tuple(expected)}"
      )


def _posemb_and_prefix(pos: np.ndarray, prefix: list[np.ndarray], source: str):
  """Splits a [1, P + G·G, D] table into the patch table and per-prefix-token additions.

  P is 0 (no prefix token has a position: timm's no_embed_class) or the number of prefix tokens.
  """
  n = pos.shape[1]
  for p in (len(prefix), 0):
    side = math.isqrt(n - p)
    if side * side == n - p:
      tokens = [t + pos[:, i : i + 1] for i, t in enumerate(prefix)] if p else list(prefix)
      return pos[:, p:], tokens, (side, side)
  raise CheckpointError(
      f"checkpoint '{source}': position table of {n} entries is neither a square grid nor "
      f"{len(prefix)} prefix token(s) + a square grid"
  )


def _params(
    emb, cls_tok, reg_tok, pos, blocks, final_norm, head=None, map_head=None, pre_logits=None
) -> dict[str, Any]:
  flat: dict[str, Any] = {}
  for k, v in emb.items():
    flat[f"embedding/{k}"] = v
  if cls_tok is not None:
    flat["cls"] = cls_tok
  if reg_tok is not None:
    flat["reg"] = reg_tok
  flat["pos_embedding"] = pos
  for i, block in enumerate(blocks):
    for sub, leaves in block.items():
      for k, v in leaves.items():
        flat[f"Transformer/{layout.block_name(i)}/{sub}/{k}"] = v
  for k, v in final_norm.items():
    flat[f"Transformer/encoder_norm/{k}"] = v
  for k, v in (head or {}).items():
    flat[f"head/{k}"] = v
  for k, v in (pre_logits or {}).items():
    flat[f"pre_logits/{k}"] = v
  for sub, leaves in (map_head or {}).items():
    if sub == "probe":
      flat["MAPHead_0/probe"] = leaves
      continue
    for k, v in leaves.items():
      flat[f"MAPHead_0/{sub}/{k}"] = v
  return unflatten(flat)


def _block(t: _Tensors, names: dict[str, str], heads: int, qkv_packed: bool) -> dict[str, Any]:
  """One pre-LN block from a dict of the source's names for each piece."""
  attn = layout.ATTN
  out: dict[str, Any] = {
      "LayerNorm_0": _ln(t(names["ln0"] + ".weight"), t(names["ln0"] + ".bias")),
      "LayerNorm_1": _ln(t(names["ln1"] + ".weight"), t(names["ln1"] + ".bias")),
  }
  if qkv_packed:
    w, b = t(names["qkv"] + ".weight"), t(names["qkv"] + ".bias", optional=True)
    d = w.shape[1]
    for j, name in enumerate(("query", "key", "value")):
      out[f"{attn}/{name}"] = _heads_in(
          w[j * d : (j + 1) * d], None if b is None else b[j * d : (j + 1) * d], heads
      )
  else:
    for name in ("query", "key", "value"):
      out[f"{attn}/{name}"] = _heads_in(
          t(names[name] + ".weight"), t(names[name] + ".bias", optional=True), heads
      )
  g1 = t(names["ls1"], optional=True) if "ls1" in names else None
  g2 = t(names["ls2"], optional=True) if "ls2" in names else None
  out[f"{attn}/out"] = _heads_out(t(names["out"] + ".weight"), t(names["out"] + ".bias"), heads, g1)
  out["MlpBlock_0/Dense_0"] = _dense(t(names["fc1"] + ".weight"), t(names["fc1"] + ".bias"))
  fc2 = _dense(t(names["fc2"] + ".weight"), t(names["fc2"] + ".bias"))
  if g2 is not None:
    fc2 = {"kernel": _fold(fc2["kernel"], g2), "bias": fc2["bias"] * g2}
  out["MlpBlock_0/Dense_1"] = fc2
  return out


def _check_used(t: _Tensors, ignore: str) -> None:
  """Tensors the mapping did not read mean an architecture piece we would silently drop."""
  left = sorted(k for k in t.tensors if k.startswith(t.prefix) and k not in t.used)
  left = [k for k in left if not re.fullmatch(ignore, k[len(t.prefix) :])]
  if left:
    raise CheckpointError(
        f"checkpoint '{t.source}': tensors with no place in a big_vision ViT: "
        f"{', '.join(left[:6])}{' …' if len(left) > 6 else ''} (an architecture this importer "
        "does not convert; nothing was written)"
    )


def _gelu(act: str, source: str) -> bool:
  if act not in _GELU_FORMS:
    raise CheckpointError(
        f"checkpoint '{source}': activation {act!r} is not a GELU; the ViT here supports "
        f"{sorted(_GELU_FORMS)}"
    )
  return _GELU_FORMS[act]


# ------------------------------------------------------------------------------------------------
# Hugging Face.


def _hf_prefix(tensors: Mapping[str, np.ndarray], stem: str) -> str:
  for k in tensors:
    if k.endswith(stem) and (k == stem or k.endswith("." + stem)):
      return k[: -len(stem)]
  return ""


def _from_hf(folder: str, config: dict[str, Any]) -> Imported:
  kind = config.get("model_type", "")
  arch_names = config.get("architectures") or [kind]
  if kind not in HF_FAMILIES:
    raise CheckpointError(
        f"checkpoint '{folder}': a Hugging Face {arch_names[0]} (model_type {kind!r}), not a "
        f"ViT this importer knows; supported model types: {', '.join(HF_FAMILIES)}"
    )
  if kind == "siglip":
    config = dict(config.get("vision_config") or {}, model_type="siglip_vision_model")
  tensors, weights = _read_folder_tensors(folder)
  siglip = kind.startswith("siglip")
  stem = (
      "embeddings.patch_embedding.weight"
      if siglip
      else "embeddings.patch_embeddings.projection.weight"
  )
  if siglip and not any(k.endswith(stem) for k in tensors):
    raise CheckpointError(f"checkpoint '{weights}': no SigLIP vision tower ({stem!r} not found)")
  prefix = _hf_prefix(tensors, stem)
  if siglip and kind == "siglip" and not prefix.endswith("vision_model."):
    prefix = "vision_model."
  t = _Tensors(tensors, prefix, weights)
  width, heads, depth = (
      config["hidden_size"],
      config["num_attention_heads"],
      config["num_hidden_layers"],
  )
  patch = config["patch_size"]
  t.check_shape(stem, (width, config.get("num_channels", 3), patch, patch), "config.json")
  _check_heads(width, int(heads), folder, "config.json's num_attention_heads")
  gelu_approximate = _gelu(config.get("hidden_act", "gelu"), os.path.join(folder, "config.json"))
  eps = float(config.get("layer_norm_eps", 1e-12))
  if config.get("use_swiglu_ffn"):
    raise CheckpointError(
        f"checkpoint '{folder}': use_swiglu_ffn=true (DINOv2-g's SwiGLU MLP); the ViT here has a "
        "GELU MLP"
    )

  if siglip:
    emb = _conv(t("embeddings.patch_embedding.weight"), t("embeddings.patch_embedding.bias"))
    pos, prefix_tokens, grid = _posemb_and_prefix(
        t("embeddings.position_embedding.weight")[None], [], weights
    )
    cls_tok = reg_tok = None
    layer = "encoder.layers.{i}."
    names = dict(
        ln0="layer_norm1",
        ln1="layer_norm2",
        query="self_attn.q_proj",
        key="self_attn.k_proj",
        value="self_attn.v_proj",
        out="self_attn.out_proj",
        fc1="mlp.fc1",
        fc2="mlp.fc2",
    )
    final = _ln(t("post_layernorm.weight"), t("post_layernorm.bias"))
  else:
    emb = _conv(
        t("embeddings.patch_embeddings.projection.weight"),
        t("embeddings.patch_embeddings.projection.bias"),
    )
    prefix_list = [t("embeddings.cls_token")]
    if kind == "deit":
      prefix_list.append(t("embeddings.distillation_token"))
    pos, prefix_tokens, grid = _posemb_and_prefix(
        t("embeddings.position_embeddings"), prefix_list, weights
    )
    cls_tok = prefix_tokens[0]
    regs = prefix_tokens[1:]
    if kind == "dinov2_with_registers":
      regs.append(t("embeddings.register_tokens"))  # registers carry no position
    reg_tok = np.concatenate(regs, axis=1) if regs else None
    layer = "encoder.layer.{i}."
    names = dict(
        query="attention.attention.query",
        key="attention.attention.key",
        value="attention.attention.value",
        out="attention.output.dense",
    )
    if kind.startswith("dinov2"):
      names.update(
          ln0="norm1",
          ln1="norm2",
          fc1="mlp.fc1",
          fc2="mlp.fc2",
          ls1="layer_scale1.lambda1",
          ls2="layer_scale2.lambda1",
      )
    else:
      names.update(
          ln0="layernorm_before",
          ln1="layernorm_after",
          fc1="intermediate.dense",
          fc2="output.dense",
      )
    final = _ln(t("layernorm.weight"), t("layernorm.bias"))
  blocks = [
      _block(t, {k: layer.format(i=i) + v for k, v in names.items()}, heads, qkv_packed=False)
      for i in range(depth)
  ]
  if t.has(layer.format(i=depth) + names["ln0"] + ".weight"):
    raise CheckpointError(f"checkpoint '{weights}': more blocks than num_hidden_layers={depth}")

  map_head = head = pre_logits = None
  pool = "map" if siglip else "tok"
  if siglip:
    if config.get("vision_use_head", True) and t.has("head.probe"):
      map_head = _hf_map_head(t, heads)
    else:
      pool = "gap"  # SiglipVisionModel without a head: users mean-pool the tokens
  outer = _Tensors(tensors, "", weights)  # heads of *ForImageClassification sit outside prefix
  if outer.has("classifier.weight"):
    head = _dense(outer("classifier.weight"), outer("classifier.bias"))
  if not siglip and t.has("pooler.dense.weight"):
    pre_logits = _dense(t("pooler.dense.weight"), t("pooler.dense.bias"))
  ignore = r"embeddings\.mask_token"
  _check_used(t, ignore)

  params = _params(emb, cls_tok, reg_tok, pos, blocks, final, head, map_head, pre_logits)
  mlp_dim = int(blocks[0]["MlpBlock_0/Dense_0"]["kernel"].shape[1])
  arch = dict(
      patch_size=(patch, patch),
      width=width,
      depth=depth,
      num_heads=heads,
      mlp_dim=mlp_dim,
      posemb="learn",
      pool_type=pool,
      num_classes=int(head["kernel"].shape[1]) if head else None,
      rep_size=int(pre_logits["kernel"].shape[1]) if pre_logits else False,
      gelu_approximate=gelu_approximate,
      layernorm_epsilon=eps,
      reg_tokens=0 if reg_tok is None else int(reg_tok.shape[1]),
      posemb_grid=grid,
  )
  pre = _read_json(os.path.join(folder, "preprocessor_config.json"))
  preprocessing = None
  if pre and pre.get("do_normalize", True) and "image_mean" in pre:
    preprocessing = {
        "mean": list(map(float, pre["image_mean"])),
        "std": list(map(float, pre["image_std"])),
    }
  antialias = kind == "dinov2_with_registers"
  return Imported(
      params,
      arch,
      preprocessing,
      "torch_bicubic_antialias" if antialias else "torch_bicubic",
      f"huggingface:{arch_names[0]}",
      folder,
  )


def _map_head(heads: int, probe, q, k, v, out, ln, fc1, fc2) -> dict[str, Any]:
  """big_vision's MAPHead from (weight, bias) pairs of torch layout ([out, in])."""
  attn = layout.ATTN
  return {
      "probe": probe,
      f"{attn}/query": _heads_in(*q, heads),
      f"{attn}/key": _heads_in(*k, heads),
      f"{attn}/value": _heads_in(*v, heads),
      f"{attn}/out": _heads_out(*out, heads),
      "LayerNorm_0": _ln(*ln),
      "MlpBlock_0/Dense_0": _dense(*fc1),
      "MlpBlock_0/Dense_1": _dense(*fc2),
  }


def _pair(t: _Tensors, name: str, optional_bias: bool = False) -> tuple[np.ndarray, Any]:
  return t(name + ".weight"), t(name + ".bias", optional=optional_bias)


def _hf_map_head(t: _Tensors, heads: int) -> dict[str, Any]:
  """SiglipMultiheadAttentionPoolingHead: torch's MultiheadAttention packs q/k/v in in_proj."""
  w, b = t("head.attention.in_proj_weight"), t("head.attention.in_proj_bias")
  d = w.shape[1]
  q, k, v = ((w[i * d : (i + 1) * d], b[i * d : (i + 1) * d]) for i in range(3))
  return _map_head(
      heads,
      t("head.probe"),
      q,
      k,
      v,
      _pair(t, "head.attention.out_proj"),
      _pair(t, "head.layernorm"),
      _pair(t, "head.mlp.fc1"),
      _pair(t, "head.mlp.fc2"),
  )


# ------------------------------------------------------------------------------------------------
# timm.


def _check_heads(width: int, heads: int, source: str, given_by: str | None) -> None:
  """Raises one line when `heads` cannot split `width`, before a reshape says it less clearly.

  given_by: where `heads` came from (a config field, a size name), or None when the caller passed
  it (import_weights' --num_heads, the only shape a user chooses).
  """
  if heads >= 1 and width % heads == 0:
    return
  if given_by is None:
    raise CheckpointError(
        f"--num_heads {heads} does not fit '{source}': its width {width} is not a multiple of "
        f"{heads} (heads that fit: {_divisors(width)})"
    )
  raise CheckpointError(
      f"checkpoint '{source}': width {width} is not a multiple of {heads} heads ({given_by})"
  )


def _divisors(n: int) -> str:
  # Up to 32, as a real ViT's heads are (1152 has 30 divisors, most of them absurd as heads).
  small = ", ".join(str(d) for d in range(1, min(n, 32) + 1) if n % d == 0)
  return small + (", …" if n > 32 else "")


def _declared_timm_heads(config: dict[str, Any]) -> tuple[int, str, bool] | None:
  """(heads, where the source says so, whether the file's own config says it rather than timm's
  size name) from a timm config.json, or None when it does not say."""
  args = config.get("model_args") or {}
  if args.get("num_heads"):
    return int(args["num_heads"]), "config.json: model_args.num_heads", True
  name = str(config.get("architecture", ""))
  m = re.match(r"vit_([a-z0-9]+)_", name)
  if m and m.group(1) in _TIMM_HEADS:
    size = m.group(1)
    return (
        _TIMM_HEADS[size],
        f"timm's '{size}' size, named by config.json's architecture {name!r}",
        False,
    )
  return None


def _contradicts(given: int, declared: int, where: str, source: str) -> None:
  raise CheckpointError(
      f"--num_heads {given} contradicts '{source}', which declares {declared} heads ({where}): "
      "the imported model would compute something else; drop --num_heads"
  )


def _timm_heads(width: int, config: dict[str, Any], num_heads: int | None, source: str) -> int:
  """timm's heads: --num_heads, else config.json's model_args, else the architecture's size name.
  A --num_heads that contradicts model_args is refused (the import would write a model whose
  outputs differ from the source's); one that overrides a size name's heads is said."""
  declared = _declared_timm_heads(config)
  if num_heads:
    _check_heads(width, int(num_heads), source, None)
    if declared and declared[0] != int(num_heads):
      heads, where, explicit = declared
      if explicit:
        _contradicts(int(num_heads), heads, where, source)
      if width % heads == 0:  # a size name is timm's convention, not the file's own word
        logging.warning("--num_heads %d overrides the %d heads of %s", num_heads, heads, where)
    return int(num_heads)
  if declared:
    heads, where, explicit = declared
    hint = (
        ""
        if explicit
        else (
            f", has {heads}; no model_args.num_heads says otherwise: pass --num_heads N to "
            "import_weights"
        )
    )
    _check_heads(width, heads, source, where + hint)
    return heads
  name = str(config.get("architecture", ""))
  why = f"its architecture {name!r} names no known size" if name else "no config.json says"
  raise CheckpointError(
      f"checkpoint '{source}': a timm state dict does not store its number of heads and {why}; "
      "convert it with `python -m linvit_jax.models.import_weights SRC OUT.npz --num_heads N` and use "
      "OUT.npz"
  )


def _from_timm(
    weights: str,
    tensors: Mapping[str, np.ndarray],
    config: dict[str, Any],
    num_heads: int | None,
    folder: str | None,
) -> Imported:
  t = _Tensors(tensors, "", weights)
  for bad, what in (
      (r"norm_pre\..*", "a pre-norm before the blocks (CLIP-style norm_pre)"),
      (r"blocks\.\d+\.attn\.[qk]_norm\..*", "q/k normalisation (qk_norm)"),
      (r"blocks\.\d+\.attn\.[qv]_bias", "BEiT-style separate q/v biases"),
      (r"blocks\.\d+\.mlp\.(fc1_g|w12|norm)\..*", "a SwiGLU / normed MLP"),
      (r"fc_norm\..*", "a LayerNorm after pooling (fc_norm, timm's avg pool)"),
  ):
    hit = next((k for k in tensors if re.fullmatch(bad, k)), None)
    if hit:
      raise CheckpointError(
          f"checkpoint '{weights}': {hit!r}: {what} has no place in a big_vision ViT"
      )
  w = t("patch_embed.proj.weight")
  width, patch = int(w.shape[0]), (int(w.shape[2]), int(w.shape[3]))
  heads = _timm_heads(width, config, num_heads, folder or weights)
  depth = 1 + max(int(m.group(1)) for k in tensors if (m := re.match(r"blocks\.(\d+)\.", k)))
  args = config.get("model_args") or {}
  act = args.get("act_layer") or (
      "gelu_tanh" if "siglip" in str(config.get("architecture", "")) else "gelu"
  )
  gelu_approximate = _gelu(str(act), folder or weights)

  emb = _conv(w, t("patch_embed.proj.bias"))
  prefix = [
      x for x in (t("cls_token", optional=True), t("reg_token", optional=True)) if x is not None
  ]
  has_cls = t.has("cls_token")
  # Split registers back out: [cls, reg...] share one prefix list for the position fold.
  flat_prefix = [p[:, i : i + 1] for p in prefix for i in range(p.shape[1])]
  pos, folded, grid = _posemb_and_prefix(t("pos_embed"), flat_prefix, weights)
  cls_tok = folded[0] if has_cls else None
  regs = folded[1:] if has_cls else folded
  reg_tok = np.concatenate(regs, axis=1) if regs else None

  names = dict(
      ln0="norm1",
      ln1="norm2",
      qkv="attn.qkv",
      out="attn.proj",
      fc1="mlp.fc1",
      fc2="mlp.fc2",
      ls1="ls1.gamma",
      ls2="ls2.gamma",
  )
  blocks = [
      _block(t, {k: f"blocks.{i}.{v}" for k, v in names.items()}, heads, qkv_packed=True)
      for i in range(depth)
  ]
  final = _ln(t("norm.weight"), t("norm.bias"))
  map_head = head = None
  pool = config.get("global_pool") or ("token" if has_cls else "avg")
  if t.has("attn_pool.latent"):
    map_head = _timm_map_head(t, heads)
    pool = "map"
  if t.has("head.weight"):
    head = _dense(t("head.weight"), t("head.bias"))
  pool_type = {"token": "tok", "map": "map", "avg": "gap", "": "none"}.get(pool)
  if pool_type is None or (pool_type == "tok" and not has_cls):
    raise CheckpointError(
        f"checkpoint '{folder or weights}': timm global_pool {pool!r} is not one of token, map, avg"
    )
  if pool_type == "gap" and has_cls:
    raise CheckpointError(
        f"checkpoint '{folder or weights}': global_pool 'avg' with a cls token; big_vision's gap "
        "model has none"
    )
  _check_used(t, r"head_drop.*")

  params = _params(emb, cls_tok, reg_tok, pos, blocks, final, head, map_head)
  arch = dict(
      patch_size=patch,
      width=width,
      depth=depth,
      num_heads=heads,
      mlp_dim=int(blocks[0]["MlpBlock_0/Dense_0"]["kernel"].shape[1]),
      posemb="learn",
      pool_type=pool_type,
      num_classes=int(head["kernel"].shape[1]) if head else None,
      rep_size=False,
      gelu_approximate=gelu_approximate,
      layernorm_epsilon=1e-6,
      reg_tokens=0 if reg_tok is None else int(reg_tok.shape[1]),
      posemb_grid=grid,
  )
  pcfg = config.get("pretrained_cfg") or {}
  preprocessing = None
  if "mean" in pcfg and "std" in pcfg:
    preprocessing = {"mean": list(map(float, pcfg["mean"])), "std": list(map(float, pcfg["std"]))}
  return Imported(
      params,
      arch,
      preprocessing,
      "torch_bicubic_antialias",
      f"timm:{config.get('architecture', 'VisionTransformer')}",
      folder or weights,
  )


def _timm_map_head(t: _Tensors, heads: int) -> dict[str, Any]:
  """timm's AttentionPoolLatent: a separate q, k and v packed in kv."""
  latent = t("attn_pool.latent")
  if latent.shape[1] != 1:
    raise CheckpointError(
        f"checkpoint '{t.source}': attn_pool.latent has {latent.shape[1]} queries; big_vision's "
        "MAP head has one"
    )
  kv, kv_b = _pair(t, "attn_pool.kv", optional_bias=True)
  d = kv.shape[1]
  k, v = (
      (kv[i * d : (i + 1) * d], None if kv_b is None else kv_b[i * d : (i + 1) * d])
      for i in range(2)
  )
  return _map_head(
      heads,
      latent,
      _pair(t, "attn_pool.q", optional_bias=True),
      k,
      v,
      _pair(t, "attn_pool.proj"),
      _pair(t, "attn_pool.norm"),
      _pair(t, "attn_pool.mlp.fc1"),
      _pair(t, "attn_pool.mlp.fc2"),
  )


# ------------------------------------------------------------------------------------------------
# The one entry point.


def _check_hf_heads(config: dict[str, Any], num_heads: int | None, source: str) -> None:
  """A Hugging Face config always declares its heads: a --num_heads other than those is refused."""
  vision = config.get("vision_config") if isinstance(config.get("vision_config"), dict) else config
  declared = vision.get("num_attention_heads")
  if num_heads and declared and int(declared) != int(num_heads):
    _contradicts(int(num_heads), int(declared), "config.json: num_attention_heads", source)


def read(path: str, num_heads: int | None = None) -> Imported:
  """A Hugging Face / timm folder or a .safetensors file, in big_vision's layout (see module doc).

  A hub name (`hf:facebook/dinov2-small`, `timm:vit_small_patch14_dinov2`) is read from the folder
  huggingface_hub caches it in (linvit_jax.models.hub.resolve: downloaded when not cached and online).
  """
  if hub.is_hub_name(path):
    path = hub.resolve(path)
  if not os.path.exists(path):
    raise CheckpointError(f"checkpoint '{path}': file not found (cwd {os.getcwd()!r})")
  if path.endswith(PICKLE_SUFFIXES) or _is_torch_zip(path):
    _pickle_error(path)
  if os.path.isdir(path):
    config = _read_json(os.path.join(path, "config.json"))
    if config is None:
      raise CheckpointError(
          f"checkpoint '{path}': a folder without config.json (a Hugging Face or timm model "
          "folder has one; a big_vision checkpoint is an .npz file)"
      )
    if "model_type" in config:
      _check_hf_heads(config, num_heads, path)
      return _from_hf(path, config)
    if "architecture" in config:
      tensors, weights = _read_folder_tensors(path)
      return _from_timm(weights, tensors, config, num_heads, path)
    raise CheckpointError(
        f"checkpoint '{path}/config.json': neither a Hugging Face config (model_type) nor a "
        "timm one (architecture)"
    )
  beside = _read_json(os.path.join(os.path.dirname(os.path.abspath(path)), "config.json"))
  if beside and "model_type" in beside:
    _check_hf_heads(beside, num_heads, path)
    return _from_hf(os.path.dirname(os.path.abspath(path)), beside)
  tensors = read_safetensors(path)
  if "patch_embed.proj.weight" in tensors:
    timm_config = beside if beside and "architecture" in beside else {}
    return _from_timm(path, tensors, timm_config, num_heads, None)
  if any(
      k.endswith(("patch_embeddings.projection.weight", "patch_embedding.weight")) for k in tensors
  ):
    raise CheckpointError(
        f"checkpoint '{path}': Hugging Face weights without their config.json; pass the model "
        "folder (config.json + model.safetensors) instead"
    )
  raise CheckpointError(
      f"checkpoint '{path}': no ViT patch embedding (neither timm's 'patch_embed.proj.weight' "
      f"nor Hugging Face's); tensors start with: {', '.join(sorted(tensors)[:4])}"
  )


# ------------------------------------------------------------------------------------------------
# Position tables resized as torch does (F.interpolate, mode='bicubic', align_corners=False).


def _cubic(x: np.ndarray, a: float) -> np.ndarray:
  x = np.abs(x)
  return np.where(
      x < 1,
      ((a + 2) * x - (a + 3)) * x * x + 1,
      np.where(x < 2, (((x - 5) * x + 8) * x - 4) * a, 0.0),
  )


def _torch_bicubic_matrix(n_in: int, n_out: int, antialias: bool) -> np.ndarray:
  """[n_out, n_in] weights of torch's 1-d bicubic resize (separable, so 2-d is two of these)."""
  m = np.zeros((n_out, n_in))
  scale = n_in / n_out
  if not antialias:  # aten upsample_bicubic2d: a = -0.75, 4 taps, clamped at the border
    for i in range(n_out):
      real = (i + 0.5) * scale - 0.5
      x0 = math.floor(real)
      t = real - x0
      for j, w in zip(range(x0 - 1, x0 + 3), _cubic(np.array([t + 1, t, 1 - t, 2 - t]), -0.75)):
        m[i, min(max(j, 0), n_in - 1)] += w
    return m
  # aten _upsample_bicubic2d_aa (PIL's filter): a = -0.5, support widened when shrinking.
  support = 2.0 * scale if scale >= 1 else 2.0
  inv = 1.0 / scale if scale >= 1 else 1.0
  for i in range(n_out):
    center = scale * (i + 0.5)
    lo = max(int(center - support + 0.5), 0)
    hi = min(int(center + support + 0.5), n_in)
    w = _cubic((np.arange(lo, hi) - center + 0.5) * inv, -0.5)
    m[i, lo:hi] = w / w.sum()
  return m


def resample_posemb_torch(
    posemb: np.ndarray, new_grid: tuple[int, int], antialias: bool
) -> np.ndarray:
  """[1, h·w, D] (square h = w) -> [1, H·W, D] as torch's bicubic interpolate, in float64."""
  n, d = posemb.shape[1], posemb.shape[2]
  side = math.isqrt(n)
  if side * side != n:
    raise CheckpointError(f"position table of {n} entries is not a square grid")
  grid = posemb.reshape(side, side, d).astype(np.float64)
  my = _torch_bicubic_matrix(side, new_grid[0], antialias)
  mx = _torch_bicubic_matrix(side, new_grid[1], antialias)
  out = np.einsum("ij,jkd,lk->ild", my, grid, mx)
  return out.reshape(1, new_grid[0] * new_grid[1], d).astype(posemb.dtype)


RESAMPLERS = ("torch_bicubic", "torch_bicubic_antialias", "big_vision")


def sidecar_path(npz_path: str) -> str:
  """Where `write_npz` puts what an .npz cannot hold: `x.npz` -> `x.json`."""
  return os.path.splitext(npz_path)[0] + ".json"


def sidecar_info(imported: Imported) -> dict[str, Any]:
  arch = {k: (list(v) if isinstance(v, tuple) else v) for k, v in imported.arch.items()}
  return {
      "format": "big_vision params-only npz, written by linvit_jax.models.import_weights",
      "source": imported.source,
      "family": imported.family,
      "model_config": arch,
      "preprocessing": imported.preprocessing,
      "posemb_resample": imported.posemb_resample,
  }
