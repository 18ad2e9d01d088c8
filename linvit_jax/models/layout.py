"""The encoder's layout: per-block or scanned, block i's params, the attention module's name,
its sub-modules' names, and the path regexes built from them.

A big_vision ViT stores its encoder either as `Transformer/encoderblock_{i}` (python loop) or as one
`Transformer/encoderblock` whose leaves carry a leading depth axis (`scan=True`). Every module that
reaches into a block (losses, evaluation, surgery, checkpoints, the hybrid swap) or matches its
paths (trainable masks, surgery rules, LoRA and sharding patterns) asks here.
No jax at module level: the checkpoint readers (numpy-only) use the names too.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
  from linvit_jax.models import attention as attn_lib

# big_vision's module names inside Transformer/.
ATTN = "MultiHeadDotProductAttention_0"
SCANNED_BLOCK = "encoderblock"

# The sub-modules of ATTN. Every attention (softmax or linear, teacher or student) has the
# projections, with flax MHA's names and shapes; only a linear attention has the rest, so a softmax
# teacher never holds them (surgery keeps the student's init there). `LEVER_MODULES` are the
# AttentionSpec levers that own params: conv_v's depthwise conv, and the exact-set gate, named
# "window" when a window is on, else "sinks". A module attention.py adds must be listed here (tests/
# test_layout.py fails otherwise), or the trainable masks and surgery rules would miss it.
PROJECTIONS = ("query", "key", "value", "out")
FEATURE_MAPS = ("feature_map_q", "feature_map_k")
LEVER_MODULES = ("conv_v", "window", "sinks")
LINEAR_ONLY = FEATURE_MAPS + LEVER_MODULES

Params = Mapping[str, Any]


# ------------------------------------------------------------------------------------------------
# Path regexes (re.fullmatch on '/'-joined paths from the params' root), built from the names above
# so that masks, surgery rules, LoRA and sharding rules cannot drift from the model.


def one_of(names: Sequence[str]) -> str:
  """A regex group that matches exactly one of `names` (literally)."""
  return "(" + "|".join(re.escape(n) for n in names) + ")"


# A block of either layout: block i of a per-block tree, or the scanned tree's one stacked block.
BLOCK_RE = rf"Transformer/{SCANNED_BLOCK}(_\d+)?"
# A block of a per-block tree (surgery views a scanned tree as per-block before it matches).
PER_BLOCK_RE = rf"Transformer/{SCANNED_BLOCK}_\d+"
# Every leaf path of a scanned encoder starts so (its leaves carry the leading depth axis).
SCANNED_PREFIX = f"Transformer/{SCANNED_BLOCK}/"


def attention_re(modules: Sequence[str] | None = None, *, per_block: bool = False) -> str:
  """Every leaf under the encoder's attention modules, or only under its sub-modules `modules`
  (e.g. PROJECTIONS). `per_block`: only per-block paths (`PER_BLOCK_RE`), else either layout."""
  attn = f"{PER_BLOCK_RE if per_block else BLOCK_RE}/{ATTN}"
  return f"{attn}/.*" if modules is None else f"{attn}/{one_of(modules)}/.*"


def block_name(layer: int) -> str:
  """A per-block tree's name of block `layer`."""
  return f"{SCANNED_BLOCK}_{layer}"


def block_path(layer: int) -> str:
  """The path of block `layer` of a per-block tree, from the params' root."""
  return f"Transformer/{block_name(layer)}"


def is_scanned(params: Params) -> bool:
  """Whether the encoder's blocks are stacked on a leading depth axis (`scan=True`)."""
  return SCANNED_BLOCK in params["Transformer"]


def depth_axes(path: str) -> int:
  """1 for a leaf of a scanned encoder (`Transformer/encoderblock/...`: a leading depth axis that
  stacks the layers), else 0. `path` is the '/'-joined path from the params' root."""
  return 1 if path.startswith(SCANNED_PREFIX) else 0


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
