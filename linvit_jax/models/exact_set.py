"""The exact-set hybrid of a linear attention layer (the `window` and `sinks` levers): each query
row gets exact softmax over a small key set E(i) (the prefix tokens, the m largest-norm patch
keys, its w×w patch neighbourhood) and linear attention over the other keys, mixed by the linear
kernel's own estimate of E(i)'s mass shifted by a learned per-head logit (`exact_set_hybrid`).
O(N·(w² + m)); sums in float32. models/attention.py's `Attention` calls it.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from linvit_jax.models.attention_ops import center_keys
from linvit_jax.models.attention_ops import einsum_f32


def _shifted_views(x: jax.Array, prefix: int, window: int) -> list[jax.Array]:
  """x's patch tokens [B,N,H,E] shifted by each of the w×w offsets, as w² arrays [B,M,H,E]
  (M patches; zero outside the grid): slot o of patch i holds its o-th neighbour. Slices of one
  padded grid, which XLA fuses into the multiply-adds instead of materialising [B,M,w²,H,E]."""
  b, n, h, e = x.shape
  side = int(round((n - prefix) ** 0.5))
  if side * side != n - prefix:
    raise ValueError(f"attention window needs a square patch grid; got {n - prefix} patch tokens")
  r = window // 2
  grid = jnp.pad(
      x[:, prefix:].reshape(b, side, side, h, e), ((0, 0), (r, r), (r, r), (0, 0), (0, 0))
  )
  return [
      grid[:, i : i + side, j : j + side].reshape(b, side * side, h, e)
      for i in range(window)
      for j in range(window)
  ]


def _inside(n_patches: int, window: int) -> jax.Array:
  """Which of the w² neighbour slots of each patch lie inside the grid, [M, w²]."""
  side, r = int(round(n_patches**0.5)), window // 2
  inside = jnp.pad(jnp.ones((side, side), bool), r)
  masks = [inside[i : i + side, j : j + side] for i in range(window) for j in range(window)]
  return jnp.stack(masks, axis=-1).reshape(side * side, window * window)


@dataclasses.dataclass(frozen=True)
class _ExactPart:
  """One group of keys in the exact set of R query rows: scores s and linear-kernel products a
  [B,R,H,K] (s = -inf and a = 0 where a key is not in a row's set), and `mix(w)`: Σ_K w·v_K."""

  s: jax.Array
  a: jax.Array
  mix: Any


def _shared_part(qr, phi_qr, keys, values, phi_keys, valid=None) -> _ExactPart:
  """Keys shared by every row (prefix tokens; sinks, gathered per image and head), [B,K,H,·]."""
  scale = 1.0 / jnp.sqrt(jnp.asarray(qr.shape[-1], jnp.float32))
  s = jnp.einsum("bmhd,bphd->bmhp", qr, keys) * scale
  a = jnp.einsum("bmhf,bphf->bmhp", phi_qr, phi_keys)
  if valid is not None:
    s, a = jnp.where(valid, s, -jnp.inf), jnp.where(valid, a, 0.0)
  return _ExactPart(s, a, lambda w: jnp.einsum("bmhp,bphd->bmhd", w, values))


def _window_part(qr, phi_qr, k, v, phi_k, window, prefix) -> _ExactPart:
  """Each patch row's w×w neighbourhood (patch rows only)."""
  scale = 1.0 / jnp.sqrt(jnp.asarray(qr.shape[-1], jnp.float32))
  k_views = _shifted_views(k, prefix, window)
  v_views = _shifted_views(v, prefix, window)
  phik_views = _shifted_views(phi_k, prefix, window)
  inside = _inside(qr.shape[1], window)[None, :, None, :]  # [1, M, 1, w²]
  s = jnp.stack([jnp.sum(qr * kv, -1) for kv in k_views], axis=-1) * scale  # [B,M,H,w²]
  a = jnp.stack([jnp.sum(phi_qr * pk, -1) for pk in phik_views], axis=-1)
  return _ExactPart(
      jnp.where(inside, s, -jnp.inf),
      jnp.where(inside, a, 0.0),
      lambda w: sum(w[..., o, None] * vv for o, vv in enumerate(v_views)),
  )


def _hybrid_terms(phi_qr, phi_k, v, parts):
  """Per query row (float32): the exact set's softmax numerator/denominator (exp(s − max)), the
  linear numerator/denominator over every other key, and the linear kernel's mass on the exact
  set. Linear over the rest is every key's sum minus the exact set's (φ ≥ 0, so the difference
  is ≥ 0 up to rounding: clipped there)."""
  top = functools.reduce(
      jnp.maximum, [jnp.max(part.s, -1, keepdims=True, initial=-jnp.inf) for part in parts]
  )
  top = jax.lax.stop_gradient(top)
  e = [jnp.exp(part.s - top) for part in parts]
  soft_num = functools.reduce(jnp.add, [part.mix(w) for part, w in zip(parts, e)])
  soft_den = functools.reduce(jnp.add, [jnp.sum(w, -1) for w in e])
  kv = einsum_f32("bkhf,bkhd->bhfd", phi_k, v)
  lin_num = functools.reduce(
      jnp.subtract, [jnp.einsum("bmhf,bhfd->bmhd", phi_qr, kv)] + [p.mix(p.a) for p in parts]
  )
  lin_exact = functools.reduce(jnp.add, [jnp.sum(part.a, -1) for part in parts])
  lin_den = jnp.maximum(
      jnp.einsum("bmhf,bhf->bmh", phi_qr, jnp.sum(phi_k.astype(jnp.float32), axis=1)) - lin_exact,
      0.0,
  )
  return soft_num, soft_den, lin_num, lin_den, lin_exact


def sink_indices(k: jax.Array, prefix: int, m: int) -> jax.Array:
  """The m patch keys of largest norm per image and head, [B,m,H] (patch indices). Norms of the
  keys centred over tokens: a shift shared by all keys changes no attention weight, so it must
  not change which keys are sinks either. A discrete choice: no gradient."""
  n_patches = k.shape[1] - prefix
  if m > n_patches:
    raise ValueError(f"attention sinks={m} is more than the {n_patches} patch tokens")
  kp = jax.lax.stop_gradient(k[:, prefix:].astype(jnp.float32))
  norms = jnp.sum(jnp.square(center_keys(kp)), -1)  # [B,M,H]
  _, idx = jax.lax.top_k(jnp.moveaxis(norms, 1, -1), m)  # [B,H,m]
  return jnp.moveaxis(idx, -1, 1)


def _gather_patches(x: jax.Array, prefix: int, idx: jax.Array) -> jax.Array:
  return jnp.take_along_axis(x[:, prefix:], idx[..., None], axis=1)  # [B,m,H,E]


def _sink_part(qr, phi_qr, k, v, phi_k, prefix, idx, window=0) -> _ExactPart:
  """The sink keys for R rows; with a window (patch rows), a sink inside a row's window is left
  to the window part (counted once)."""
  keys, values, phi_keys = (_gather_patches(x, prefix, idx) for x in (k, v, phi_k))
  valid = None
  if window:
    side, r = int(round(qr.shape[1] ** 0.5)), window // 2
    q_row, q_col = np.divmod(np.arange(side * side), side)
    s_row, s_col = jnp.divmod(idx, side)  # [B,m,H]
    far_row = jnp.abs(q_row[None, :, None, None] - jnp.moveaxis(s_row, 1, -1)[:, None]) > r
    far_col = jnp.abs(q_col[None, :, None, None] - jnp.moveaxis(s_col, 1, -1)[:, None]) > r
    valid = far_row | far_col  # [B,M,H,m]
  return _shared_part(qr, phi_qr, keys, values, phi_keys, valid)


def _mix(terms, gate_bias, eps):
  soft_num, soft_den, lin_num, lin_rest, lin_exact = terms
  boost = jnp.exp(gate_bias.astype(jnp.float32))  # [H]
  alpha = lin_exact * boost / (lin_exact * boost + lin_rest + eps)  # [B,R,H]
  y = alpha[..., None] * soft_num / soft_den[..., None] + (1.0 - alpha[..., None]) * lin_num / (
      lin_rest[..., None] + eps
  )
  return y, alpha


def exact_set_hybrid(
    q, k, v, phi_q, phi_k, gate_bias, window: int, prefix: int, sinks: int, eps: float
) -> tuple[jax.Array, jax.Array | None, jax.Array]:
  """The hybrid rows of a layer with an exact key set, and the set's share of their attention
  mass per head [H] (mean over rows and images):

    y_i = α_i · softmax-average of v over E(i)  +  (1 − α_i) · linear average of v over the rest

  E(i): the prefix keys (cls, registers: DINOv2's sinks), the `sinks` patch keys of largest
  norm per image and head (`sink_indices`; O(N·m)), and for a patch row with `window` its w×w
  patch neighbourhood (O(N·w²)). α_i, the mass the exact set gets, is the linear kernel's own
  estimate Σ_{E(i)} φ(q_i)·φ(k_j) / Σ_all, shifted by a learned per-head logit b (α' =
  sigmoid(logit α + b), `WindowGate`, b = 0 at init): so at init the layer is its linear self
  with the exact set's weights made exact, and b → ∞ with E(i) = every key is softmax attention
  exactly. (LoLCATs instead adds exp(s − max) terms and φ products under one normaliser; with
  hedgehog-style maps, normalised per query, the two scales disagree per query: on the shared
  ViT-S/14 that form lowered final cls cosine from 0.93 to 0.70.) Sums in float32. The share
  says whether a hybrid learned to bypass its linear branch (arXiv 2510.05901).

  Returns (patch rows [B,M,H,D] or every row [B,N,H,D] without a window, prefix rows [B,P,H,D]
  with a window and sinks (else None: they stay linear), the share [H]).
  """
  f32 = jnp.float32
  q, k, v, phi_q, phi_k = (x.astype(f32) for x in (q, k, v, phi_q, phi_k))
  idx = sink_indices(k, prefix, sinks) if sinks else None

  def shared_parts(qr, phi_qr, with_window):
    parts = []
    if prefix:
      parts.append(_shared_part(qr, phi_qr, k[:, :prefix], v[:, :prefix], phi_k[:, :prefix]))
    if sinks:
      parts.append(_sink_part(qr, phi_qr, k, v, phi_k, prefix, idx, window if with_window else 0))
    return parts

  if not window:
    y, alpha = _mix(_hybrid_terms(phi_q, phi_k, v, shared_parts(q, phi_q, False)), gate_bias, eps)
    return y, None, jnp.mean(alpha, axis=(0, 1))
  qp, phi_qp = q[:, prefix:], phi_q[:, prefix:]
  parts = [_window_part(qp, phi_qp, k, v, phi_k, window, prefix)] + shared_parts(qp, phi_qp, True)
  y, alpha = _mix(_hybrid_terms(phi_qp, phi_k, v, parts), gate_bias, eps)
  y_pre = None
  if sinks and prefix:
    qr, phi_qr = q[:, :prefix], phi_q[:, :prefix]
    y_pre, alpha_pre = _mix(
        _hybrid_terms(phi_qr, phi_k, v, shared_parts(qr, phi_qr, False)), gate_bias, eps
    )
    alpha = jnp.concatenate([alpha_pre, alpha], axis=1)
  return y, y_pre, jnp.mean(alpha, axis=(0, 1))
