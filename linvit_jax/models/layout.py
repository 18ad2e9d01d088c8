"""The encoder's layout: per-block or scanned, block i's params, the attention module's name.

A big_vision ViT stores its encoder either as `Transformer/encoderblock_{i}` (python loop) or as one
`Transformer/encoderblock` whose leaves carry a leading depth axis (`scan=True`). Every module that
reaches into a block (losses, evaluation, surgery, checkpoints, the hybrid swap) asks here.
No jax at module level: the checkpoint readers (numpy-only) use the names too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
  from linvit_jax.models import attention as attn_lib

# big_vision's module names inside Transformer/.
ATTN = "MultiHeadDotProductAttention_0"
SCANNED_BLOCK = "encoderblock"

Params = Mapping[str, Any]


def block_name(layer: int) -> str:
  """A per-block tree's name of block `layer`."""
  return f"{SCANNED_BLOCK}_{layer}"


def is_scanned(params: Params) -> bool:
  """Whether the encoder's blocks are stacked on a leading depth axis (`scan=True`)."""
  return SCANNED_BLOCK in params["Transformer"]


def depth_axes(path: str) -> int:
  """1 for a leaf of a scanned encoder (`Transformer/encoderblock/...`: a leading depth axis that
  stacks the layers), else 0. `path` is the '/'-joined path from the params' root."""
  return 1 if path.startswith(f"Transformer/{SCANNED_BLOCK}/") else 0


def block_params(params: Params, layer: int) -> Params:
  """Block `layer`'s params subtree, from a per-block or scanned (stacked) tree."""
  t = params["Transformer"]
  if SCANNED_BLOCK in t:
    import jax

    return jax.tree.map(lambda x: x[layer], t[SCANNED_BLOCK])
  return t[block_name(layer)]


def block_names(params: Params) -> list[str]:
  """Per-block names of a params tree: encoderblock_0..L-1 (also for a scanned tree)."""
  t = params["Transformer"]
  if SCANNED_BLOCK in t:
    import jax

    depth = len(jax.tree.leaves(t[SCANNED_BLOCK])[0])
    return [block_name(i) for i in range(depth)]
  return sorted(
      (k for k in t if k.startswith(SCANNED_BLOCK + "_")), key=lambda k: int(k.split("_")[1])
  )


def attention_module(model: Any, spec: attn_lib.AttentionSpec) -> attn_lib.Attention:
  """One attention sublayer of `model` (a vit model) with operator `spec`, standalone: applied to
  a block's `ATTN` params it computes what that block's attention computes."""
  from linvit_jax.models import attention as attn_lib

  return attn_lib.Attention(
      num_heads=model.num_heads,
      spec=spec,
      dtype_mm=model.dtype_mm,
      num_prefix_tokens=model.num_prefix_tokens,
  )
