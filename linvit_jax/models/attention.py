"""Attention operators behind one module with big_vision's parameter names.

`Attention` owns the projections `query`, `key`, `value` (kernel [D, H, Dh], bias [H, Dh]) and `out`
(kernel [H, Dh, D], bias [D]) exactly as flax's `MultiHeadDotProductAttention` names and shapes
them, so a softmax checkpoint loads into any operator. What differs between operators is only the
aggregation `attend(q, k, v)`:

  softmax          softmax(q·kᵀ/√d) v                                   O(N²) time and memory
  chunked_softmax  the same, online softmax over key blocks              O(N²) time, O(N·block) memory
  linear           φ(q)(φ(k)ᵀv) / (φ(q)(φ(k)ᵀ1) + ε)                     O(N) time and memory

The post-projection q and k are sown into the 'intermediates' collection when it is mutable, which
is how the distillation routing loss reads both models' attention without a second code path.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from linvit_jax.models import feature_maps
from linvit_jax.runtime import tree as tree_lib

KINDS = ("softmax", "chunked_softmax", "linear")
LINEAR_LEVERS = ("exact_prefix_rows", "center_keys", "conv_v", "window", "sinks")


@dataclasses.dataclass(frozen=True)
class AttentionSpec:
  """Which operator an attention layer uses. Hashable, so it can be a linen attribute."""

  kind: str = "softmax"
  feature_map: str = "elu1"  # linear only
  eps: float = 1e-6  # linear only: added to the normaliser
  num_features: int | None = None  # linear only: hedgehog projection width / favor features
  favor_seed: int = 0
  favor_redraw: bool = False
  chunk_size: int = 512  # chunked_softmax only: keys per block
  # Levers inside a linear layer (each O(N)):
  exact_prefix_rows: bool = False  # the prefix tokens' queries (cls, registers) get exact softmax
  center_keys: bool = False  # keys centred per image and head before φ (softmax is shift-invariant)
  conv_v: bool = False  # a zero-initialised depthwise 3×3 conv of v over the patch grid, added
  # w > 0 (odd): each patch query gets exact softmax over its w×w patch neighbourhood and the
  # prefix keys (cls, registers: DINOv2's sinks), linear attention over the other keys, mixed by
  # the linear kernel's own estimate of the window's mass shifted by a learned per-head logit
  # (`exact_set_hybrid`; LoLCATs' idea, scale-consistent); O(N·w²).
  window: int = 0
  # m > 0: the prefix keys and the m patch keys of largest (centred) norm, per image and head,
  # are in every query's exact set (attention sinks), under the same mix as the window; O(N·m).
  sinks: int = 0

  def __post_init__(self):
    if self.kind not in KINDS:
      raise ValueError(f"unknown attention kind {self.kind!r}; known: {KINDS}")
    if self.kind == "linear":
      feature_maps.get_feature_map_cls(self.feature_map)  # validates the name early
    else:
      levers = [f for f in LINEAR_LEVERS if getattr(self, f)]
      if levers:
        raise ValueError(
            f"attention option(s) {levers} apply to linear attention only, not to {self.kind!r}"
        )
    if self.chunk_size <= 0:
      raise ValueError(f"attention chunk_size must be positive, got {self.chunk_size}")
    if self.window < 0 or (self.window and self.window % 2 == 0):
      raise ValueError(
          f"attention window must be an odd number of patches (0: off), got {self.window}"
      )
    if self.sinks < 0:
      raise ValueError(f"attention sinks must be >= 0 (0: off), got {self.sinks}")
    if self.num_features is not None and self.num_features <= 0:
      raise ValueError(
          f"attention num_features must be positive (None: the map's default), got "
          f"{self.num_features}"
      )


def parse_spec(spec: Any) -> AttentionSpec:
  """Accepts an AttentionSpec, a string ('softmax', 'chunked_softmax', 'linear', 'linear:hedgehog',
  or a bare feature-map name such as 'elu1'), or a mapping of AttentionSpec fields."""
  if isinstance(spec, AttentionSpec):
    return spec
  if spec is None:
    return AttentionSpec()
  if isinstance(spec, str):
    if ":" in spec:
      kind, fmap = spec.split(":", 1)
      return AttentionSpec(kind=kind, feature_map=fmap)
    if spec in feature_maps.FEATURE_MAPS:
      return AttentionSpec(kind="linear", feature_map=spec)
    if spec not in KINDS:  # a typo of either: name both lists
      raise ValueError(
          f"unknown attention kind {spec!r}; known: {KINDS}, or a feature map for "
          f"linear attention: {sorted(feature_maps.FEATURE_MAPS)}"
      )
    return AttentionSpec(kind=spec)
  if isinstance(spec, Mapping) or hasattr(spec, "to_dict"):
    fields = tree_lib.as_dict(spec)
    known = {f.name for f in dataclasses.fields(AttentionSpec)}
    unknown = sorted(set(fields) - known)
    if unknown:
      raise ValueError(f"unknown attention field(s) {unknown}; known: {sorted(known)}")
    return AttentionSpec(**fields)
  raise TypeError(f"cannot parse attention spec {spec!r}")


def parse_layer_specs(spec: Any, depth: int) -> tuple[AttentionSpec, ...]:
  """One spec for every layer, or a per-layer sequence of exactly `depth` specs."""
  if isinstance(spec, Sequence) and not isinstance(spec, str):
    if len(spec) != depth:
      raise ValueError(f"attention has {len(spec)} per-layer specs but depth is {depth}")
    return tuple(parse_spec(s) for s in spec)
  return (parse_spec(spec),) * depth


# ----------------------------------------------------------------------------- operators (pure)


def softmax_attention(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
  """softmax(q·kᵀ/√d) v for q [B,Nq,H,D], k/v [B,Nk,H,D]; the order of ops follows flax's MHA."""
  q = q / jnp.sqrt(q.shape[-1]).astype(q.dtype)
  # float32 scores from bf16 q/k: a logit of 20 in bf16 is off by up to 0.06, 6 % in its weight.
  logits = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32)
  weights = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
  return jnp.einsum("bhqk,bkhd->bqhd", weights, v)


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


