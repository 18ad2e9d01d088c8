"""A timm VisionTransformer state dict in big_vision's layout: a cls token or none, registers,
a position table with or without the prefix tokens, LayerScale, and 'token' / 'map' / 'avg'
pooling.

A timm file stores no number of heads: `--num_heads`, else its config.json's model_args, else
the size its architecture name says (`vit_small_...`: 6). What big_vision's ViT cannot compute
(a pre-norm, q/k norms, BEiT biases, a SwiGLU MLP, a norm after pooling) is refused by name.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

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

# timm architecture names -> heads (their width is in the weights, their heads are not).
_SIZE_HEADS = {"tiny": 3, "small": 6, "medium": 8, "base": 12, "large": 16, "so400m": 16}
_SIZE_HEADS.update({"huge": 16, "giant": 16, "gigantic": 16})
# What big_vision's ViT has no place for: a tensor name matching one is refused, saying what.
_UNSUPPORTED = (
    (r"norm_pre\..*", "a pre-norm before the blocks (CLIP-style norm_pre)"),
    (r"blocks\.\d+\.attn\.[qk]_norm\..*", "q/k normalisation (qk_norm)"),
    (r"blocks\.\d+\.attn\.[qv]_bias", "BEiT-style separate q/v biases"),
    (r"blocks\.\d+\.mlp\.(fc1_g|w12|norm)\..*", "a SwiGLU / normed MLP"),
    (r"fc_norm\..*", "a LayerNorm after pooling (fc_norm, timm's avg pool)"),
)
# The source's name of each block piece (foreign_layout.block), under `blocks.{i}.`.
_BLOCK = dict(
    ln0="norm1",
    ln1="norm2",
    qkv="attn.qkv",
    out="attn.proj",
    fc1="mlp.fc1",
    fc2="mlp.fc2",
    ls1="ls1.gamma",
    ls2="ls2.gamma",
)
_POOL_TYPES = {"token": "tok", "map": "map", "avg": "gap", "": "none"}


def from_timm(
    weights: str,
    tensors: Mapping[str, np.ndarray],
    config: dict[str, Any],
    num_heads: int | None,
    folder: str | None,
) -> Imported:
  """timm's `tensors` (read from `weights`, in `folder` when it has one, whose config.json is
  `config`, {} when none) in big_vision's layout; `num_heads` is import_weights' --num_heads."""
  source = folder or weights
  _refuse_unsupported(tensors, weights)
  t = Tensors(tensors, "", weights)
  w = t("patch_embed.proj.weight")
  width, patch = int(w.shape[0]), (int(w.shape[2]), int(w.shape[3]))
  heads = _heads(width, config, num_heads, source)
  depth = 1 + max(int(m.group(1)) for k in tensors if (m := re.match(r"blocks\.(\d+)\.", k)))
  args = config.get("model_args") or {}
  act = args.get("act_layer") or (
      "gelu_tanh" if "siglip" in str(config.get("architecture", "")) else "gelu"
  )
  gelu = gelu_approximate(str(act), source)

  emb = conv(w, t("patch_embed.proj.bias"))
  cls_tok, reg_tok, pos, grid = _prefix_tokens(t, weights)
  per_layer = [{k: f"blocks.{i}.{v}" for k, v in _BLOCK.items()} for i in range(depth)]
  blocks = [block(t, names, heads, qkv_packed=True) for names in per_layer]
  final = layer_norm(t("norm.weight"), t("norm.bias"))
  pool_type, pooling_head, head = _pooling(t, config, cls_tok is not None, heads, source)
  check_used(t, r"head_drop.*")

  params = params_tree(emb, cls_tok, reg_tok, pos, blocks, final, head, pooling_head)
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
      gelu_approximate=gelu,
      layernorm_epsilon=1e-6,
      reg_tokens=0 if reg_tok is None else int(reg_tok.shape[1]),
      posemb_grid=grid,
  )
  return Imported(
      params,
      arch,
      _preprocessing(config),
      "torch_bicubic_antialias",
      f"timm:{config.get('architecture', 'VisionTransformer')}",
      source,
  )


def _refuse_unsupported(tensors: Mapping[str, np.ndarray], weights: str) -> None:
  for pattern, what in _UNSUPPORTED:
    hit = next((k for k in tensors if re.fullmatch(pattern, k)), None)
    if hit:
      raise CheckpointError(
          f"checkpoint '{weights}': {hit!r}: {what} has no place in a big_vision ViT"
      )


def _heads(width: int, config: dict[str, Any], num_heads: int | None, source: str) -> int:
  """timm's heads: --num_heads, else config.json's model_args, else the architecture's size name.
  A --num_heads that contradicts model_args is refused (the import would write a model whose
  outputs differ from the source's); one that overrides a size name's heads is said."""
  declared = _declared_heads(config)
  if num_heads:
    check_heads(width, int(num_heads), source, None)
    if declared and declared[0] != int(num_heads):
      heads, where, explicit = declared
      if explicit:
        refuse_contradiction(int(num_heads), heads, where, source)
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
    check_heads(width, heads, source, where + hint)
    return heads
  name = str(config.get("architecture", ""))
  why = f"its architecture {name!r} names no known size" if name else "no config.json says"
  raise CheckpointError(
      f"checkpoint '{source}': a timm state dict does not store its number of heads and {why}; "
      "convert it with `python -m linvit_jax.models.import_weights SRC OUT.npz --num_heads N` and use "
      "OUT.npz"
  )


def _declared_heads(config: dict[str, Any]) -> tuple[int, str, bool] | None:
  """(heads, where the source says so, whether the file's own config says it rather than timm's
  size name) from a timm config.json, or None when it does not say."""
  args = config.get("model_args") or {}
  if args.get("num_heads"):
    return int(args["num_heads"]), "config.json: model_args.num_heads", True
  name = str(config.get("architecture", ""))
  m = re.match(r"vit_([a-z0-9]+)_", name)
  if m and m.group(1) in _SIZE_HEADS:
    size = m.group(1)
    return (
        _SIZE_HEADS[size],
        f"timm's '{size}' size, named by config.json's architecture {name!r}",
        False,
    )
  return None


def _prefix_tokens(t: Tensors, weights: str):
  """(cls token or None, registers [1, R, D] or None, patch position table, its grid): each
  prefix token's position (when the table has them) folded into the token."""
  prefix = [
      x for x in (t("cls_token", optional=True), t("reg_token", optional=True)) if x is not None
  ]
  has_cls = t.has("cls_token")
  # Split registers back out: [cls, reg...] share one prefix list for the position fold.
  flat_prefix = [p[:, i : i + 1] for p in prefix for i in range(p.shape[1])]
  pos, folded, grid = posemb_and_prefix(t("pos_embed"), flat_prefix, weights)
  cls_tok = folded[0] if has_cls else None
  regs = folded[1:] if has_cls else folded
  reg_tok = np.concatenate(regs, axis=1) if regs else None
  return cls_tok, reg_tok, pos, grid


def _pooling(t: Tensors, config: dict[str, Any], has_cls: bool, heads: int, source: str):
  """(big_vision pool_type, MAP head or None, classifier or None): config.json's global_pool,
  else 'token' with a cls token and 'avg' without; an attention pool makes it 'map'."""
  pooling_head = head = None
  pool = config.get("global_pool") or ("token" if has_cls else "avg")
  if t.has("attn_pool.latent"):
    pooling_head = _map_head_of(t, heads)
    pool = "map"
  if t.has("head.weight"):
    head = dense(t("head.weight"), t("head.bias"))
  pool_type = _POOL_TYPES.get(pool)
  if pool_type is None or (pool_type == "tok" and not has_cls):
    raise CheckpointError(
        f"checkpoint '{source}': timm global_pool {pool!r} is not one of token, map, avg"
    )
  if pool_type == "gap" and has_cls:
    raise CheckpointError(
        f"checkpoint '{source}': global_pool 'avg' with a cls token; big_vision's gap "
        "model has none"
    )
  return pool_type, pooling_head, head


def _map_head_of(t: Tensors, heads: int) -> dict[str, Any]:
  """timm's AttentionPoolLatent: a separate q, k and v packed in kv."""
  latent = t("attn_pool.latent")
  if latent.shape[1] != 1:
    raise CheckpointError(
        f"checkpoint '{t.source}': attn_pool.latent has {latent.shape[1]} queries; big_vision's "
        "MAP head has one"
    )
  kv, kv_b = pair(t, "attn_pool.kv", optional_bias=True)
  d = kv.shape[1]
  k, v = (
      (kv[i * d : (i + 1) * d], None if kv_b is None else kv_b[i * d : (i + 1) * d])
      for i in range(2)
  )
  return map_head(
      heads,
      latent,
      pair(t, "attn_pool.q", optional_bias=True),
      k,
      v,
      pair(t, "attn_pool.proj"),
      pair(t, "attn_pool.norm"),
      pair(t, "attn_pool.mlp.fc1"),
      pair(t, "attn_pool.mlp.fc2"),
  )


def _preprocessing(config: dict[str, Any]) -> dict[str, list[float]] | None:
  """The input normalisation of config.json's pretrained_cfg, None when it says none."""
  pcfg = config.get("pretrained_cfg") or {}
  if "mean" in pcfg and "std" in pcfg:
    return {"mean": list(map(float, pcfg["mean"])), "std": list(map(float, pcfg["std"]))}
  return None
