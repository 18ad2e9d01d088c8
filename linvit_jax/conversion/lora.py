"""Low-rank (LoRA) updates, as an optimizer transformation.

LoRA trains W = W₀ + A·B with W₀ frozen, A [m, r] and B [r, n]. The loss only ever reads W, and
∂L/∂A = G·Bᵀ, ∂L/∂B = Aᵀ·G with G = ∂L/∂W, so the whole method fits inside the optimizer: the
factors live in the optimizer state, the inner chain (clip, Adam, lr, schedule) steps them, and
the update handed to the params is the change of the product, A'B' − AB. The params stay the merged
weights at every step, so the model, the loss, evaluation, checkpoints, the stage's hand-on and
its interpolation with the start are the same code with LoRA on or off (nothing to merge at the
end), and resuming restores the factors with the rest of the optimizer state.

Which leaves: those whose path fullmatches `pattern` (default every kernel: Dense, DenseGeneral,
Conv) and whose matrix view has both sides larger than the rank. A kernel of any rank is read as
the matrix [prod(shape[:k]), prod(shape[k:])] with the split k that makes it most square: q/k/v
[d, h, hd] → [d, h·hd], the out projection [h, hd, d] → [h·hd, d], a patch embedding
[p, p, c, d] → [p·p·c, d]. Every other trained leaf (biases, norms, embeddings, per-head vectors)
is stepped as usual. A per-head kernel such as hedgehog's [h, hd, w] reads as [h·hd, w]: one rank-r
update whose output directions the heads share. In a scanned tree (paths under
`layout.SCANNED_PREFIX`, a leading depth axis) each layer gets its own factors: the depth axis is
a batch axis of A and B, not part of the matrix. A pattern that names encoder modules is best built
from models/layout.py (e.g. `layout.attention_re(layout.PROJECTIONS)`).

`column_scale=True` (the optimizer's update_scale="param_rms") makes ΔW = (A·B) ⊙ s with s the
RMS of each output column of W₀ (floored), fixed when the stage starts: the same relative-step
idea as `optim.scale_by_param_rms`, for a low-rank update (a column carrying a tiny folded
LayerScale moves by a fraction of its size; a column scale keeps the rank). A starts N(0, 1/r),
B at zero, so the stage starts at W₀ and a step of size lr on B moves each entry of W by ~lr·s.

What the inner chain sees are the factors' gradients: its global-norm clip acts on their norm
(under param_rms about s times the kernels' gradient norm, so a clip of 1 rarely acts), and weight
decay (`wd_pattern` matched on the kernel's path) decays the factors, pulling W back towards W₀.
A is drawn from `seed` (the stage seed, through `optim.make_optimizer`), so runs with another
config seed draw another A.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from linvit_jax.models import layout
from linvit_jax.runtime import tree as tree_lib

FACTOR_NAMES = ("lora_a", "lora_b")  # the factors' names under their param's path


class LoraState(NamedTuple):
  # Like the params: {"lora_a", "lora_b", "scale"} at a low-rank leaf, MaskedNode elsewhere.
  factors: Any
  inner: Any  # the inner transformation's state over (factors | full leaves)


def matrix_split(shape: Sequence[int]) -> int:
  """The k for which [prod(shape[:k]), prod(shape[k:])] is the most square matrix view (≥ 2-D)."""
  if len(shape) < 2:
    raise ValueError(f"a low-rank update needs a leaf of 2 or more axes, got shape {tuple(shape)}")

  def imbalance(k):
    return abs(math.log(max(math.prod(shape[:k]), 1)) - math.log(max(math.prod(shape[k:]), 1)))

  return min(range(1, len(shape)), key=imbalance)


def matrix_shape(shape: Sequence[int]) -> tuple[int, int]:
  k = matrix_split(shape)
  return math.prod(shape[:k]), math.prod(shape[k:])


def is_low_rank(path: str, shape: Sequence[int], rank: int, compiled_pattern: Any) -> bool:
  """Whether a trained leaf gets a rank-`rank` update (see the module docstring)."""
  shape = tuple(shape)[layout.depth_axes(path) :]
  if len(shape) < 2 or not tree_lib.matches(path, compiled_pattern):
    return False
  return rank < min(matrix_shape(shape))


def is_factor_path(path: str) -> bool:
  """True for the factor leaves of the inner tree (what update-scaling by the param skips)."""
  return path.rsplit("/", 1)[-1] in FACTOR_NAMES


def low_rank_updates(
    inner: optax.GradientTransformation,
    rank: int,
    *,
    pattern: str = r".*/kernel",
    column_scale: bool = False,
    scale_floor: float = 1e-4,
    seed: int = 0,
) -> optax.GradientTransformation:
  """`inner` run on rank-`rank` factors of the matching leaves (and on the other leaves as they
  are); returns the params' updates. See the module docstring."""
  if isinstance(rank, bool) or not isinstance(rank, int) or rank <= 0:
    raise ValueError(f"optimizer.lora_rank={rank!r}: expected a positive integer (0 = off)")
  compiled = tree_lib.compile_patterns(pattern)

  def init_fn(params):
    param_leaves, low, treedef = _plan(params, rank, compiled)
    key = jax.random.PRNGKey(seed)
    factors = [
        optax.MaskedNode()
        if depth is None
        else _initial_factors(p, depth, (key, i), rank, column_scale, scale_floor)
        for i, (p, depth) in enumerate(zip(param_leaves, low))
    ]
    inner_state = inner.init(_inner_tree(param_leaves, factors, low, treedef))
    return LoraState(factors=treedef.unflatten(factors), inner=inner_state)

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError("low-rank updates need the params (tx.update(grads, state, params))")
    param_leaves, low, treedef = _plan(params, rank, compiled)
    factor_leaves = treedef.flatten_up_to(state.factors)
    inner_grads = [
        g if depth is None else _factor_grads(g, f)
        for g, f, depth in zip(treedef.flatten_up_to(updates), factor_leaves, low)
    ]
    inner_params = _inner_tree(param_leaves, factor_leaves, low, treedef)
    inner_updates, inner_state = inner.update(
        treedef.unflatten(inner_grads), state.inner, inner_params
    )
    out, new_factors = [], []
    for p, u, f, depth in zip(
        param_leaves, treedef.flatten_up_to(inner_updates), factor_leaves, low
    ):
      delta, f = (u, f) if depth is None else _stepped_factors(p, u, f)
      out.append(delta)
      new_factors.append(f)
    return treedef.unflatten(out), LoraState(
        factors=treedef.unflatten(new_factors), inner=inner_state
    )

  return optax.GradientTransformation(init_fn, update_fn)


