"""One generic stage runner: sharded state, a pure jitted step, optax, orbax resume, metrics.

A stage (distill_attention, finetune, ...) is a loss, the parameters it trains and a schedule;
this file knows nothing about what the loss computes. `run_stage` owns everything around it:

* the TrainState (step, params, opt_state, rng, non-finite counters) is created directly in its
  shardings (`jax.jit(init, out_shardings=...)`), or restored by orbax from
  `<workdir>/<stage>/checkpoints` — a killed run continues at its last checkpoint with the same
  data position (`batch_iter_fn(step)`) and RNG (`fold_in(rng, step)`), so it ends bit-identical
  to an uninterrupted one; a finished stage is skipped and returns its final params;
* `train_step(state, frozen, batch) -> (state, metrics)` is pure, jitted once with explicit
  shardings and the state donated; gradient accumulation is a `lax.scan` inside it;
* a non-finite loss or gradient skips that update (params and optimizer state unchanged), is
  counted, and after `max_nonfinite_in_a_row` such steps in a row the stage stops with an error;
* process 0 shows a tqdm bar and writes metrics.jsonl + TensorBoard events in `<workdir>/<stage>/`;
* Ctrl-C (SIGINT) or SIGTERM (how Cloud TPU VMs and most schedulers announce a preemption)
  finishes the current step, saves a checkpoint and raises `preemption.StageInterrupted` (a
  KeyboardInterrupt; the CLI exits 128 + signal: 130 or 143): rerunning the same command resumes
  there (preemption.py); a full or unwritable disk is an `errors.WorkdirWriteError` (an OSError)
  naming the directory, raised after the previous checkpoint is known to be intact.

Stage config (ConfigDict or dict; the fields it omits take config_lib's defaults:
stage_bookkeeping(steps) and OPTIMIZER_DEFAULTS):
    name, steps, batch_size (global), optimizer=dict(name="adamw"|"adam"|"sgd", lr, wd, b1, b2,
    eps, momentum, grad_clip, warmup_steps, schedule="cosine"|"linear"|"constant", end_lr_ratio,
    accum_steps, wd_pattern) (see optim.py), checkpoint_every, max_to_keep, log_every,
    eval_every, max_nonfinite_in_a_row, progress. Other fields (the loss's own settings) are
    ignored here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import tqdm

from linvit_jax.configuration import config_lib
from linvit_jax.conversion import optim
from linvit_jax.conversion import preemption
from linvit_jax.models.checkpoints import CheckpointError
from linvit_jax.runtime import errors
from linvit_jax.runtime import metrics as metrics_lib
from linvit_jax.runtime import sharding as sharding_lib
from linvit_jax.runtime import tree as tree_lib
from linvit_jax.runtime.errors import UserError

Params = Any  # a pytree of arrays
Batch = Mapping[str, Any]
# loss_fn(params, frozen, batch, rng) -> (scalar loss, {name: scalar}); pure and jittable.
LossFn = Callable[[Params, Any, Batch, jax.Array], tuple[jax.Array, Mapping[str, jax.Array]]]

RESERVED_METRICS = ("loss", "grad_norm", "lr", "nonfinite", "nonfinite_total", "nonfinite_in_a_row")


class NonFiniteLossError(UserError, FloatingPointError):
  """The loss or gradients stayed non-finite for `max_nonfinite_in_a_row` steps."""


@flax.struct.dataclass
class TrainState:
  step: jax.Array  # int32 []: updates done = batches consumed
  params: Params
  opt_state: Any
  rng: jax.Array  # uint32 [2]: the stage's key; step s uses fold_in(rng, s)
  nonfinite_total: jax.Array  # int32 []: skipped updates so far
  nonfinite_in_a_row: jax.Array  # int32 []: skipped updates since the last good one


# ------------------------------------------------------------------------------------------------
# Config.


def _get(cfg: Mapping[str, Any], key: str, default: Any) -> Any:
  value = cfg.get(key, default)
  return default if value is None and default is not None else value  # a None field: the default


def stage_settings(stage_cfg: Any) -> dict[str, Any]:
  """The stage fields this runner uses, checked, with config_lib's defaults filled in.

  `stage_cfg`: the stage block as a dict, a ConfigDict or None."""
  stage_cfg = tree_lib.as_dict(stage_cfg)
  name = _get(stage_cfg, "name", None)
  s = {"name": name}
  for k in ("steps", "batch_size"):
    s[k] = _get(stage_cfg, k, None)
    if not isinstance(s[k], (int, np.integer)) or s[k] <= 0:
      raise ValueError(f"stage {name!r}: {k} must be a positive integer, got {s[k]!r}")
  s.update(
      {k: _get(stage_cfg, k, v) for k, v in config_lib.stage_bookkeeping(int(s["steps"])).items()}
  )
  s["start_weight"] = float(_get(stage_cfg, "start_weight", 0.0))
  if not 0.0 <= s["start_weight"] < 1.0:  # also rejects nan
    raise ValueError(
        f"stage {name!r}: start_weight={s['start_weight']!r}: expected in [0, 1) (the share of "
        "the starting params in what the stage hands on; 0 = its trained params)"
    )
  opt_cfg = _get(stage_cfg, "optimizer", None)
  try:
    s["optimizer"] = optim.optimizer_settings(opt_cfg)
  except ValueError as e:
    raise ValueError(f"stage {name!r}: {e}") from None
  opt_given = tree_lib.as_dict(opt_cfg)
  if "accum_steps" not in opt_given and _get(stage_cfg, "accum_steps", None):
    s["optimizer"]["accum_steps"] = int(_get(stage_cfg, "accum_steps", 1))
  return s


# ------------------------------------------------------------------------------------------------
# The step.


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

  def to_f32(tree):  # accumulate low-precision gradients in float32
    return jax.tree.map(
        lambda x: x.astype(jnp.float32) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree
    )

  def train_step(state: TrainState, frozen: Any, batch: Batch) -> tuple[TrainState, dict]:
    rng = jax.random.fold_in(state.rng, state.step)
    if accum_steps == 1:
      (loss, aux), grads = grad_fn(state.params, frozen, batch, rng)
    else:

      def split(x):
        x = x.reshape((x.shape[0] // accum_steps, accum_steps) + x.shape[1:]).swapaxes(0, 1)
        if micro_batch_sharding is not None:
          x = jax.lax.with_sharding_constraint(x, micro_batch_sharding)
        return x

      micro = jax.tree.map(split, batch)

      def one(i):
        mb = jax.tree.map(lambda x: x[i], micro)
        (l, a), g = grad_fn(state.params, frozen, mb, jax.random.fold_in(rng, i))
        return to_f32((l, a, g))

      def body(carry, i):
        return jax.tree.map(jnp.add, carry, one(i)), None

      total, _ = jax.lax.scan(body, one(0), jnp.arange(1, accum_steps))
      loss, aux, grads = jax.tree.map(lambda x: x / accum_steps, total)
      grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, state.params)

    grad_norm = optax.tree.norm(
        [g for g, m in zip(jax.tree.leaves(grads), jax.tree.leaves(trainable_mask)) if m]
    )
    ok = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    # A non-finite step leaves params and optimizer state (incl. its step count) untouched.
    keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(ok, n, o), new, old)
    in_a_row = jnp.where(ok, 0, state.nonfinite_in_a_row + 1)
    new_state = state.replace(
        step=state.step + 1,
        params=keep(params, state.params),
        opt_state=keep(opt_state, state.opt_state),
        nonfinite_total=state.nonfinite_total + (~ok).astype(jnp.int32),
        nonfinite_in_a_row=in_a_row,
    )
    metrics = {
        **aux,
        "loss": loss,
        "grad_norm": grad_norm,
        "lr": schedule(state.step),
        "nonfinite": (~ok).astype(jnp.int32),
        "nonfinite_total": new_state.nonfinite_total,
        "nonfinite_in_a_row": in_a_row,
    }
    return new_state, metrics

  return train_step


# ------------------------------------------------------------------------------------------------
# State placement.


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


# ------------------------------------------------------------------------------------------------
# The runner: plan, restore or create, compile, loop (a MetricsDrain reads the metrics).


@dataclasses.dataclass(frozen=True)
class _Plan:
  """What a stage is before anything is placed, worked out once from run_stage's arguments: its
  settings and directory, its optimizer, and the abstract train state with its shardings."""

  name: str
  cfg: dict[str, Any]  # stage_settings(stage_cfg)
  stage_dir: str
  mesh: jax.sharding.Mesh
  init_rng: jax.Array  # init_params(init_rng): also rebuilds a resumed stage's start (start_weight)
  mask: Any
  tx: optax.GradientTransformation
  schedule: optax.Schedule
  create_state: Callable[[Params], TrainState]
  abstract_state: TrainState
  state_sh: TrainState
  frozen_sh: Any

  @property
  def total(self) -> int:
    return int(self.cfg["steps"])


def run_stage(
    *,
    stage_cfg: Any,
    loss_fn: LossFn,
    init_params: Params | Callable[[jax.Array], Params],
    trainable_mask: Any,
    frozen: Any,
    batch_iter_fn: Callable[[int], Iterable[Batch]],
    workdir: str,
    mesh: jax.sharding.Mesh,
    param_rules: sharding_lib.Rules | None = None,
    seed: int = 0,
    eval_fn: Callable[[Params], Mapping[str, float]] | None = None,
    name: str | None = None,
    min_shard_size: int = sharding_lib.DEFAULT_MIN_SIZE,
) -> tuple[Params, list[dict]]:
  """Trains one stage (or resumes / skips it) and returns (its result, the logged metric rows).
  The result is the final params (their average with optimizer.ema_decay or average_last > 0), moved
  `start_weight` of the way back to the starting params (0 by default: not at all).

  Args:
    stage_cfg: the stage's config block (see the module docstring).
    loss_fn: `loss_fn(params, frozen, batch, rng) -> (loss, metrics)`, pure.
    init_params: the starting params (host or device arrays; global values on every process),
      or `init_params(rng) -> params` to create them directly sharded. Not used on resume.
    trainable_mask: what trains (optim.trainable_mask): None (all), a name in
      optim.STAGE_TRAINABLE, a path regex (re.fullmatch), a callable or a pytree of bools.
    frozen: arrays the loss reads but never trains (e.g. the teacher); sharded like params,
      not checkpointed (the caller can rebuild them). None for none.
    batch_iter_fn: `batch_iter_fn(start_step)` -> iterator of this process's numpy batches,
      starting at batch `start_step` (resume skips ahead).
    workdir: checkpoints and metrics go to `<workdir>/<name>/`.
    mesh: from `sharding.make_mesh`.
    param_rules: (regex, spec) overrides for parameter shardings (see sharding.py).
    seed: the stage's RNG seed (init key and per-step keys).
    eval_fn: `eval_fn(params) -> {name: float}`, called on all processes every `eval_every`
      steps and at the end; logged as "eval/<name>".
    name: the stage's directory name; defaults to `stage_cfg.name`.
  """
  frozen = {} if frozen is None else frozen
  plan = _plan(
      stage_cfg,
      name=name,
      workdir=workdir,
      mesh=mesh,
      seed=seed,
      init_params=init_params,
      trainable_mask=trainable_mask,
      frozen=frozen,
      param_rules=param_rules,
      min_shard_size=min_shard_size,
  )
  outputs = _Outputs(
      _checkpoint_manager(os.path.join(plan.stage_dir, "checkpoints"), int(plan.cfg["max_to_keep"]))
  )
  with _closing(outputs, plan), jax.set_mesh(mesh):
    state = _restore_or_create(plan, outputs.manager, init_params)
    start = int(jax.device_get(state.step))
    if start >= plan.total:  # finished by an earlier run: skipped
      log = os.path.join(plan.stage_dir, metrics_lib.METRICS_FILE)
      return _handed_on(state, init_params, plan), metrics_lib.read_jsonl(log)
    step_fn = _compile(plan, loss_fn)
    frozen = sharding_lib.shard_tree(frozen, plan.frozen_sh)
    drain = _open_log(plan, start, outputs)
    state = _loop(plan, state, frozen, step_fn, batch_iter_fn, eval_fn, outputs.manager, drain)
  return _handed_on(state, init_params, plan), drain.history


def _plan(
    stage_cfg: Any,
    *,
    name: str | None,
    workdir: str,
    mesh: jax.sharding.Mesh,
    seed: int,
    init_params: Any,
    trainable_mask: Any,
    frozen: Any,
    param_rules: sharding_lib.Rules | None,
    min_shard_size: int,
) -> _Plan:
  """Checks the stage's settings and works out its state's shapes and shardings (nothing placed)."""
  cfg = stage_settings(stage_cfg)
  name = name or cfg["name"]
  if not name:
    raise ValueError("run_stage: the stage needs a name (stage_cfg.name or name=...)")
  opt, total = cfg["optimizer"], int(cfg["steps"])
  accum = int(opt["accum_steps"])
  sharding_lib.check_batch_size(
      int(cfg["batch_size"]), mesh, accum_steps=accum, what=f"stage {name!r}: batch_size"
  )
  init_rng, train_rng = jax.random.split(jax.random.PRNGKey(seed))
  # Abstract state → shardings, without materializing anything.
  if callable(init_params):
    params_shapes = jax.eval_shape(init_params, init_rng)
  else:
    params_shapes = sharding_lib.abstract_tree(init_params)
  mask = optim.trainable_mask(params_shapes, trainable_mask)
  tx, schedule = optim.make_optimizer(opt, total, mask, seed=seed)
  create_state = functools.partial(init_train_state, tx=tx, rng=train_rng)
  abstract_state = jax.eval_shape(create_state, params_shapes)
  placement = (mesh, param_rules, min_shard_size)
  return _Plan(
      name=name,
      cfg=cfg,
      stage_dir=os.path.join(workdir, name),
      mesh=mesh,
      init_rng=init_rng,
      mask=mask,
      tx=tx,
      schedule=schedule,
      create_state=create_state,
      abstract_state=abstract_state,
      state_sh=sharding_lib.state_shardings(abstract_state, *placement),
      frozen_sh=sharding_lib.param_shardings(sharding_lib.abstract_tree(frozen), *placement),
  )


def _restore_or_create(plan: _Plan, manager: ocp.CheckpointManager, init_params: Any) -> TrainState:
  """The stage's state, in its shardings: its latest checkpoint's, or step 0 created in place."""
  latest = manager.latest_step()
  if latest is not None:
    target = sharding_lib.with_shardings(plan.abstract_state, plan.state_sh)
    try:
      state = manager.restore(latest, args=ocp.args.StandardRestore(target))
    except Exception as e:
      raise CheckpointError(
          f"stage {plan.name!r}: checkpoint step {latest} in "
          f"{os.path.join(plan.stage_dir, 'checkpoints')} does not fit this stage's "
          f"state (changed model, mask or optimizer?): {e}"
      ) from e
    if latest >= plan.total:
      logging.info("stage %r: already finished (checkpoint step %d); skipping", plan.name, latest)
    else:
      logging.info("stage %r: resuming from step %d of %d", plan.name, latest, plan.total)
    return state
  if callable(init_params):
    create = lambda r: plan.create_state(init_params(r))
    return jax.jit(create, out_shardings=plan.state_sh)(plan.init_rng)
  placed = sharding_lib.shard_tree(init_params, plan.state_sh.params)
  # Not donated: the caller's arrays (possibly shared with `frozen`) stay valid; jit's outputs
  # are fresh buffers, so the step's donation never frees the caller's arrays.
  return jax.jit(plan.create_state, out_shardings=plan.state_sh)(placed)


def _compile(plan: _Plan, loss_fn: LossFn) -> Callable:
  """The stage's step, jitted once with explicit shardings and the state donated."""
  mesh = plan.mesh
  train_step = make_train_step(
      loss_fn,
      plan.tx,
      plan.schedule,
      plan.mask,
      accum_steps=int(plan.cfg["optimizer"]["accum_steps"]),
      micro_batch_sharding=jax.sharding.NamedSharding(
          mesh, jax.sharding.PartitionSpec(None, sharding_lib.batch_axes(mesh) or None)
      ),
  )
  return jax.jit(
      train_step,
      in_shardings=(plan.state_sh, plan.frozen_sh, sharding_lib.batch_sharding(mesh)),
      out_shardings=(plan.state_sh, sharding_lib.replicated(mesh)),
      donate_argnums=(0,),
  )


