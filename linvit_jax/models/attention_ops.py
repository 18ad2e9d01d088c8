"""The attention operators, pure functions of q, k, v (and φ(q), φ(k)) [B, N, H, D]:

  softmax_attention          softmax(q·kᵀ/√d) v, the order of ops of flax's MHA
  chunked_softmax_attention  the same by an online softmax over key blocks, with flash
                             attention's backward (O(N·block) memory)
  pooled_key_softmax_attention  softmax over the prefix keys and the patch keys averaged over
                             g×g blocks of the grid, each weighted by its count: O(N·g²)
  linear_attention           φ(q)(φ(k)ᵀv) / (φ(q)(φ(k)ᵀ1) + ε), sums in float32

and their O(N²) weight views for losses and tests (`softmax_weights`, `linear_weights`),
`center_keys` (the keys-centring lever) and `einsum_f32` (float32 accumulation on every
backend). models/attention.py's `Attention` calls them; models/exact_set.py builds on them.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np


def softmax_attention(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
  """softmax(q·kᵀ/√d) v for q [B,Nq,H,D], k/v [B,Nk,H,D]; the order of ops follows flax's MHA."""
  q = q / jnp.sqrt(q.shape[-1]).astype(q.dtype)
  # float32 scores from bf16 q/k: a logit of 20 in bf16 is off by up to 0.06, 6 % in its weight.
  logits = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32)
  weights = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
  return jnp.einsum("bhqk,bkhd->bqhd", weights, v)


def pooled_grid_side(side: int, key_grid: int) -> int:
  """The side of the pooled key grid of a side×side patch grid: side itself when it is no wider
  than key_grid, else key_grid."""
  return min(side, key_grid)


def pooling_matrix(side: int, blocks: int) -> np.ndarray:
  """[blocks, side] 0/1: row i sums patches ⌊i·side/blocks⌋ … ⌊(i+1)·side/blocks⌋ - 1 of one
  axis, so `blocks` near-equal runs (sizes differ by at most one) tile the axis; blocks ≤ side."""
  edges = (np.arange(blocks + 1) * side) // blocks
  cols = np.arange(side)
  return ((cols >= edges[:-1, None]) & (cols < edges[1:, None])).astype(np.float32)


def pooled_key_softmax_attention(
    q: jax.Array, k: jax.Array, v: jax.Array, prefix: int, key_grid: int
) -> jax.Array:
  """Softmax attention of every query over the `prefix` keys and the patch keys pooled to
  key_grid × key_grid: O(Nq·(prefix + key_grid²)) instead of O(Nq·Nk).

  A grid wider than key_grid is cut into key_grid × key_grid blocks of near-equal runs of
  patches (`pooling_matrix`), so the pooled keys cover the image as a key_grid-wide grid's
  patches do, at any size; a block's key and value are its patches' means, and its logit is
  raised by log(count). For a block of equal keys that is exactly its patches' mass under full
  softmax; for unequal ones n·exp(q·k̄) ≤ Σ exp(q·kᵢ) (Jensen), so a block whose keys spread
  along q gets less than its patches would, and the prefix keys (cls, registers) more. A grid of
  at most key_grid patches a side is left whole (plain softmax). The patch grid must be square.
  """
  b, nk, h, d = k.shape
  side = int(round((nk - prefix) ** 0.5))
  if side * side != nk - prefix:
    raise ValueError(f"key_grid needs a square patch grid; got {nk - prefix} patch tokens")
  if side <= key_grid:
    return softmax_attention(q, k, v)
  f32 = jnp.float32
  pool = pooling_matrix(side, key_grid)  # static
  count = np.outer(pool.sum(1), pool.sum(1)).reshape(-1)  # patches per block, [key_grid²]

  def pooled(x):  # [B, prefix + side², H, D] -> the blocks' means [B, key_grid², H, D]
    grid = x[:, prefix:].astype(f32).reshape(b, side, side, h, d)
    sums = jnp.einsum("is,jt,bsthd->bijhd", pool, pool, grid)
    return sums.reshape(b, key_grid * key_grid, h, d) / count[:, None, None]

  keys = jnp.concatenate([k[:, :prefix].astype(f32), pooled(k)], axis=1)
  values = jnp.concatenate([v[:, :prefix].astype(f32), pooled(v)], axis=1)
  log_count = jnp.asarray(np.concatenate([np.zeros(prefix, np.float32), np.log(count)]))
  # Pooled keys and values, scores, weights and the weighted sum in float32 whatever the dtype:
  # a pooled key stands for many patches, so its rounding moves all their weight at once.
  logits = einsum_f32("bqhd,bkhd->bhqk", q, keys) / np.sqrt(d) + log_count
  weights = jax.nn.softmax(logits, axis=-1)
  return einsum_f32("bhqk,bkhd->bqhd", weights, values).astype(v.dtype)


