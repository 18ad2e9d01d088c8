"""What a stage trains and how: trainable masks, the learning-rate schedule and the optimizer.

The optimizer is big_vision's (its optax.make) on the trained leaves:

    clip_by_global_norm → scale_by_adam (sgd: trace) → [× column RMS of the param, when
      update_scale="param_rms"] → scale(lr) → add_decayed_weights(wd)
      → scale_by_schedule(schedule / lr) → scale(-1)

so weight decay is decoupled and follows the schedule's shape only (see
config_lib.OPTIMIZER_DEFAULTS, where every field's default lives). Frozen leaves go through
`optax.set_to_zero` instead (`masked_optimizer`): a zero update and no optimizer state, the one
place where the trainable mask acts (the step differentiates every leaf; XLA drops the gradients
nothing reads). With `ema_decay` > 0, `param_ema` follows the chain and keeps a moving average of
the params in the optimizer state (with `average_last` > 0, `tail_average`: the uniform average
over the schedule's tail); `stage_result` is what the stage hands on.

With `lora_rank` r > 0 that chain steps rank-r factors of every trained kernel instead of the
kernel itself, and the kernel moves by the change of their product (lora.low_rank_updates).

A trainable mask is a pytree of Python bools like the params (`trainable_mask`), from None (all),
a name in STAGE_TRAINABLE, a path regex (re.fullmatch on '/'-joined paths, as every path regex of
the project), a callable or a pytree.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from linvit_jax.configuration import config_lib
from linvit_jax.conversion import lora
from linvit_jax.models import layout
from linvit_jax.runtime import tree as tree_lib

Params = Any  # a pytree of arrays (or ShapeDtypeStructs)

# Named trainable masks (re.fullmatch on '/'-joined paths; per-block or scanned trees). The names
# come from models/layout.py, so a lever module listed there is in every attention mask.
_ATTENTION = layout.attention_re()
STAGE_TRAINABLE = {
    "distill_attention": _ATTENTION,  # q/k/v/out and the feature maps of every encoder block
    "attention": _ATTENTION,
    # Only what routes (q/k, the feature maps, the lever params): v and out keep the teacher's
    # values, so Adam's scale-free steps cannot move the out projection's LayerScale-sized columns.
    "attention_routing": layout.attention_re(("query", "key") + layout.LINEAR_ONLY),
    # Everything but q/k (LoLCATs' stage 1 trains φ with q/k/v/o frozen): the linear branch
    # adapts through the feature maps' own per-head maps, and what reads q/k exactly (the exact
    # prefix rows, a window, sinks) keeps the teacher's softmax scores.
    "attention_features": layout.attention_re(("value", "out") + layout.LINEAR_ONLY),
    "finetune": r".*",
    "all": r".*",
}


# ------------------------------------------------------------------------------------------------
# Which parameters train.


def trainable_mask(params: Params, spec: Any = None) -> Any:
  """A pytree of Python bools like `params`: True where the stage trains the leaf.

  `spec`: None (every leaf), a name in STAGE_TRAINABLE, a path regex (re.fullmatch), a callable
  `params -> mask`, or a pytree of bools like params. A mask that selects nothing is an error.
  """
  if spec is None:
    out = jax.tree.map(lambda _: True, params)
  elif isinstance(spec, str):
    out = tree_lib.regex_mask(params, STAGE_TRAINABLE.get(spec, spec))
  elif callable(spec):
    out = spec(params)
  else:
    out = spec
  expected, got = jax.tree.structure(params), jax.tree.structure(out)
  if got != expected:
    raise ValueError(
        f"trainable_mask does not match the params tree:\n  params: {expected}\n" f"  mask:   {got}"
    )
  out = jax.tree.map(bool, out)
  if not any(jax.tree.leaves(out)):
    what = f" {spec!r}" if isinstance(spec, str) else ""
    raise ValueError(f"trainable_mask{what} selects no parameters: the stage would train nothing")
  return out


def masked_optimizer(tx: optax.GradientTransformation, mask: Any) -> optax.GradientTransformation:
  """`tx` on the leaves where `mask` is True; exactly zero updates and no state elsewhere."""
  labels = jax.tree.map(lambda m: "trained" if m else "frozen", mask)
  return optax.multi_transform({"trained": tx, "frozen": optax.set_to_zero()}, labels)


# ------------------------------------------------------------------------------------------------
# Schedule and optimizer.


def optimizer_settings(opt_cfg: Any) -> dict[str, Any]:
  """An optimizer block (dict, ConfigDict or None) with every field: those it omits or leaves
  None come from config_lib.OPTIMIZER_DEFAULTS; a field not there is an error (a typo)."""
  opt_cfg = tree_lib.as_dict(opt_cfg)
  defaults = config_lib.OPTIMIZER_DEFAULTS
  unknown = sorted(set(opt_cfg) - set(defaults))
  if unknown:
    raise ValueError(f"unknown optimizer field(s) {unknown}; known: {sorted(defaults)}")
  return {**defaults, **{k: v for k, v in opt_cfg.items() if v is not None}}


def make_schedule(opt: Mapping[str, Any], total_steps: int) -> optax.Schedule:
  """Linear warmup from 0 to `lr` over warmup_steps, then cosine / linear decay or constant.
  Fields `opt` omits take their config_lib.OPTIMIZER_DEFAULTS."""
  opt = {**config_lib.OPTIMIZER_DEFAULTS, **opt}
  lr, warmup = float(opt["lr"]), int(opt["warmup_steps"])
  end = lr * float(opt["end_lr_ratio"])
  kind = opt["schedule"]
  if kind == "cosine":
    return optax.warmup_cosine_decay_schedule(0.0, lr, warmup, max(total_steps, warmup + 1), end)
  if kind in ("linear", "constant"):
    decay = (
        optax.linear_schedule(lr, end, max(total_steps - warmup, 1))
        if kind == "linear"
        else optax.constant_schedule(lr)
    )
    if warmup == 0:
      return decay
    return optax.join_schedules([optax.linear_schedule(0.0, lr, warmup), decay], [warmup])
  raise ValueError(f"optimizer.schedule={kind!r}: expected 'cosine', 'linear' or 'constant'")


def _decay_mask(pattern: str | None) -> Callable[[Params], Any]:
  # A function of the params the inner optimizer sees (frozen leaves are optax.MaskedNode there,
  # subtrees without leaves, so they get no mask entry either).
  # Low-rank factors (lora.py) are decayed when their kernel's path is: that pulls the kernel
  # back towards where the stage started, as AdamW does to LoRA factors.
  if pattern is None:  # the pre-big_vision convention, kept for callers that ask for it
    return lambda p: jax.tree.map(lambda x: x.ndim >= 2, p)
  compiled = tree_lib.compile_patterns(pattern)
  return lambda p: jax.tree_util.tree_map_with_path(
      lambda path, _: tree_lib.matches(lora.param_path(tree_lib.path_str(path)), compiled), p
  )


def column_rms(param: jax.Array, floor: float, depth_axes: int = 0) -> jax.Array:
  """RMS of `param` over every axis but the last (a vector: over all of it), at least `floor`;
  broadcastable against `param`. For a Dense kernel [in, out] (or DenseGeneral [h, d, out]) that is
  one scale per output column, the axis a folded LayerScale scales. The first `depth_axes` axes
  (a scanned encoder's layer axis: layout.depth_axes) are kept: each layer has its own scales."""
  x = param.astype(jnp.float32)
  inner_ndim = x.ndim - depth_axes
  if inner_ndim <= 1:
    axes = tuple(range(depth_axes, x.ndim))
  else:
    axes = tuple(range(depth_axes, x.ndim - 1))
  rms = jnp.sqrt(jnp.mean(jnp.square(x), axis=axes, keepdims=True)) if axes else jnp.abs(x)
  return jnp.maximum(rms, floor)


def scale_by_param_rms(floor: float = 1e-4) -> optax.GradientTransformation:
  """Multiply each update by its parameter's current column RMS (`column_rms`): relative steps.

  Adam's direction has entries of size ~1 whatever the parameter's scale, so at one lr a column
  whose entries are 1e-5 (a LayerScale of 2e-4 folded into an out projection) moves by many times
  its own size while a column of 0.05 barely moves. Scaled by the column RMS, both move by the
  same fraction (Adafactor's parameter-scale rule, per column; `floor` lets zero-initialised
  leaves move at all)."""

  def init_fn(params):
    del params
    return optax.EmptyState()

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError("scale_by_param_rms needs the params (tx.update(grads, state, params))")
    updates = jax.tree_util.tree_map_with_path(
        lambda path, u, p: u
        * column_rms(p, floor, layout.depth_axes(tree_lib.path_str(path))).astype(u.dtype),
        updates,
        params,
    )
    return updates, state

  return optax.GradientTransformation(init_fn, update_fn)


class ParamEmaState(NamedTuple):
  count: jax.Array  # int32 []: updates averaged so far
  ema: Params  # float32, like params


def param_ema(decay: float) -> optax.GradientTransformation:
  """Keeps an exponential moving average of the params after each update, in its state; passes
  the updates through unchanged. Last in the chain, it sees the final update u_t and the params
  p_t before it: ema ← β·ema + (1 − β)·(p_t + u_t), β = min(decay, (1 + t) / (10 + t)) (the
  warm-up keeps the start from dominating a short stage). The average starts at the params."""
  if not 0.0 <= decay < 1.0:
    raise ValueError(f"optimizer.ema_decay={decay!r}: expected in [0, 1) (0 = off)")
  return _param_average(lambda t: jnp.minimum(decay, (1.0 + t) / (10.0 + t)))


def tail_average(total_steps: int, fraction: float) -> optax.GradientTransformation:
  """Keeps the uniform average of the params after each of the last ⌈fraction · total_steps⌉
  updates (stochastic weight averaging's average, over the tail of one schedule), in the same
  state as `param_ema`; before the tail the state follows the params. Under a decaying
  schedule the tail still moves, so the average spans several points of the walk, where an EMA
  capped by its warm-up only sees the last few dozen nearly frozen steps of a short stage."""
  if not 0.0 < fraction <= 1.0:
    raise ValueError(f"optimizer.average_last={fraction!r}: expected in (0, 1] (0 = off)")
  first = total_steps - max(1, math.ceil(fraction * total_steps))  # the tail's first update

  def beta(t):
    n = t - first  # updates of the tail averaged before this one
    return jnp.where(n < 0, 0.0, n / (n + 1.0))

  return _param_average(beta)


def _param_average(
    beta_of_step: Callable[[jax.Array], jax.Array],
) -> optax.GradientTransformation:
  """ema ← β_t·ema + (1 − β_t)·(p_t + u_t) after update t (counted from 0); updates unchanged."""

  def init_fn(params):
    ema = jax.tree.map(lambda p: jnp.asarray(p, jnp.float32), params)
    return ParamEmaState(count=jnp.zeros((), jnp.int32), ema=ema)

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError("a param average needs the params (tx.update(grads, state, params))")
    beta = beta_of_step(state.count.astype(jnp.float32))
    ema = jax.tree.map(
        lambda e, p, u: beta * e + (1.0 - beta) * (p.astype(jnp.float32) + u.astype(jnp.float32)),
        state.ema,
        params,
        updates,
    )
    return updates, ParamEmaState(count=state.count + 1, ema=ema)

  return optax.GradientTransformation(init_fn, update_fn)


def stage_result(params: Params, opt_state: Any) -> Params:
  """What a stage hands on: its params, or (optimizer.ema_decay or average_last > 0) their
  average, cast to each param's dtype."""
  found = [
      s
      for s in jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(x, ParamEmaState))
      if isinstance(s, ParamEmaState)
  ]
  if not found:
    return params
  return jax.tree.map(lambda e, p: e.astype(p.dtype), found[0].ema, params)


