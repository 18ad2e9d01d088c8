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

from linvit_jax.models import grid_tiles
from linvit_jax.models.attention_ops import center_keys


@dataclasses.dataclass(frozen=True)
class _ExactPart:
  """One group of keys in the exact set of blocks of query rows [G,T,X] (G = images × heads,
  T blocks of X rows): scores s and linear-kernel products a [G,T,X,K] (s = -inf and a = 0 where a
  key is not in a row's set), and `mix(w)`: Σ_K w·v_K, [G,T,X,D]. Images and heads are one axis
  because XLA:CPU's reductions of a product are ~20x slower with a size-1 axis (batch 1); it
  leads, so every matmul here is a plain batched one."""

  s: jax.Array
  a: jax.Array
  mix: Any


def _heads_first(x: jax.Array) -> jax.Array:
  """Tokens [B,R,H,E] as [G,R,E], G = B·H."""
  return jnp.swapaxes(x, 1, 2).reshape(-1, x.shape[1], x.shape[3])


def _merge(x: jax.Array) -> jax.Array:
  """[B,H,...] as [G,...], G = B·H."""
  return x.reshape(-1, *x.shape[2:])


def _as_block(x: jax.Array) -> jax.Array:
  """Rows [B,R,H,E] as one block of rows [G,1,R,E]."""
  return _heads_first(x)[:, None]


def _shared_part(q_rows, phi_rows, keys, values, phi_keys, valid=None) -> _ExactPart:
  """Keys shared by every row (prefix tokens; sinks, gathered per image and head), [B,K,H,·];
  rows [G,T,X,·]."""
  scale = 1.0 / np.sqrt(q_rows.shape[-1])
  keys, values, phi_keys = (_heads_first(x) for x in (keys, values, phi_keys))
  s = jnp.einsum("gtxd,gkd->gtxk", q_rows, keys) * scale
  a = jnp.einsum("gtxf,gkf->gtxk", phi_rows, phi_keys)
  if valid is not None:
    s, a = jnp.where(valid, s, -jnp.inf), jnp.where(valid, a, 0.0)
  return _ExactPart(s, a, lambda w: jnp.einsum("gtxk,gkd->gtxd", w, values))


def _window_part(tiles: grid_tiles.Tiling, q_rows, phi_rows, kp, vp, phi_kp) -> _ExactPart:
  """Each patch row's w×w neighbourhood: rows are `tiles`' query tiles [G,T,t²,·], keys the
  patch tokens [B,M,H,·], scored against each tile's haloed keys by batched matmuls and masked
  to the band (grid_tiles explains why not w² shifted products)."""
  band = tiles.band()[None]  # [1,T,X,Y]
  scale = 1.0 / np.sqrt(q_rows.shape[-1])
  keys, values, phi_keys = (_merge(tiles.keys(x)) for x in (kp, vp, phi_kp))
  s = jnp.einsum("gtxd,gtyd->gtxy", q_rows * scale, keys)
  a = jnp.einsum("gtxf,gtyf->gtxy", phi_rows, phi_keys)
  return _ExactPart(
      jnp.where(band, s, -jnp.inf),
      jnp.where(band, a, 0.0),
      lambda w: jnp.einsum("gtxy,gtyd->gtxd", w, values),
  )


def _mix(parts, phi_rows, kv, k_sum, boost, eps):
  """The hybrid rows [G,T,X,D] and their α [G,T,X] (float32): α·(softmax average over the
  exact set) + (1 − α)·(linear average over the rest), α = the linear kernel's share of mass on
  the set, scaled by the gate's boost (a logit shift). Linear over the rest is every key's sum
  (φ(q)·φ(k)ᵀv, φ(q)·Σφ(k)) minus the set's (φ ≥ 0, so the difference is ≥ 0 up to rounding:
  clipped there). Both averages go through one weighted sum per part, w = α·e/Σe − (1 − α)·a/Σ_rest.
  Guards: a row with an empty set (a padded tile slot without prefix keys) gets e = 0, α = 0."""
  top = functools.reduce(
      jnp.maximum, [jnp.max(part.s, -1, keepdims=True, initial=-jnp.inf) for part in parts]
  )
  top = jax.lax.stop_gradient(jnp.maximum(top, jnp.finfo(jnp.float32).min))
  e = [jnp.exp(part.s - top) for part in parts]
  soft_den = functools.reduce(jnp.add, [jnp.sum(w, -1) for w in e])  # ≥ 1 with a non-empty set
  lin_exact = functools.reduce(jnp.add, [jnp.sum(part.a, -1) for part in parts])
  lin_den = jnp.einsum("gtxf,gf->gtx", phi_rows, k_sum)
  lin_rest = jnp.maximum(lin_den - lin_exact, 0.0)
  alpha = lin_exact * boost / (lin_exact * boost + lin_rest + eps)
  soft_w = (alpha / jnp.maximum(soft_den, 1e-30))[..., None]
  lin_w = ((1.0 - alpha) / (lin_rest + eps))[..., None]
  y = lin_w * jnp.einsum("gtxf,gfd->gtxd", phi_rows, kv)
  y = y + functools.reduce(
      jnp.add, [part.mix(soft_w * w - lin_w * part.a) for part, w in zip(parts, e)]
  )
  return y, alpha


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