# ----------------------------------------------------------------------------- the module


class DepthwiseConv3x3(nn.Module):
  """A zero-initialised depthwise 3×3 convolution, SAME padding, with nn.Conv's parameter names
  and shapes (kernel [3, 3, 1, C], bias [C]), computed as nine shifted multiply-adds: XLA:CPU runs
  a grouped convolution with C groups far slower than its FLOPs."""

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    c, (hh, ww) = x.shape[-1], x.shape[1:3]
    kernel = self.param("kernel", nn.initializers.zeros, (3, 3, 1, c)).astype(x.dtype)
    bias = self.param("bias", nn.initializers.zeros, (c,)).astype(x.dtype)
    padded = jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    taps = [kernel[i, j, 0] * padded[:, i : i + hh, j : j + ww] for i in range(3) for j in range(3)]
    return bias + sum(taps)


class WindowGate(nn.Module):
  """b per head: a shift of the logit of the exact set's (window, sinks) share of attention mass
  (0 at init: the share the linear kernel itself gives the set)."""

  num_heads: int

  @nn.compact
  def __call__(self) -> jax.Array:
    return self.param("logit", nn.initializers.zeros, (self.num_heads,))


class Attention(nn.Module):
  """Multi-head attention with flax MHA's parameter names; the operator comes from `spec`."""

  num_heads: int
  spec: AttentionSpec = AttentionSpec()
  dtype_mm: Any = "float32"
  kernel_init: Any = nn.initializers.xavier_uniform()
  num_prefix_tokens: int = 0  # tokens before the patch grid (cls, registers): for the levers

  @nn.compact
  def __call__(self, inputs_q: jax.Array, inputs_kv: jax.Array | None = None) -> jax.Array:
    inputs_kv = inputs_q if inputs_kv is None else inputs_kv
    features = inputs_q.shape[-1]
    if features % self.num_heads:
      raise ValueError(f"width {features} is not divisible by num_heads {self.num_heads}")
    head_dim = features // self.num_heads
    dense = lambda name: nn.DenseGeneral(  # noqa: E731
        features=(self.num_heads, head_dim),
        axis=-1,
        dtype=self.dtype_mm,
        kernel_init=self.kernel_init,
        name=name,
    )
    q = dense("query")(inputs_q)
    k = dense("key")(inputs_kv)
    v = dense("value")(inputs_kv)
    self.sow("intermediates", "q", q)
    self.sow("intermediates", "k", k)

    spec = self.spec
    if spec.kind == "softmax":
      y = softmax_attention(q, k, v)
    elif spec.kind == "chunked_softmax":
      y = chunked_softmax_attention(q, k, v, spec.chunk_size)
    else:
      fmap_cls = feature_maps.get_feature_map_cls(spec.feature_map)
      kw = dict(num_features=spec.num_features, seed=spec.favor_seed, redraw=spec.favor_redraw)
      fmap_q = fmap_cls(name="feature_map_q", **kw)
      fmap_k = fmap_cls(name="feature_map_k", **kw)
      if getattr(fmap_cls, "projects_per_head", False):
        # φ starts with a per-head linear map W: fold it into the projection. z = x(W_q W) + ...
        # is one [D, H·width] matmul; q itself is then only computed when it is sown (XLA drops
        # it otherwise), and the per-head matmul over all tokens, with its transposes, is gone.
        phi_q = self._folded_features(fmap_q, "query", inputs_q, head_dim, is_query=True)
        phi_k = self._folded_features(
            fmap_k, "key", inputs_kv, head_dim, is_query=False, center=spec.center_keys
        )
      else:
        phi_q = fmap_q(q, is_query=True)
        phi_k = fmap_k(center_keys(k) if spec.center_keys else k, is_query=False)
      # Sown for the routing loss, which then needs neither q/k (2 extra projections when φ is
      # folded into them) nor a second pass of the feature maps.
      self.sow("intermediates", "phi_q", phi_q)
      self.sow("intermediates", "phi_k", phi_k)
      y = linear_attention(phi_q, phi_k, v, spec.eps)
      p = self.num_prefix_tokens
      if spec.window or spec.sinks:
        gate = WindowGate(self.num_heads, name="window" if spec.window else "sinks")()
        rows, prefix_rows, share = exact_set_hybrid(
            q, k, v, phi_q, phi_k, gate, spec.window, p, spec.sinks, spec.eps
        )
        if not spec.window:
          y = rows.astype(y.dtype)
        else:
          y_pre = y[:, :p] if prefix_rows is None else prefix_rows.astype(y.dtype)
          y = jnp.concatenate([y_pre, rows.astype(y.dtype)], axis=1)
        self.sow("intermediates", "exact_share", share)
      if spec.exact_prefix_rows and p:
        # The cls (and register) rows are what the pooled feature is made of; exact softmax over
        # all keys for P queries is O(P·N).
        y = y.at[:, :p].set(softmax_attention(q[:, :p], k, v).astype(y.dtype))
      if spec.conv_v:
        y = y + self._conv_v(v, p)

    return nn.DenseGeneral(
        features=features,
        axis=(-2, -1),
        dtype=self.dtype_mm,
        kernel_init=self.kernel_init,
        name="out",
    )(y)

  def _conv_v(self, v: jax.Array, prefix: int) -> jax.Array:
    """A depthwise 3×3 convolution of the patch tokens' v over their grid, zero at init (the
    layer starts as the plain linear attention); prefix tokens get nothing."""
    b, n, h, d = v.shape
    side = int(round((n - prefix) ** 0.5))
    if side * side != n - prefix:
      raise ValueError(f"conv_v needs a square patch grid; got {n - prefix} patch tokens")
    grid = v[:, prefix:].reshape(b, side, side, h * d)
    conv = DepthwiseConv3x3(name="conv_v")(grid)
    conv = conv.reshape(b, n - prefix, h, d).astype(v.dtype)
    return jnp.concatenate([jnp.zeros_like(v[:, :prefix]), conv], axis=1)

  def _folded_features(
      self,
      fmap: nn.Module,
      dense_name: str,
      inputs: jax.Array,
      head_dim: int,
      *,
      is_query: bool,
      center: bool = False,
  ) -> jax.Array:
    """fmap.features(x·(W_p W) + (b_p W + b)) = φ(x W_p + b_p) for a projects_per_head map, with
    the projection `dense_name`'s params (already created by its call above)."""
    proj = self.variables["params"][dense_name]
    w, b = fmap.projection(self.num_heads, head_dim)
    kernel = jnp.einsum("dhk,hkf->dhf", proj["kernel"], w)
    bias = jnp.einsum("hk,hkf->hf", proj["bias"], w) + b
    dtype = jnp.dtype(self.dtype_mm)
    z = (
        jnp.einsum(
            "bnd,dhf->bnhf",
            inputs.astype(dtype),
            kernel.astype(dtype),
            preferred_element_type=jnp.float32,
        )
        + bias
    )
    if center:  # (k - mean k)W + b = z - mean(z) + b: the centred keys through the folded map
      z = z - jnp.mean(z, axis=1, keepdims=True) + b
    return fmap.features(z, is_query=is_query)


# ----------------------------------------------------------------------------- the window hybrid


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


def center_keys(k: jax.Array) -> jax.Array:
  """Keys minus their mean over tokens, per image and head: q·(k_j - k̄) differs from q·k_j by a
  constant per query, which softmax ignores and a feature map does not."""
  return k - jnp.mean(k, axis=1, keepdims=True)


def feature_maps_of(
    spec: AttentionSpec, q: jax.Array, k: jax.Array, fmap_params: Mapping[str, Any] | None
) -> tuple[jax.Array, jax.Array]:
  """φ(q), φ(k) for an attention module's params subtree (outside the module, for losses)."""
  fmap_cls = feature_maps.get_feature_map_cls(spec.feature_map)
  kw = dict(num_features=spec.num_features, seed=spec.favor_seed, redraw=False)
  fmap_params = fmap_params or {}
  phi = []
  k = center_keys(k) if spec.center_keys else k
  for name, x, is_q in (("feature_map_q", q, True), ("feature_map_k", k, False)):
    variables = {"params": fmap_params[name]} if name in fmap_params else {}
    phi.append(fmap_cls(**kw).apply(variables, x, is_query=is_q))
  return phi[0], phi[1]