def make_optimizer(
    opt: Mapping[str, Any], total_steps: int, trainable_mask: Any, *, seed: int = 0
) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """big_vision's optimizer chain (its optax.make) for the trained leaves: clip → scale_by_adam
  (or sgd momentum) → scale(lr) → add_decayed_weights(wd, wd_pattern) → schedule shape → descent.
  "adamw" and "adam" are the same chain (decay is always decoupled, as in big_vision); frozen
  leaves get a zero update and no optimizer state. Fields `opt` omits take their
  config_lib.OPTIMIZER_DEFAULTS. `seed` draws LoRA's fixed A factors (the run's stage seed, so
  that seeds vary every random draw). Returns (tx, schedule)."""
  opt = {**config_lib.OPTIMIZER_DEFAULTS, **opt}
  schedule = make_schedule(opt, total_steps)
  lr = float(opt["lr"])
  if lr <= 0:
    raise ValueError(f"optimizer.lr={lr!r}: must be positive (freeze parameters with the mask)")
  name = opt["name"]
  if name in ("adamw", "adam"):
    direction = optax.scale_by_adam(b1=opt["b1"], b2=opt["b2"], eps=opt["eps"])
  elif name == "sgd":
    direction = optax.trace(decay=opt["momentum"]) if opt["momentum"] else optax.identity()
  else:
    raise ValueError(f"optimizer.name={name!r}: expected 'adamw', 'adam' or 'sgd'")
  parts = []
  if opt["grad_clip"]:
    parts.append(optax.clip_by_global_norm(float(opt["grad_clip"])))
  parts += [direction]
  rank = opt["lora_rank"]  # checked by lora.low_rank_updates when not 0
  if opt["update_scale"] == "param_rms":
    by_rms = scale_by_param_rms(float(opt["param_scale_floor"]))
    # Low-rank factors get their column scale from the product (lora.low_rank_updates).
    parts.append(optax.masked(by_rms, lora.factor_leaves_mask) if rank else by_rms)
  elif opt["update_scale"] != "absolute":
    raise ValueError(
        f"optimizer.update_scale={opt['update_scale']!r}: expected 'absolute' or 'param_rms'"
    )
  parts.append(optax.scale(lr))
  if opt["wd"]:
    parts.append(optax.add_decayed_weights(float(opt["wd"]), _decay_mask(opt["wd_pattern"])))
  parts += [optax.scale_by_schedule(lambda step: schedule(step) / lr), optax.scale(-1.0)]
  inner = optax.chain(*parts)
  if rank:
    inner = lora.low_rank_updates(
        inner,
        rank,
        column_scale=opt["update_scale"] == "param_rms",
        scale_floor=float(opt["param_scale_floor"]),
        seed=seed,
    )
  tx = masked_optimizer(inner, trainable_mask)
  if opt["ema_decay"] and opt["average_last"]:
    raise ValueError(
        f"optimizer.ema_decay={opt['ema_decay']!r} and optimizer.average_last="
        f"{opt['average_last']!r}: choose one average (set the other to 0)"
    )
  # Outside the mask: frozen leaves average to themselves.
  if opt["ema_decay"]:
    tx = optax.chain(tx, param_ema(float(opt["ema_decay"])))
  elif opt["average_last"]:
    tx = optax.chain(tx, tail_average(int(total_steps), float(opt["average_last"])))
  return tx, schedule
