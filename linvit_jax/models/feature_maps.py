"""Feature maps φ for kernelized linear attention, one small module each.

Every map takes per-head queries or keys `x` of shape [batch, tokens, heads, head_dim] and returns
non-negative features [batch, tokens, heads, features]. Linear attention then approximates
softmax(q·k/√d) by φ(q)·φ(k) normalised over keys (see `attention.linear_attention`).

Learnable maps keep their parameters in their own sub-module (`feature_map_q` / `feature_map_k` under
the attention module), so a softmax teacher's q/k/v/out tree stays a subset of the student's tree.
"""

from __future__ import annotations

from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

FEATURE_MAPS: dict[str, type[nn.Module]] = {}


def register(name: str) -> Callable[[type[nn.Module]], type[nn.Module]]:
  def wrap(cls: type[nn.Module]) -> type[nn.Module]:
    FEATURE_MAPS[name] = cls
    return cls

  return wrap


def get_feature_map_cls(name: str) -> type[nn.Module]:
  if name not in FEATURE_MAPS:
    raise ValueError(f"unknown feature map {name!r}; known: {sorted(FEATURE_MAPS)}")
  return FEATURE_MAPS[name]


@register("elu1")
class Elu1(nn.Module):
  """φ(x) = elu(x) + 1 (Katharopoulos et al., 2020)."""

  num_features: int | None = None  # unused; keeps one constructor signature for every map
  seed: int = 0
  redraw: bool = False

  def __call__(self, x: jax.Array, *, is_query: bool) -> jax.Array:
    del is_query
    # elu(x) + 1 written as its two branches: exp(x) for x <= 0 (the same number as expm1(x) + 1
    # to float rounding) costs one exp instead of nn.elu's expm1 + add; ~1.8x faster on CPU.
    one = jnp.ones((), x.dtype)
    return jnp.where(x > 0, x + one, jnp.exp(jnp.minimum(x, 0)))


@register("relu")
class Relu(nn.Module):
  """φ(x) = max(x, 0)."""

  num_features: int | None = None
  seed: int = 0
  redraw: bool = False

  def __call__(self, x: jax.Array, *, is_query: bool) -> jax.Array:
    del is_query
    return nn.relu(x)


@register("hedgehog")
class Hedgehog(nn.Module):
  """φ(x) = [softmax(xW + b), softmax(−(xW + b))] over features, W per head (Zhang et al., 2024).

  `Attention` folds W into the query/key projection (`projects_per_head`): z = x(W_q W) + (b_q W + b)
  is one [D, H·width] matmul instead of the q projection followed by a per-head one.
  """

  num_features: int | None = None  # projection width; defaults to head_dim (→ 2·head_dim features)
  seed: int = 0
  redraw: bool = False
  projects_per_head = True  # φ(x) = features(per-head linear map of x): see Attention

  @nn.compact
  def projection(self, heads: int, head_dim: int) -> tuple[jax.Array, jax.Array]:
    """The per-head map's kernel [H, head_dim, width] and bias [H, width]."""
    width = self.num_features or head_dim

    def near_identity(key, shape, dtype=jnp.float32):
      # Identity makes softmax(xW) a monotone function of q·k at init: a sensible start for a
      # map whose job is to imitate exp(q·k); the small noise breaks the ±x symmetry per head.
      eye = jnp.eye(shape[1], shape[2], dtype=dtype)
      return eye[None] + 1e-3 * jax.random.normal(key, shape, dtype)

    kernel = self.param("kernel", near_identity, (heads, head_dim, width))
    bias = self.param("bias", nn.initializers.zeros, (heads, width))
    return kernel, bias

  @staticmethod
  def features(z: jax.Array, *, is_query: bool = True) -> jax.Array:
    """φ from the projected z [B, N, H, width] (float32): [softmax(z), softmax(−z)], as one
    softmax over a stacked pair (one fused pass on CPU instead of two softmaxes and a concat)."""
    del is_query
    pair = jax.nn.softmax(jnp.stack([z, -z], axis=-2), axis=-1)
    return pair.reshape(*z.shape[:-1], 2 * z.shape[-1])

  def __call__(self, x: jax.Array, *, is_query: bool) -> jax.Array:
    _, _, heads, head_dim = x.shape
    kernel, bias = self.projection(heads, head_dim)
    z = jnp.einsum("bnhd,hdf->bnhf", x.astype(jnp.float32), kernel) + bias
    return self.features(z, is_query=is_query)