def _plan(params: Any, rank: int, compiled: Any) -> tuple[list[Any], list[int | None], Any]:
  """(the param leaves, per leaf None (full steps) or its number of leading depth axes, the
  treedef)."""
  leaves_with_paths, treedef = jax.tree_util.tree_flatten_with_path(params)
  paths = [tree_lib.path_str(p) for p, _ in leaves_with_paths]
  low = [
      layout.depth_axes(path) if is_low_rank(path, tuple(x.shape), rank, compiled) else None
      for path, (_, x) in zip(paths, leaves_with_paths)
  ]
  return [x for _, x in leaves_with_paths], low, treedef


def _inner_tree(param_leaves: list, factor_leaves: list, low: list, treedef: Any) -> Any:
  """The tree the inner optimizer sees: each low-rank leaf replaced by its factors."""
  return treedef.unflatten(
      [
          {n: f[n] for n in FACTOR_NAMES} if depth is not None else p
          for p, f, depth in zip(param_leaves, factor_leaves, low)
      ]
  )


def _initial_factors(
    p: jax.Array,
    depth: int,
    key_and_index: tuple[jax.Array, int],
    rank: int,
    column_scale: bool,
    scale_floor: float,
) -> dict[str, jax.Array]:
  """Leaf i's factors at step 0: `lora_a` random (from fold_in(key, i)), `lora_b` zero (so no
  change yet), and the per-column `scale` (the kernel's column RMS with column_scale, else 1)."""
  lead = tuple(p.shape[:depth])
  m, n = matrix_shape(p.shape[depth:])
  w = jnp.asarray(p, jnp.float32).reshape(lead + (m, n))
  if column_scale:
    scale = jnp.maximum(jnp.sqrt(jnp.mean(jnp.square(w), axis=-2)), scale_floor)
  else:
    scale = jnp.ones(lead + (n,), jnp.float32)
  a = jax.random.normal(jax.random.fold_in(*key_and_index), lead + (m, rank), jnp.float32)
  return {
      "lora_a": a / math.sqrt(rank),
      "lora_b": jnp.zeros(lead + (rank, n), jnp.float32),
      "scale": scale,
  }


def _factor_grads(g: jax.Array, f: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
  """The gradients of a leaf's factors, from the (column-scaled) gradient of the leaf."""
  a, b, scale = f["lora_a"], f["lora_b"], f["scale"]
  gs = g.astype(jnp.float32).reshape(a.shape[:-1] + b.shape[-1:]) * scale[..., None, :]
  return {"lora_a": gs @ _t(b), "lora_b": _t(a) @ gs}


def _stepped_factors(
    p: jax.Array, u: Mapping[str, jax.Array], f: Mapping[str, jax.Array]
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """(the leaf's update, its new factors) after the inner optimizer's factor updates `u`."""
  a, b, scale = f["lora_a"], f["lora_b"], f["scale"]
  a2, b2 = a + u["lora_a"], b + u["lora_b"]
  # (a + ua)(b + ub) − ab, without subtracting two nearly equal products
  delta = (u["lora_a"] @ b2 + a @ u["lora_b"]) * scale[..., None, :]
  return delta.reshape(p.shape).astype(p.dtype), {"lora_a": a2, "lora_b": b2, "scale": scale}


def _t(x: jax.Array) -> jax.Array:
  return jnp.swapaxes(x, -1, -2)


def param_path(path: str) -> str:
  """The path of the param a leaf of the inner tree stands for (a factor's: its kernel's)."""
  return path.rsplit("/", 1)[0] if is_factor_path(path) else path


def factor_leaves_mask(inner_params: Any) -> Any:
  """True at every leaf of the inner tree that is not a factor (the full-rank leaves)."""
  return jax.tree_util.tree_map_with_path(
      lambda p, _: not is_factor_path(tree_lib.path_str(p)), inner_params
  )
