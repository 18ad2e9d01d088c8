"""A stage's train state and its pure step: what `train.run_stage` jits once and calls each step.

* `TrainState` (step, params, opt_state, rng, non-finite counters) is the pytree orbax
  checkpoints; its fields are the checkpoint layout, so renaming one breaks resuming old workdirs;
* `init_train_state` is step 0 (jit it with out_shardings to create it in place);
* `make_train_step(...)` gives `train_step(state, frozen, batch) -> (state, metrics)`: gradient
  accumulation is a `lax.scan` inside it, and a non-finite loss or gradient skips that update
  (params and optimizer state unchanged) and is counted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax

Params = Any  # a pytree of arrays
Batch = Mapping[str, Any]
# loss_fn(params, frozen, batch, rng) -> (scalar loss, {name: scalar}); pure and jittable.
LossFn = Callable[[Params, Any, Batch, jax.Array], tuple[jax.Array, Mapping[str, jax.Array]]]

RESERVED_METRICS = ("loss", "grad_norm", "lr", "nonfinite", "nonfinite_total", "nonfinite_in_a_row")


@flax.struct.dataclass
class TrainState:
  step: jax.Array  # int32 []: updates done = batches consumed
  params: Params
  opt_state: Any
  rng: jax.Array  # uint32 [2]: the stage's key; step s uses fold_in(rng, s)
  nonfinite_total: jax.Array  # int32 []: skipped updates so far
  nonfinite_in_a_row: jax.Array  # int32 []: skipped updates since the last good one


def init_train_state(
    params: Params, tx: optax.GradientTransformation, rng: jax.Array
) -> TrainState:
  """Step 0 of a stage (jit it with out_shardings to create it in place)."""
  return TrainState(
      step=jnp.zeros((), jnp.int32),
      params=params,
      opt_state=tx.init(params),
      rng=rng,
      nonfinite_total=jnp.zeros((), jnp.int32),
      nonfinite_in_a_row=jnp.zeros((), jnp.int32),
  )


def make_train_step(
    loss_fn: LossFn,
    tx: optax.GradientTransformation,
    schedule: optax.Schedule,
    trainable_mask: Any,
    *,
    accum_steps: int = 1,
    micro_batch_sharding: Any = None,
) -> Callable:
  """`train_step(state, frozen, batch) -> (state, metrics)`, pure; jit it with shardings.

  `tx` alone freezes what `trainable_mask` leaves out (optim.masked_optimizer: a zero update, no
  state). Their gradients are computed but read by nothing (grad_norm covers the trained leaves
  only), so XLA drops them: the compiled step costs what one with stop_gradient on them costs.
  With accum_steps > 1 the batch is split into strided micro-batches (rows j, j+k, j+2k, ... so
  each stays evenly sharded without moving data) whose gradients are averaged.
  """

  def loss_of_params(params, frozen, batch, rng):
    loss, aux = loss_fn(params, frozen, batch, rng)
    return loss, dict(aux)

  grad_fn = jax.value_and_grad(loss_of_params, has_aux=True)
  if accum_steps > 1:
    grad_fn = _averaged_over_micro_batches(grad_fn, accum_steps, micro_batch_sharding)

  def train_step(state: TrainState, frozen: Any, batch: Batch) -> tuple[TrainState, dict]:
    rng = jax.random.fold_in(state.rng, state.step)
    (loss, aux), grads = grad_fn(state.params, frozen, batch, rng)
    new_state, grad_norm, ok = _update_unless_nonfinite(state, tx, trainable_mask, loss, grads)
    metrics = {
        **aux,
        "loss": loss,
        "grad_norm": grad_norm,
        "lr": schedule(state.step),
        "nonfinite": (~ok).astype(jnp.int32),
        "nonfinite_total": new_state.nonfinite_total,
        "nonfinite_in_a_row": new_state.nonfinite_in_a_row,
    }
    return new_state, metrics

  return train_step


def _averaged_over_micro_batches(grad_fn: Callable, accum_steps: int, sharding: Any) -> Callable:
  """`grad_fn` over `accum_steps` strided micro-batches of the batch, summed in float32 by a
  `lax.scan` and averaged; micro-batch i uses `fold_in(rng, i)`. The gradients come back in
  their params' dtype."""

  def to_f32(tree):  # accumulate low-precision gradients in float32
    return jax.tree.map(
        lambda x: x.astype(jnp.float32) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree
    )

  def split(x):
    x = x.reshape((x.shape[0] // accum_steps, accum_steps) + x.shape[1:]).swapaxes(0, 1)
    if sharding is not None:
      x = jax.lax.with_sharding_constraint(x, sharding)
    return x

  def averaged(params, frozen, batch, rng):
    micro = jax.tree.map(split, batch)

    def one(i):
      mb = jax.tree.map(lambda x: x[i], micro)
      (l, a), g = grad_fn(params, frozen, mb, jax.random.fold_in(rng, i))
      return to_f32((l, a, g))

    def body(carry, i):
      return jax.tree.map(jnp.add, carry, one(i)), None

    total, _ = jax.lax.scan(body, one(0), jnp.arange(1, accum_steps))
    loss, aux, grads = jax.tree.map(lambda x: x / accum_steps, total)
    grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params)
    return (loss, aux), grads

  return averaged


def _update_unless_nonfinite(
    state: TrainState,
    tx: optax.GradientTransformation,
    trainable_mask: Any,
    loss: jax.Array,
    grads: Params,
) -> tuple[TrainState, jax.Array, jax.Array]:
  """(the next state, the trained leaves' gradient norm, whether loss and norm are finite). A
  non-finite step leaves params and optimizer state (incl. its step count) untouched and is
  counted."""
  grad_norm = optax.tree.norm(
      [g for g, m in zip(jax.tree.leaves(grads), jax.tree.leaves(trainable_mask)) if m]
  )
  ok = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(ok, n, o), new, old)
  in_a_row = jnp.where(ok, 0, state.nonfinite_in_a_row + 1)
  new_state = state.replace(
      step=state.step + 1,
      params=keep(params, state.params),
      opt_state=keep(opt_state, state.opt_state),
      nonfinite_total=state.nonfinite_total + (~ok).astype(jnp.int32),
      nonfinite_in_a_row=in_a_row,
  )
  return new_state, grad_norm, ok
