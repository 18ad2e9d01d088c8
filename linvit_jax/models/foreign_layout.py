"""What every foreign ViT converter shares: `Imported` (a source in big_vision's layout), and the
pieces that put torch tensors in big_vision's places.

torch's Linear is [out, in], a flax Dense kernel [in, out]; attention kernels are split per head
([D, H, Dh], [H, Dh, D]); what big_vision has no slot for is folded exactly (LayerScale γ into the
out projection and the second MLP dense; a prefix token's position embedding into the token).
`Tensors` reads a source's tensors by name and says which it did not use; `check_heads` and
`refuse_contradiction` word the heads errors of both families (models/foreign_hf.py,
models/foreign_timm.py).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from linvit_jax.models import layout
from linvit_jax.models.checkpoints import CheckpointError
from linvit_jax.models.checkpoints import unflatten

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
# torch tensors -> big_vision leaves.


def dense(w: np.ndarray, b: np.ndarray | None) -> dict[str, np.ndarray]:
  """A torch Linear [out, in] as a flax Dense (kernel [in, out]; no bias: zeros)."""
  return {"kernel": w.T, "bias": b if b is not None else np.zeros(w.shape[0], w.dtype)}


def heads_in(w: np.ndarray, b: np.ndarray | None, heads: int) -> dict[str, np.ndarray]:
  """q/k/v: [H·Dh, D] -> kernel [D, H, Dh], bias [H, Dh]."""
  d_out, d_in = w.shape
  b = b if b is not None else np.zeros(d_out, w.dtype)
  return {"kernel": w.T.reshape(d_in, heads, d_out // heads), "bias": b.reshape(heads, -1)}


def heads_out(w: np.ndarray, b: np.ndarray, heads: int, gamma=None) -> dict[str, np.ndarray]:
  """out projection: [D, H·Dh] -> kernel [H, Dh, D]; LayerScale γ folded: γ·(Wx + b)."""
  d_out, d_in = w.shape
  kernel, bias = w.T.reshape(heads, d_in // heads, d_out), b
  if gamma is not None:
    kernel, bias = _fold(kernel, gamma), bias * gamma
  return {"kernel": kernel, "bias": bias}


def _fold(kernel: np.ndarray, gamma: np.ndarray) -> np.ndarray:
  return (kernel.astype(np.float64) * gamma.astype(np.float64)).astype(kernel.dtype)


def layer_norm(w: np.ndarray, b: np.ndarray) -> dict[str, np.ndarray]:
  """A torch LayerNorm (weight, bias) as flax's (scale, bias)."""
  return {"scale": w, "bias": b}


def conv(w: np.ndarray, b: np.ndarray) -> dict[str, np.ndarray]:
  """The patch embedding: torch's Conv2d [D, C, kh, kw] as flax's Conv [kh, kw, C, D]."""
  return {"kernel": np.transpose(w, (2, 3, 1, 0)), "bias": b}


class Tensors:
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


def posemb_and_prefix(pos: np.ndarray, prefix: list[np.ndarray], source: str):
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


def params_tree(
    emb, cls_tok, reg_tok, pos, blocks, final_norm, head=None, map_head=None, pre_logits=None
) -> dict[str, Any]:
  """The nested big_vision params of a ViT from its converted pieces (None: the model has none)."""
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


def block(t: Tensors, names: dict[str, str], heads: int, qkv_packed: bool) -> dict[str, Any]:
  """One pre-LN block from a dict of the source's names for each piece."""
  attn = layout.ATTN
  out: dict[str, Any] = {
      "LayerNorm_0": layer_norm(t(names["ln0"] + ".weight"), t(names["ln0"] + ".bias")),
      "LayerNorm_1": layer_norm(t(names["ln1"] + ".weight"), t(names["ln1"] + ".bias")),
  }
  if qkv_packed:
    w, b = t(names["qkv"] + ".weight"), t(names["qkv"] + ".bias", optional=True)
    d = w.shape[1]
    for j, name in enumerate(("query", "key", "value")):
      out[f"{attn}/{name}"] = heads_in(
          w[j * d : (j + 1) * d], None if b is None else b[j * d : (j + 1) * d], heads
      )
  else:
    for name in ("query", "key", "value"):
      out[f"{attn}/{name}"] = heads_in(
          t(names[name] + ".weight"), t(names[name] + ".bias", optional=True), heads
      )
  g1 = t(names["ls1"], optional=True) if "ls1" in names else None
  g2 = t(names["ls2"], optional=True) if "ls2" in names else None
  out[f"{attn}/out"] = heads_out(t(names["out"] + ".weight"), t(names["out"] + ".bias"), heads, g1)
  out["MlpBlock_0/Dense_0"] = dense(t(names["fc1"] + ".weight"), t(names["fc1"] + ".bias"))
  fc2 = dense(t(names["fc2"] + ".weight"), t(names["fc2"] + ".bias"))
  if g2 is not None:
    fc2 = {"kernel": _fold(fc2["kernel"], g2), "bias": fc2["bias"] * g2}
  out["MlpBlock_0/Dense_1"] = fc2
  return out


def check_used(t: Tensors, ignore: str) -> None:
  """Tensors the mapping did not read mean an architecture piece we would silently drop."""
  left = sorted(k for k in t.tensors if k.startswith(t.prefix) and k not in t.used)
  left = [k for k in left if not re.fullmatch(ignore, k[len(t.prefix) :])]
  if left:
    raise CheckpointError(
        f"checkpoint '{t.source}': tensors with no place in a big_vision ViT: "
        f"{', '.join(left[:6])}{' …' if len(left) > 6 else ''} (an architecture this importer "
        "does not convert; nothing was written)"
    )


def gelu_approximate(act: str, source: str) -> bool:
  """vit.Model's `gelu_approximate` for a source's activation name; not a GELU is refused."""
  if act not in _GELU_FORMS:
    raise CheckpointError(
        f"checkpoint '{source}': activation {act!r} is not a GELU; the ViT here supports "
        f"{sorted(_GELU_FORMS)}"
    )
  return _GELU_FORMS[act]


def map_head(heads: int, probe, q, k, v, out, ln, fc1, fc2) -> dict[str, Any]:
  """big_vision's MAPHead from (weight, bias) pairs of torch layout ([out, in])."""
  attn = layout.ATTN
  return {
      "probe": probe,
      f"{attn}/query": heads_in(*q, heads),
      f"{attn}/key": heads_in(*k, heads),
      f"{attn}/value": heads_in(*v, heads),
      f"{attn}/out": heads_out(*out, heads),
      "LayerNorm_0": layer_norm(*ln),
      "MlpBlock_0/Dense_0": dense(*fc1),
      "MlpBlock_0/Dense_1": dense(*fc2),
  }


def pair(t: Tensors, name: str, optional_bias: bool = False) -> tuple[np.ndarray, Any]:
  """(weight, bias) of the torch layer `name`."""
  return t(name + ".weight"), t(name + ".bias", optional=optional_bias)


def check_heads(width: int, heads: int, source: str, given_by: str | None) -> None:
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


def refuse_contradiction(given: int, declared: int, where: str, source: str) -> None:
  """A --num_heads other than the heads the source's own config declares is refused."""
  raise CheckpointError(
      f"--num_heads {given} contradicts '{source}', which declares {declared} heads ({where}): "
      "the imported model would compute something else; drop --num_heads"
  )
