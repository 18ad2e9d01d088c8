"""A Hugging Face ViT folder in big_vision's layout: Dinov2Model, Dinov2WithRegistersModel,
ViTModel / ViTForImageClassification (DeiT published as ViT), DeiTModel (its distillation token a
register), SiglipVisionModel (and the vision tower of a SiglipModel) with its MAP head.

`from_hf` reads the folder's config.json (already parsed), its weights (models/foreign_files.py)
and preprocessor_config.json, in that order, and maps every tensor onto a big_vision name
(models/foreign_layout.py); a tensor left over is an error, not a silent drop.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from linvit_jax.models import foreign_files
from linvit_jax.models.checkpoints import CheckpointError
from linvit_jax.models.foreign_layout import Imported
from linvit_jax.models.foreign_layout import Tensors
from linvit_jax.models.foreign_layout import block
from linvit_jax.models.foreign_layout import check_heads
from linvit_jax.models.foreign_layout import check_used
from linvit_jax.models.foreign_layout import conv
from linvit_jax.models.foreign_layout import dense
from linvit_jax.models.foreign_layout import gelu_approximate
from linvit_jax.models.foreign_layout import layer_norm
from linvit_jax.models.foreign_layout import map_head
from linvit_jax.models.foreign_layout import pair
from linvit_jax.models.foreign_layout import params_tree
from linvit_jax.models.foreign_layout import posemb_and_prefix
from linvit_jax.models.foreign_layout import refuse_contradiction

FAMILIES = (
    "dinov2",
    "dinov2_with_registers",
    "vit",
    "deit",
    "siglip_vision_model",
    "siglip",
)
_SIGLIP_BLOCK = dict(
    ln0="layer_norm1",
    ln1="layer_norm2",
    query="self_attn.q_proj",
    key="self_attn.k_proj",
    value="self_attn.v_proj",
    out="self_attn.out_proj",
    fc1="mlp.fc1",
    fc2="mlp.fc2",
)
_VIT_ATTENTION = dict(
    query="attention.attention.query",
    key="attention.attention.key",
    value="attention.attention.value",
    out="attention.output.dense",
)
_DINOV2_BLOCK = dict(
    _VIT_ATTENTION,
    ln0="norm1",
    ln1="norm2",
    fc1="mlp.fc1",
    fc2="mlp.fc2",
    ls1="layer_scale1.lambda1",
    ls2="layer_scale2.lambda1",
)
_VIT_BLOCK = dict(
    _VIT_ATTENTION,
    ln0="layernorm_before",
    ln1="layernorm_after",
    fc1="intermediate.dense",
    fc2="output.dense",
)


@dataclasses.dataclass(frozen=True)
class _Trunk:
  """What the embeddings and the final norm give, and where the blocks' tensors are named."""

  emb: dict[str, np.ndarray]
  cls_tok: np.ndarray | None
  reg_tok: np.ndarray | None
  pos: np.ndarray
  grid: tuple[int, int]
  layer: str  # the prefix of block i's tensor names, formatted with i
  names: dict[str, str]  # the source's name of each block piece (foreign_layout.block)
  final: dict[str, np.ndarray]


def check_heads_declared(config: dict[str, Any], num_heads: int | None, source: str) -> None:
  """A Hugging Face config always declares its heads: a --num_heads other than those is refused."""
  vision = config.get("vision_config") if isinstance(config.get("vision_config"), dict) else config
  declared = vision.get("num_attention_heads")
  if num_heads and declared and int(declared) != int(num_heads):
    refuse_contradiction(int(num_heads), int(declared), "config.json: num_attention_heads", source)