def _open_log(plan: _Plan, start: int, outputs: _Outputs) -> MetricsDrain:
  """The stage's metrics log cut back to `start` (a killed run may have logged past its last
  checkpoint), and the drain that appends to it."""
  is_main = jax.process_index() == 0
  outputs.writer = metrics_lib.MetricWriter(plan.stage_dir, enabled=is_main, resume_step=start)
  # Every process reads the log (process 0 may be rewriting it: keep only rows <= start).
  history = [r for r in metrics_lib.read_jsonl(outputs.writer.path) if r.get("step", 0) <= start]
  return MetricsDrain(
      plan.name,
      plan.cfg,
      start,
      outputs.writer,
      history,
      show_progress=bool(is_main and plan.cfg["progress"]),
  )


def _loop(
    plan: _Plan,
    state: TrainState,
    frozen: Any,
    step_fn: Callable,
    batch_iter_fn: Callable[[int], Iterable[Batch]],
    eval_fn: Callable[[Params], Mapping[str, float]] | None,
    manager: ocp.CheckpointManager,
    drain: MetricsDrain,
) -> TrainState:
  """The Python loop around the jitted step, with an evaluation and a checkpoint when due. Ctrl-C
  or SIGTERM stop it at a step boundary, checkpointed (preemption.py)."""
  name, start, total = plan.name, drain.start, plan.total
  ckpt_every, eval_every = int(plan.cfg["checkpoint_every"]), int(plan.cfg["eval_every"])
  it: Iterator[Batch] = iter(batch_iter_fn(start))
  ctrl_c = preemption.DeferredInterrupt(every=drain.log_every)
  try:
    for step in range(start, total):
      if ctrl_c.stop_now(step):
        raise KeyboardInterrupt
      try:
        local = next(it)
      except StopIteration:
        raise RuntimeError(
            f"stage {name!r}: batch_iter_fn({start}) ran out of batches at step {step} of {total}"
        ) from None
      state, device_metrics = step_fn(
          state, frozen, sharding_lib.make_global_batch(local, plan.mesh)
      )
      done = step + 1
      drain.push(done, device_metrics)
      if eval_fn is not None and ((eval_every and done % eval_every == 0) or done == total):
        scores = eval_fn(optim.stage_result(state.params, state.opt_state))
        drain.write(done, {f"eval/{k}": v for k, v in scores.items()})
      if (ckpt_every and done % ckpt_every == 0) or done == total:
        drain.drain()  # never checkpoint past a stop the metrics would have called for
        manager.save(done, args=ocp.args.StandardSave(state))
    drain.drain()
    if ctrl_c.stop_now(total, last=True):  # came during the last step: the stage is saved, stop
      raise KeyboardInterrupt
  except KeyboardInterrupt:
    drain.close()
    drain.drain()  # log the last finished step (or stop, if it called for a stop)
    raise preemption.stage_interrupted(name, total, state, manager, ctrl_c.signum) from None
  finally:
    drain.close()
    ctrl_c.restore()
  return state