def softmax_weights(q: jax.Array, k: jax.Array, temperature: float = 1.0) -> jax.Array:
  """softmax(q·kᵀ/(τ√d)) as [B,H,Nq,Nk] in float32 (for distillation targets)."""
  logits = jnp.einsum("bqhd,bkhd->bhqk", q.astype(jnp.float32), k.astype(jnp.float32))
  return jax.nn.softmax(logits / (temperature * np.sqrt(q.shape[-1])), axis=-1)


def einsum_f32(spec: str, a: jax.Array, b: jax.Array) -> jax.Array:
  """einsum with float32 accumulation whatever the operand dtypes.

  TPU/GPU multiply bf16 operands natively into an f32 accumulator (preferred_element_type). The
  XLA:CPU runtime cannot execute some such dots ("Unsupported element type for DotThunk::Execute:
  BF16 x BF16 = F32", e.g. a whole bf16 ViT under jit), so on CPU the operands are upcast first:
  the same products (bf16 values are exact in f32) and the same f32 sums.
  """
  f32 = jnp.float32
  if jax.default_backend() == "cpu" and (a.dtype != f32 or b.dtype != f32):
    a, b = a.astype(f32), b.astype(f32)
  return jnp.einsum(spec, a, b, preferred_element_type=f32)


def chunked_softmax_attention(
    q: jax.Array, k: jax.Array, v: jax.Array, chunk_size: int = 512
) -> jax.Array:
  """Exact softmax attention by an online softmax over key blocks: O(Nq·block) live memory.

  The backward is flash attention's (a custom_vjp): it keeps only q, k, v, the output and the
  per-query log-sum-exp, and recomputes each key block's probabilities. A custom_vjp, not
  jax.checkpoint, because an enclosing remat policy (a scanned ViT with "everything_saveable")
  overrides an inner checkpoint and would save every block's [Nq, block] scores (measured: 15 GB
  at 1024 px instead of 3). Blocks are head-major ([B,H,block,D]) so both contractions are
  plain batched matmuls with no per-step transposes.
  """
  return _flash(q, k, v, min(chunk_size, k.shape[1]))


def _key_blocks(x: jax.Array, chunk: int) -> jax.Array:
  """[B,Nk,H,D] -> [n_chunks, B, H, chunk, D], zero-padded at the end."""
  b, nk, h, d = x.shape
  n_chunks = -(-nk // chunk)
  pad = n_chunks * chunk - nk
  x = jnp.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0))) if pad else x
  return x.reshape(b, n_chunks, chunk, h, d).transpose(1, 0, 3, 2, 4)


def _unblock(x: jax.Array, nk: int) -> jax.Array:
  """The inverse of _key_blocks: [n_chunks, B, H, chunk, D] -> [B,Nk,H,D]."""
  n_chunks, b, h, chunk, d = x.shape
  return x.transpose(1, 0, 3, 2, 4).reshape(b, n_chunks * chunk, h, d)[:, :nk]