def from_hf(folder: str, config: dict[str, Any]) -> Imported:
  """The Hugging Face model in `folder` (whose config.json is `config`) in big_vision's layout."""
  kind, arch_name, config = _family(folder, config)
  t, tensors, weights, stem = _weights(folder, kind)
  width, heads, depth, patch, gelu = _checked_config(t, stem, config, folder)
  trunk = _siglip_trunk(t, weights) if kind.startswith("siglip") else _vit_trunk(t, kind, weights)
  per_layer = [
      {k: trunk.layer.format(i=i) + v for k, v in trunk.names.items()} for i in range(depth)
  ]
  blocks = [block(t, names, heads, qkv_packed=False) for names in per_layer]
  if t.has(trunk.layer.format(i=depth) + trunk.names["ln0"] + ".weight"):
    raise CheckpointError(f"checkpoint '{weights}': more blocks than num_hidden_layers={depth}")
  pool, pooling_head, head, pre_logits = _heads(t, tensors, weights, config, kind, heads)
  check_used(t, r"embeddings\.mask_token")

  params = params_tree(
      trunk.emb,
      trunk.cls_tok,
      trunk.reg_tok,
      trunk.pos,
      blocks,
      trunk.final,
      head,
      pooling_head,
      pre_logits,
  )
  arch = dict(
      patch_size=(patch, patch),
      width=width,
      depth=depth,
      num_heads=heads,
      mlp_dim=int(blocks[0]["MlpBlock_0/Dense_0"]["kernel"].shape[1]),
      posemb="learn",
      pool_type=pool,
      num_classes=int(head["kernel"].shape[1]) if head else None,
      rep_size=int(pre_logits["kernel"].shape[1]) if pre_logits else False,
      gelu_approximate=gelu,
      layernorm_epsilon=float(config.get("layer_norm_eps", 1e-12)),
      reg_tokens=0 if trunk.reg_tok is None else int(trunk.reg_tok.shape[1]),
      posemb_grid=trunk.grid,
  )
  antialias = kind == "dinov2_with_registers"
  return Imported(
      params,
      arch,
      _preprocessing(folder),
      "torch_bicubic_antialias" if antialias else "torch_bicubic",
      f"huggingface:{arch_name}",
      folder,
  )


def _family(folder: str, config: dict[str, Any]) -> tuple[str, str, dict[str, Any]]:
  """(model_type, architecture name, the config of the vision model): a SiglipModel's is its
  vision_config."""
  kind = config.get("model_type", "")
  arch_names = config.get("architectures") or [kind]
  if kind not in FAMILIES:
    raise CheckpointError(
        f"checkpoint '{folder}': a Hugging Face {arch_names[0]} (model_type {kind!r}), not a "
        f"ViT this importer knows; supported model types: {', '.join(FAMILIES)}"
    )
  if kind == "siglip":
    config = dict(config.get("vision_config") or {}, model_type="siglip_vision_model")
  return kind, arch_names[0], config


def _weights(folder: str, kind: str) -> tuple[Tensors, dict[str, np.ndarray], str, str]:
  """The folder's tensors read under the vision model's prefix (`vit.`, `vision_model.`, ...),
  all of them, the weights file named in messages, and the patch embedding's name."""
  tensors, weights = foreign_files.read_folder_tensors(folder)
  siglip = kind.startswith("siglip")
  stem = (
      "embeddings.patch_embedding.weight"
      if siglip
      else "embeddings.patch_embeddings.projection.weight"
  )
  if siglip and not any(k.endswith(stem) for k in tensors):
    raise CheckpointError(f"checkpoint '{weights}': no SigLIP vision tower ({stem!r} not found)")
  prefix = _prefix_of(tensors, stem)
  if kind == "siglip" and not prefix.endswith("vision_model."):
    prefix = "vision_model."
  return Tensors(tensors, prefix, weights), tensors, weights, stem


def _checked_config(
    t: Tensors, stem: str, config: dict[str, Any], folder: str
) -> tuple[int, int, int, int, bool]:
  """(width, heads, depth, patch, gelu_approximate) from config.json, checked against the patch
  embedding's shape, before any block is read; a SwiGLU MLP is refused."""
  width, heads, depth = (
      config["hidden_size"],
      config["num_attention_heads"],
      config["num_hidden_layers"],
  )
  patch = config["patch_size"]
  t.check_shape(stem, (width, config.get("num_channels", 3), patch, patch), "config.json")
  check_heads(width, int(heads), folder, "config.json's num_attention_heads")
  gelu = gelu_approximate(config.get("hidden_act", "gelu"), os.path.join(folder, "config.json"))
  if config.get("use_swiglu_ffn"):
    raise CheckpointError(
        f"checkpoint '{folder}': use_swiglu_ffn=true (DINOv2-g's SwiGLU MLP); the ViT here has a "
        "GELU MLP"
    )
  return width, heads, depth, patch, gelu