class MetricsDrain:
  """A stage's metrics on the host: each step's are read one step late (`push`), so the device
  keeps working while the host prepares the next batch. Reading a step advances the progress bar,
  logs a row every `log_every` steps (and at the first, the last and every non-finite step) and
  stops the stage after `max_nonfinite_in_a_row` non-finite steps in a row. Every row also goes to
  `history`, the rows run_stage returns."""

  def __init__(
      self,
      name: str,
      cfg: Mapping[str, Any],
      start: int,
      writer: metrics_lib.MetricWriter,
      history: list[dict],
      *,
      show_progress: bool,
  ):
    self.name, self.start, self.total = name, start, int(cfg["steps"])
    self.log_every = max(int(cfg["log_every"]), 1)
    self.history = history
    self._max_bad = int(cfg["max_nonfinite_in_a_row"])
    self._batch_size = int(cfg["batch_size"])
    self._writer = writer
    self.bar = tqdm.tqdm(
        total=self.total,
        initial=start,
        desc=name,
        dynamic_ncols=True,
        mininterval=1.0,
        disable=not show_progress,
    )
    self._since = (time.perf_counter(), start)  # (time, step) of the last row: its rate
    self._pending = None  # (step, device metrics) not read yet

  def push(self, step: int, device_metrics: Mapping[str, jax.Array]) -> None:
    """Queues `step`'s metrics after reading the previous step's."""
    self.drain()
    self._pending = (step, device_metrics)

  def drain(self) -> None:
    """Reads the queued step's metrics now (before a checkpoint, or when the stage stops)."""
    if self._pending is not None:
      self._read(*self._pending)
      self._pending = None

  def write(self, step: int, scalars: Mapping[str, Any]) -> None:
    """Logs a row of other scalars (an evaluation's) at `step`."""
    self.history.append(self._writer.write(step, scalars))

  def close(self) -> None:
    self.bar.close()

  def _read(self, step: int, device_metrics: Mapping[str, jax.Array]) -> None:
    m = {k: np.asarray(v) for k, v in jax.device_get(device_metrics).items()}
    self.bar.update(1)
    bad = bool(m["nonfinite"])
    if step % self.log_every == 0 or step == self.total or step == self.start + 1 or bad:
      now, (then, then_step) = time.perf_counter(), self._since
      rate = (step - then_step) / max(now - then, 1e-9)
      self._since = (now, step)
      self.write(step, {**m, "steps_per_sec": rate, "examples_per_sec": rate * self._batch_size})
      self.bar.set_postfix(loss=f"{float(m['loss']):.4g}", refresh=False)
    if bad:
      self._skipped(step, m)

  def _skipped(self, step: int, m: Mapping[str, np.ndarray]) -> None:
    in_a_row = int(m["nonfinite_in_a_row"])
    logging.warning(
        "stage %r step %d: non-finite loss %s / grad norm %s; update skipped "
        "(%d in a row, %d in total)",
        self.name,
        step,
        m["loss"],
        m["grad_norm"],
        in_a_row,
        int(m["nonfinite_total"]),
    )
    if in_a_row >= self._max_bad:
      self._writer.flush()
      raise NonFiniteLossError(
          f"stage {self.name!r}: the loss or its gradients were non-finite for {in_a_row} steps "
          f"in a row (steps {step - in_a_row + 1}..{step}); those updates were skipped, so the "
          f"params are those of step {step - in_a_row}. Lower optimizer.lr, add "
          f"optimizer.grad_clip, check the data, or raise stage.max_nonfinite_in_a_row "
          f"(={self._max_bad})."
      )