def _key_mask(nk: int, chunk: int) -> jax.Array:
  n_chunks = -(-nk // chunk)
  return (jnp.arange(n_chunks * chunk) < nk).reshape(n_chunks, 1, 1, 1, chunk)


def _flash_forward(q, k, v, chunk):
  """(output [B,Nq,H,D], log-sum-exp [B,H,Nq] in float32)."""
  b, nk, h, d = k.shape
  nq, f32 = q.shape[1], jnp.float32
  padded = nk % chunk != 0
  qs = (q / jnp.sqrt(d).astype(q.dtype)).transpose(0, 2, 1, 3)  # [B,H,Nq,D]

  def step(carry, blk):
    m_prev, l_prev, acc = carry
    k_blk, v_blk, valid_blk = blk
    s = einsum_f32("bhqd,bhkd->bhqk", qs, k_blk)
    if padded:
      s = jnp.where(valid_blk, s, -jnp.inf)
    m_new = jnp.maximum(m_prev, s.max(axis=-1))
    p = jnp.exp(s - m_new[..., None])
    correction = jnp.exp(m_prev - m_new)
    l_new = l_prev * correction + p.sum(axis=-1)
    acc = acc * correction[..., None] + einsum_f32("bhqk,bhkd->bhqd", p.astype(v_blk.dtype), v_blk)
    return (m_new, l_new, acc), None

  init = (
      jnp.full((b, h, nq), -jnp.inf, f32),
      jnp.zeros((b, h, nq), f32),
      jnp.zeros((b, h, nq, v.shape[-1]), f32),
  )
  xs = (_key_blocks(k, chunk), _key_blocks(v, chunk), _key_mask(nk, chunk)[:, 0])
  (m, l, acc), _ = jax.lax.scan(step, init, xs)
  out = (acc / l[..., None]).transpose(0, 2, 1, 3).astype(v.dtype)
  return out, m + jnp.log(l)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _flash(q, k, v, chunk):
  return _flash_forward(q, k, v, chunk)[0]


def _flash_fwd(q, k, v, chunk):
  out, lse = _flash_forward(q, k, v, chunk)
  return out, (q, k, v, out, lse)


def _flash_bwd(chunk, res, d_out):
  """Per key block j: P = exp(S - lse), dV_j = Pᵀ dO, dS = P ∘ (dO V_jᵀ - Δ), dQ += dS K_j,
  dK_j = dSᵀ Q, with Δ = rowsum(dO ∘ O) (the flash-attention backward)."""
  q, k, v, out, lse = res
  nk, d = k.shape[1], q.shape[-1]
  f32 = jnp.float32
  padded = nk % chunk != 0
  scale = 1.0 / np.sqrt(d)
  qs = (q.astype(f32) * scale).transpose(0, 2, 1, 3)  # [B,H,Nq,D]
  d_out_h = d_out.astype(f32).transpose(0, 2, 1, 3)
  delta = jnp.sum(d_out_h * out.astype(f32).transpose(0, 2, 1, 3), axis=-1)  # [B,H,Nq]

  def step(dq, blk):
    k_blk, v_blk, valid_blk = blk
    s = einsum_f32("bhqd,bhkd->bhqk", qs, k_blk)
    p = jnp.exp(s - lse[..., None])
    if padded:
      p = jnp.where(valid_blk, p, 0.0)
    dv_blk = einsum_f32("bhqk,bhqd->bhkd", p, d_out_h)
    dp = einsum_f32("bhqd,bhkd->bhqk", d_out_h, v_blk)
    ds = p * (dp - delta[..., None])
    dq = dq + einsum_f32("bhqk,bhkd->bhqd", ds, k_blk)
    dk_blk = einsum_f32("bhqk,bhqd->bhkd", ds, qs)
    return dq, (dk_blk, dv_blk)

  xs = (_key_blocks(k, chunk), _key_blocks(v, chunk), _key_mask(nk, chunk)[:, 0])
  dq, (dk, dv) = jax.lax.scan(step, jnp.zeros_like(qs), xs)
  dq = (dq * scale).transpose(0, 2, 1, 3)
  return dq.astype(q.dtype), _unblock(dk, nk).astype(k.dtype), _unblock(dv, nk).astype(v.dtype)


_flash.defvjp(_flash_fwd, _flash_bwd)


def linear_attention(
    phi_q: jax.Array, phi_k: jax.Array, v: jax.Array, eps: float = 1e-6
) -> jax.Array:
  """φ(q)(φ(k)ᵀv) / (φ(q)(φ(k)ᵀ1) + ε), non-causal, sums accumulated in float32."""
  f32 = jnp.float32
  kv = einsum_f32("bkhf,bkhd->bhfd", phi_k, v)
  k_sum = jnp.sum(phi_k.astype(f32), axis=1)  # [B,H,F]
  num = jnp.einsum("bqhf,bhfd->bqhd", phi_q.astype(f32), kv)
  den = jnp.einsum("bqhf,bhf->bqh", phi_q.astype(f32), k_sum)
  return (num / (den[..., None] + eps)).astype(v.dtype)


def linear_weights(phi_q: jax.Array, phi_k: jax.Array, eps: float = 1e-6) -> jax.Array:
  """The normalised weights φ(q)φ(k)ᵀ / Σ_k φ(q)φ(k)ᵀ as [B,H,Nq,Nk] (the O(N²) view, for
  distillation on a subset of queries and for reference tests)."""
  a = jnp.einsum("bqhf,bkhf->bhqk", phi_q.astype(jnp.float32), phi_k.astype(jnp.float32))
  return a / (a.sum(axis=-1, keepdims=True) + eps)


def center_keys(k: jax.Array) -> jax.Array:
  """Keys minus their mean over tokens, per image and head: q·(k_j - k̄) differs from q·k_j by a
  constant per query, which softmax ignores and a feature map does not."""
  return k - jnp.mean(k, axis=1, keepdims=True)
