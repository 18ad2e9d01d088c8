"""Attention operators behind one module with big_vision's parameter names.

`Attention` owns the projections `query`, `key`, `value` (kernel [D, H, Dh], bias [H, Dh]) and `out`
(kernel [H, Dh, D], bias [D]) exactly as flax's `MultiHeadDotProductAttention` names and shapes
them, so a softmax checkpoint loads into any operator. What differs between operators is only the
aggregation `attend(q, k, v)`:

  softmax          softmax(q·kᵀ/√d) v                                   O(N²) time and memory
  chunked_softmax  the same, online softmax over key blocks              O(N²) time, O(N·block) memory
  softmax with key_grid g: over the prefix keys and the patch keys         O(N·g²) time and memory
                   pooled to g×g blocks (each logit + log of its count)
  linear           φ(q)(φ(k)ᵀv) / (φ(q)(φ(k)ᵀ1) + ε)                     O(N) time and memory

The post-projection q and k are sown into the 'intermediates' collection when it is mutable, which
is how the distillation routing loss reads both models' attention without a second code path.

Here: which operator a layer uses (`AttentionSpec`, `parse_spec`) and the flax module with its
levers' parameters. The operators themselves are pure functions in models/attention_ops.py; the
exact-set hybrid of the `window` / `sinks` levers is models/exact_set.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from linvit_jax.models import attention_ops as ops
from linvit_jax.models import exact_set
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
  # softmax kinds only, g > 0: on a patch grid wider than g, the patch keys and values are
  # averaged over s×s blocks to at most g×g, each logit raised by log(its block's count), beside
  # the exact prefix keys (attention_ops.pooled_key_softmax_attention): O(N·g²). A softmax layer
  # trained at a g×g grid then keeps its cost linear in tokens at larger sizes, and its keys
  # cover the image as they did in training. 0: every key.
  key_grid: int = 0
  # Levers inside a linear layer (each O(N)):
  exact_prefix_rows: bool = False  # the prefix tokens' queries (cls, registers) get exact softmax
  center_keys: bool = False  # keys centred per image and head before φ (softmax is shift-invariant)
  conv_v: bool = False  # a zero-initialised depthwise 3×3 conv of v over the patch grid, added
  # w > 0 (odd): each patch query gets exact softmax over its w×w patch neighbourhood and the
  # prefix keys (cls, registers: DINOv2's sinks), linear attention over the other keys, mixed by
  # the linear kernel's own estimate of the window's mass shifted by a learned per-head logit
  # (exact_set.exact_set_hybrid; LoLCATs' idea, scale-consistent); O(N·w²).
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
    if self.key_grid < 0:
      raise ValueError(f"attention key_grid must be >= 0 (0: every key), got {self.key_grid}")
    if self.key_grid and self.kind == "linear":
      raise ValueError("attention key_grid applies to softmax kinds only, not to 'linear'")
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
    if spec.key_grid and spec.kind != "linear":
      y = ops.pooled_key_softmax_attention(q, k, v, self.num_prefix_tokens, spec.key_grid)
    elif spec.kind == "softmax":
      y = ops.softmax_attention(q, k, v)
    elif spec.kind == "chunked_softmax":
      y = ops.chunked_softmax_attention(q, k, v, spec.chunk_size)
    else:
      y = self._linear(q, k, v, inputs_q, inputs_kv, head_dim)

    return nn.DenseGeneral(
        features=features,
        axis=(-2, -1),
        dtype=self.dtype_mm,
        kernel_init=self.kernel_init,
        name="out",
    )(y)

  def _linear(
      self,
      q: jax.Array,
      k: jax.Array,
      v: jax.Array,
      inputs_q: jax.Array,
      inputs_kv: jax.Array,
      head_dim: int,
  ) -> jax.Array:
    """Linear attention with the spec's levers (exact set, exact prefix rows, conv of v), before
    the out projection: [B, N, H, Dh]."""
    spec = self.spec
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
      phi_k = fmap_k(ops.center_keys(k) if spec.center_keys else k, is_query=False)
    # Sown for the routing loss, which then needs neither q/k (2 extra projections when φ is
    # folded into them) nor a second pass of the feature maps.
    self.sow("intermediates", "phi_q", phi_q)
    self.sow("intermediates", "phi_k", phi_k)
    p = self.num_prefix_tokens
    if spec.window or spec.sinks:
      gate = WindowGate(self.num_heads, name="window" if spec.window else "sinks")()
      y, share = exact_set.exact_set_hybrid(
          q, k, v, phi_q, phi_k, gate, spec.window, p, spec.sinks, spec.eps
      )
      self.sow("intermediates", "exact_share", share)
    else:
      y = ops.linear_attention(phi_q, phi_k, v, spec.eps)
    if spec.exact_prefix_rows and p:
      # The cls (and register) rows are what the pooled feature is made of; exact softmax over
      # all keys for P queries is O(P·N).
      y = y.at[:, :p].set(ops.softmax_attention(q[:, :p], k, v).astype(y.dtype))
    if spec.conv_v:
      y = y + self._conv_v(v, p)
    return y

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


def feature_maps_of(
    spec: AttentionSpec, q: jax.Array, k: jax.Array, fmap_params: Mapping[str, Any] | None
) -> tuple[jax.Array, jax.Array]:
  """φ(q), φ(k) for an attention module's params subtree (outside the module, for losses)."""
  fmap_cls = feature_maps.get_feature_map_cls(spec.feature_map)
  kw = dict(num_features=spec.num_features, seed=spec.favor_seed, redraw=False)
  fmap_params = fmap_params or {}
  phi = []
  k = ops.center_keys(k) if spec.center_keys else k
  for name, x, is_q in (("feature_map_q", q, True), ("feature_map_k", k, False)):
    variables = {"params": fmap_params[name]} if name in fmap_params else {}
    phi.append(fmap_cls(**kw).apply(variables, x, is_query=is_q))
  return phi[0], phi[1]