# ------------------------------------------------------------------------------------------------
# Handing on, closing, disk errors.


def _handed_on(state: TrainState, init_params: Any, plan: _Plan) -> Params:
  """The stage's result: its params (or their moving average), moved `start_weight` of the way
  back to where the stage started (rebuilt from `init_params` on a resumed or skipped stage)."""
  result = optim.stage_result(state.params, state.opt_state)
  w = plan.cfg["start_weight"]
  if not w:
    return result
  start = jax.jit(init_params)(plan.init_rng) if callable(init_params) else init_params
  return jax.jit(
      lambda a, b: jax.tree.map(
          lambda x, y: ((1.0 - w) * x.astype(jnp.float32) + w * y.astype(jnp.float32)).astype(
              x.dtype
          ),
          a,
          b,
      )
  )(result, start)


def _checkpoint_manager(directory: str, max_to_keep: int) -> ocp.CheckpointManager:
  options = ocp.CheckpointManagerOptions(
      max_to_keep=max_to_keep,
      create=True,
      cleanup_tmp_directories=True,  # a write cut short by a kill is discarded on restart
      enable_async_checkpointing=True,
  )
  return ocp.CheckpointManager(
      os.path.abspath(directory) if "://" not in directory else directory, options=options
  )


class _Outputs:
  """What a stage writes to: its checkpoint manager and, once the start step is known, its
  metrics writer; closed together however the stage ends."""

  def __init__(self, manager: ocp.CheckpointManager):
    self.manager = manager
    self.writer: metrics_lib.MetricWriter | None = None

  def close(self, *, failed: bool) -> None:
    """Waits for pending saves and closes; when the stage already failed, a second error here
    (typically the same full disk) is logged instead of hiding the first one."""
    writer = self.writer
    for close in (
        self.manager.wait_until_finished,
        self.manager.close,
        writer.close if writer is not None else None,
    ):
      if close is None:
        continue
      try:
        close()
      except Exception as e:
        if not failed:
          raise
        logging.warning("while stopping after an error: %s: %s", type(e).__name__, e)