def _prefix_of(tensors: Mapping[str, np.ndarray], stem: str) -> str:
  for k in tensors:
    if k.endswith(stem) and (k == stem or k.endswith("." + stem)):
      return k[: -len(stem)]
  return ""


def _siglip_trunk(t: Tensors, weights: str) -> _Trunk:
  """SigLIP: no prefix token; every patch has a position."""
  emb = conv(t("embeddings.patch_embedding.weight"), t("embeddings.patch_embedding.bias"))
  pos, _, grid = posemb_and_prefix(t("embeddings.position_embedding.weight")[None], [], weights)
  final = layer_norm(t("post_layernorm.weight"), t("post_layernorm.bias"))
  return _Trunk(emb, None, None, pos, grid, "encoder.layers.{i}.", _SIGLIP_BLOCK, final)


def _vit_trunk(t: Tensors, kind: str, weights: str) -> _Trunk:
  """ViT / DeiT / DINOv2: a cls token; DeiT's distillation token and DINOv2's registers become
  big_vision's `reg` (the first with its position folded in, registers have none)."""
  emb = conv(
      t("embeddings.patch_embeddings.projection.weight"),
      t("embeddings.patch_embeddings.projection.bias"),
  )
  prefix_list = [t("embeddings.cls_token")]
  if kind == "deit":
    prefix_list.append(t("embeddings.distillation_token"))
  pos, prefix_tokens, grid = posemb_and_prefix(
      t("embeddings.position_embeddings"), prefix_list, weights
  )
  regs = prefix_tokens[1:]
  if kind == "dinov2_with_registers":
    regs.append(t("embeddings.register_tokens"))  # registers carry no position
  reg_tok = np.concatenate(regs, axis=1) if regs else None
  names = _DINOV2_BLOCK if kind.startswith("dinov2") else _VIT_BLOCK
  final = layer_norm(t("layernorm.weight"), t("layernorm.bias"))
  return _Trunk(emb, prefix_tokens[0], reg_tok, pos, grid, "encoder.layer.{i}.", names, final)


def _heads(
    t: Tensors,
    tensors: Mapping[str, np.ndarray],
    weights: str,
    config: dict[str, Any],
    kind: str,
    heads: int,
) -> tuple[str, dict[str, Any] | None, dict[str, Any] | None, dict[str, Any] | None]:
  """(pool_type, MAP head, classifier, pre-logits): SigLIP pools with its MAP head (or, without
  one, by the mean); a *ForImageClassification's classifier sits outside the vision prefix."""
  siglip = kind.startswith("siglip")
  pooling_head = head = pre_logits = None
  pool = "map" if siglip else "tok"
  if siglip:
    if config.get("vision_use_head", True) and t.has("head.probe"):
      pooling_head = _siglip_map_head(t, heads)
    else:
      pool = "gap"  # SiglipVisionModel without a head: users mean-pool the tokens
  outer = Tensors(tensors, "", weights)
  if outer.has("classifier.weight"):
    head = dense(outer("classifier.weight"), outer("classifier.bias"))
  if not siglip and t.has("pooler.dense.weight"):
    pre_logits = dense(t("pooler.dense.weight"), t("pooler.dense.bias"))
  return pool, pooling_head, head, pre_logits


def _siglip_map_head(t: Tensors, heads: int) -> dict[str, Any]:
  """SiglipMultiheadAttentionPoolingHead: torch's MultiheadAttention packs q/k/v in in_proj."""
  w, b = t("head.attention.in_proj_weight"), t("head.attention.in_proj_bias")
  d = w.shape[1]
  q, k, v = ((w[i * d : (i + 1) * d], b[i * d : (i + 1) * d]) for i in range(3))
  return map_head(
      heads,
      t("head.probe"),
      q,
      k,
      v,
      pair(t, "head.attention.out_proj"),
      pair(t, "head.layernorm"),
      pair(t, "head.mlp.fc1"),
      pair(t, "head.mlp.fc2"),
  )


def _preprocessing(folder: str) -> dict[str, list[float]] | None:
  """The input normalisation preprocessor_config.json declares, None when it says none."""
  pre = foreign_files.read_json(os.path.join(folder, "preprocessor_config.json"))
  if pre and pre.get("do_normalize", True) and "image_mean" in pre:
    return {"mean": list(map(float, pre["image_mean"])), "std": list(map(float, pre["image_std"]))}
  return None