def _sink_part(q_rows, phi_rows, k, v, phi_k, prefix, idx, window=0, positions=None):
  """The sink keys for rows [G,T,X,·]; with a window (patch rows at grid `positions`, each
  [T,X]), a sink inside a row's window is left to the window part (counted once)."""
  keys, values, phi_keys = (_gather_patches(x, prefix, idx) for x in (k, v, phi_k))
  valid = None
  if window:
    side, r = grid_tiles.grid_side(k.shape[1] - prefix, "window"), window // 2
    q_row, q_col = (p[None, None, :, :, None] for p in positions)  # [1,1,T,X,1]
    s_row, s_col = (jnp.moveaxis(p, 1, -1)[:, :, None, None] for p in jnp.divmod(idx, side))
    valid = (jnp.abs(q_row - s_row) > r) | (jnp.abs(q_col - s_col) > r)  # [B,H,T,X,m]
    valid = _merge(valid)
  return _shared_part(q_rows, phi_rows, keys, values, phi_keys, valid)


def exact_set_hybrid(
    q, k, v, phi_q, phi_k, gate_bias, window: int, prefix: int, sinks: int, eps: float
) -> tuple[jax.Array, jax.Array]:
  """A layer's attention output with an exact key set, every row [B,N,H,D] in v's dtype, and
  the set's share of the hybrid rows' attention mass per head [H] (mean over rows and images):

    y_i = α_i · softmax-average of v over E(i)  +  (1 − α_i) · linear average of v over the rest

  E(i): the prefix keys (cls, registers: DINOv2's sinks), the `sinks` patch keys of largest
  norm per image and head (`sink_indices`; O(N·m)), and for a patch row with `window` its w×w
  patch neighbourhood (O(N·w²), as tiles: grid_tiles). α_i, the mass the exact set gets, is the
  linear kernel's own estimate Σ_{E(i)} φ(q_i)·φ(k_j) / Σ_all, shifted by a learned per-head
  logit b (α' = sigmoid(logit α + b), `WindowGate`, b = 0 at init): so at init the layer is its
  linear self with the exact set's weights made exact, and b → ∞ with E(i) = every key is
  softmax attention exactly. (LoLCATs instead adds exp(s − max) terms and φ products under one
  normaliser; with hedgehog-style maps, normalised per query, the two scales disagree per query:
  on the shared ViT-S/14 that form lowered final cls cosine from 0.93 to 0.70.) Sums in
  float32. The share says whether a hybrid learned to bypass its linear branch (arXiv
  2510.05901).

  Hybrid rows: every row without a window; with one, the patch rows, and the prefix rows too
  when there are sinks. Other rows are plain linear attention (`linear_attention`'s formula),
  from the same φ(k)ᵀv and Σφ(k) as the hybrid rows (computed once). (Above 60 lines: this
  docstring is a third of it; the body is one pass through the cases above.)
  """
  f32 = jnp.float32
  out_dtype = v.dtype
  q, k, v, phi_q, phi_k = (x.astype(f32) for x in (q, k, v, phi_q, phi_k))
  idx = sink_indices(k, prefix, sinks) if sinks else None
  b, _, h, _ = v.shape
  kv = jnp.einsum("bkhf,bkhd->bhfd", phi_k, v)
  k_sum = jnp.sum(phi_k, axis=1)  # [B,H,F]
  boost = jnp.tile(jnp.exp(gate_bias.astype(f32)), b)[:, None, None]  # [G,1,1]
  kv_g, k_sum_g = _merge(kv), _merge(k_sum)

  def shared_parts(q_rows, phi_rows, positions=None):
    parts = []
    if prefix:
      keys = (x[:, :prefix] for x in (k, v, phi_k))
      parts.append(_shared_part(q_rows, phi_rows, *keys))
    if sinks:
      w = window if positions is not None else 0
      parts.append(_sink_part(q_rows, phi_rows, k, v, phi_k, prefix, idx, w, positions))
    return parts

  def block_rows(rows):  # rows [B,R,H,·] without a window: (y [B,R,H,D], α [B,R,H])
    q_rows, phi_rows = _as_block(q[:, rows]), _as_block(phi_q[:, rows])
    y, alpha = _mix(shared_parts(q_rows, phi_rows), phi_rows, kv_g, k_sum_g, boost, eps)
    y, alpha = y.reshape(b, h, *y.shape[2:]), alpha.reshape(b, h, -1)
    return jnp.swapaxes(y, 1, 2), jnp.swapaxes(alpha, 1, 2)

  if not window:
    y, alpha = block_rows(slice(None))
    return y.astype(out_dtype), jnp.mean(alpha, axis=(0, 1))
  tiles = grid_tiles.tiling(grid_tiles.grid_side(k.shape[1] - prefix, "window"), window)
  q_rows, phi_rows = (_merge(tiles.queries(x[:, prefix:])) for x in (q, phi_q))
  patch_kv = (x[:, prefix:] for x in (k, v, phi_k))
  parts = [_window_part(tiles, q_rows, phi_rows, *patch_kv)]
  parts += shared_parts(q_rows, phi_rows, tiles.positions())
  y, alpha = _mix(parts, phi_rows, kv_g, k_sum_g, boost, eps)
  y = tiles.untile(y.reshape(b, h, *y.shape[1:]))
  alpha = tiles.untile(alpha.reshape(b, h, *alpha.shape[1:], 1))[..., 0]
  pre = slice(None, prefix)
  if sinks and prefix:
    y_pre, alpha_pre = block_rows(pre)
    alpha = jnp.concatenate([alpha_pre, alpha], axis=1)
  else:  # linear_attention's rows
    num = jnp.einsum("bqhf,bhfd->bqhd", phi_q[:, pre], kv)
    den = jnp.einsum("bqhf,bhf->bqh", phi_q[:, pre], k_sum)
    y_pre = num / (den[..., None] + eps)
  y = jnp.concatenate([y_pre, y], axis=1)
  return y.astype(out_dtype), jnp.mean(alpha, axis=(0, 1))