@contextlib.contextmanager
def _closing(outputs: _Outputs, plan: _Plan) -> Iterator[None]:
  """Closes the stage's outputs however it ends (the last save completes here); a full or
  unwritable disk becomes an errors.WorkdirWriteError naming the directory, raised once the
  previous checkpoint is known to be intact."""
  try:
    yield
  except Exception as e:
    outputs.close(failed=True)
    code = None if isinstance(e, CheckpointError) else errors.disk_error_code(e)
    if code is None:
      raise
    raise _write_error(plan.name, plan.stage_dir, code) from e
  except BaseException:  # Ctrl-C (already checkpointed by the loop), SystemExit
    outputs.close(failed=True)
    raise
  try:
    outputs.close(failed=False)
  except Exception as e:
    code = errors.disk_error_code(e)
    if code is None:
      raise
    raise _write_error(plan.name, plan.stage_dir, code) from e


def _write_error(name: str, stage_dir: str, code: int) -> errors.WorkdirWriteError:
  try:  # what is on disk now (a fresh read-only manager; the stage's own one is closed)
    with ocp.CheckpointManager(
        os.path.join(stage_dir, "checkpoints"), options=ocp.CheckpointManagerOptions(read_only=True)
    ) as m:
      steps = m.all_steps()
  except Exception:
    steps = []
  kept = (
      f"the last complete checkpoint (step {max(steps)}) is intact and a rerun resumes from " "it"
      if steps
      else "no complete checkpoint of this stage exists yet"
  )
  return errors.WorkdirWriteError(
      f"stage {name!r}: cannot write checkpoints/metrics in {stage_dir!r}: "
      f"{errors.DISK_ERRORS[code]}. "
      f"Free space or pass another --workdir; {kept}.",
      code,
  )