@register("hedgehog_exp")
class HedgehogExp(Hedgehog):
  """Hedgehog whose *key* features keep their scale: φ_k = [exp(z), exp(−z)] / c, c shared by all
  keys of one (image, head); queries as hedgehog ([softmax(z), softmax(−z)]).

  Normalising φ per token is harmless for a query (its row of weights is normalised anyway) but
  not for a key: it puts every key on the same simplex, so no key can draw more weight from every
  query than another, which is how softmax attention forms its sinks (the few high-norm tokens
  that take most of the attention in real ViTs, e.g. DINOv2's). A constant shared by all keys
  cancels in the normalised ratio; taking it as the max keeps exp() ≤ 1 (no overflow) and the
  largest key feature at 1, far above the ε guard.
  """

  @staticmethod
  def features(z: jax.Array, *, is_query: bool = True) -> jax.Array:
    pair = jnp.stack([z, -z], axis=-2)  # [B, N, H, 2, width]
    if is_query:
      pair = jax.nn.softmax(pair, axis=-1)
    else:
      c = jax.lax.stop_gradient(jnp.max(pair, axis=(1, 3, 4), keepdims=True))
      pair = jnp.exp(pair - c)
    return pair.reshape(*z.shape[:-1], 2 * z.shape[-1])


def orthogonal_gaussian(key: jax.Array, num_features: int, dim: int) -> jax.Array:
  """Rows are blocks of orthogonal directions with chi-distributed norms (Performer's ORF)."""
  blocks = []
  n_blocks = int(np.ceil(num_features / dim))
  keys = jax.random.split(key, n_blocks + 1)
  for i in range(n_blocks):
    q, _ = jnp.linalg.qr(jax.random.normal(keys[i], (dim, dim)))
    blocks.append(q.T)
  w = jnp.concatenate(blocks, axis=0)[:num_features]
  norms = jnp.linalg.norm(jax.random.normal(keys[-1], (num_features, dim)), axis=1)
  return w * norms[:, None]


@register("favor")
class Favor(nn.Module):
  """φ(x) = exp(Wx' − |x'|²/2 − c) with x' = x·d^(-1/4), W orthogonal random (FAVOR+ positive)."""

  num_features: int | None = None  # m; defaults to 2·head_dim
  seed: int = 0
  redraw: bool = False  # draw W from the 'favor' rng collection when one is provided

  @nn.compact
  def __call__(self, x: jax.Array, *, is_query: bool) -> jax.Array:
    _, _, _, head_dim = x.shape
    m = self.num_features or 2 * head_dim
    if self.redraw and self.has_rng("favor"):
      key = self.make_rng("favor")
    else:
      key = jax.random.PRNGKey(self.seed)
    w = jax.lax.stop_gradient(orthogonal_gaussian(key, m, head_dim))
    x = x.astype(jnp.float32) * head_dim**-0.25
    logits = jnp.einsum("bnhd,md->bnhm", x, w) - 0.5 * jnp.sum(x * x, axis=-1, keepdims=True)
    # The stabiliser c cancels in the normalised ratio: one per token for queries (a row of the
    # ratio), one per (batch, head) for keys (shared by all keys). Performer's 1/√m cancels too.
    # Taking c as the max keeps exp() ≤ 1 (no overflow) and the largest feature at 1, so the
    # normaliser stays far above the ε guard.
    if is_query:
      c = jnp.max(logits, axis=-1, keepdims=True)
    else:
      c = jnp.max(logits, axis=(1, 3), keepdims=True)
    return jnp.exp(logits - jax.lax.stop_gradient(c))
