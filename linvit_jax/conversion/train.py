"""One generic stage runner: sharded state, a pure jitted step, optax, orbax resume, metrics.

A stage (distill_attention, finetune, ...) is a loss, the parameters it trains and a schedule;
this file knows nothing about what the loss computes. `run_stage` owns everything around it:

* the TrainState (step, params, opt_state, rng, non-finite counters) is created directly in its
  shardings (`jax.jit(init, out_shardings=...)`), or restored by orbax from
  `<workdir>/<stage>/checkpoints` — a killed run continues at its last checkpoint with the same
  data position (`batch_iter_fn(step)`) and RNG (`fold_in(rng, step)`), so it ends bit-identical
  to an uninterrupted one; a finished stage is skipped and returns its final params;
* `train_step(state, frozen, batch) -> (state, metrics)` (train_step.py) is pure, jitted once
  with explicit shardings and the state donated; gradient accumulation is a `lax.scan` inside it;
* a non-finite loss or gradient skips that update (params and optimizer state unchanged), is
  counted, and after `max_nonfinite_in_a_row` such steps in a row the stage stops with an error
  (stage_log.py);
* process 0 shows a tqdm bar and writes metrics.jsonl + TensorBoard events in `<workdir>/<stage>/`
  (stage_log.MetricsDrain);
* Ctrl-C (SIGINT) or SIGTERM (how Cloud TPU VMs and most schedulers announce a preemption)
  finishes the current step, saves a checkpoint and raises `preemption.StageInterrupted` (a
  KeyboardInterrupt; the CLI exits 128 + signal: 130 or 143): rerunning the same command resumes
  there (preemption.py); a full or unwritable disk is an `errors.WorkdirWriteError` (an OSError)
  naming the directory, raised after the previous checkpoint is known to be intact
  (stage_outputs.py).

Stage config (ConfigDict or dict; the fields it omits take config_lib's defaults:
stage_bookkeeping(steps) and OPTIMIZER_DEFAULTS):
    name, steps, batch_size (global), optimizer=dict(name="adamw"|"adam"|"sgd", lr, wd, b1, b2,
    eps, momentum, grad_clip, warmup_steps, schedule="cosine"|"linear"|"constant", end_lr_ratio,
    accum_steps, wd_pattern) (see optim.py), checkpoint_every, max_to_keep, log_every,
    eval_every, max_nonfinite_in_a_row, progress. Other fields (the loss's own settings) are
    ignored here.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp

from linvit_jax.configuration import config_lib
from linvit_jax.conversion import optim
from linvit_jax.conversion import preemption
from linvit_jax.conversion import stage_log
from linvit_jax.conversion import stage_outputs
from linvit_jax.conversion import train_step as step_lib
from linvit_jax.models.checkpoints import CheckpointError
from linvit_jax.runtime import metrics as metrics_lib
from linvit_jax.runtime import sharding as sharding_lib
from linvit_jax.runtime import tree as tree_lib

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
# The runner: plan, restore or create, compile, loop (a stage_log.MetricsDrain reads the metrics).


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
  create_state: Callable[[step_lib.Params], step_lib.TrainState]
  abstract_state: step_lib.TrainState
  state_sh: step_lib.TrainState
  frozen_sh: Any

  @property
  def total(self) -> int:
    return int(self.cfg["steps"])


def run_stage(
    *,
    stage_cfg: Any,
    loss_fn: step_lib.LossFn,
    init_params: step_lib.Params | Callable[[jax.Array], step_lib.Params],
    trainable_mask: Any,
    frozen: Any,
    batch_iter_fn: Callable[[int], Iterable[step_lib.Batch]],
    workdir: str,
    mesh: jax.sharding.Mesh,
    param_rules: sharding_lib.Rules | None = None,
    seed: int = 0,
    eval_fn: Callable[[step_lib.Params], Mapping[str, float]] | None = None,
    name: str | None = None,
    min_shard_size: int = sharding_lib.DEFAULT_MIN_SIZE,
) -> tuple[step_lib.Params, list[dict]]:
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
  outputs = stage_outputs.Outputs(plan.name, plan.stage_dir, int(plan.cfg["max_to_keep"]))
  with stage_outputs.closing(outputs), jax.set_mesh(mesh):
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
  create_state = functools.partial(step_lib.init_train_state, tx=tx, rng=train_rng)
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


def _restore_or_create(
    plan: _Plan, manager: ocp.CheckpointManager, init_params: Any
) -> step_lib.TrainState:
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


def _compile(plan: _Plan, loss_fn: step_lib.LossFn) -> Callable:
  """The stage's step, jitted once with explicit shardings and the state donated."""
  mesh = plan.mesh
  train_step = step_lib.make_train_step(
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


def _open_log(plan: _Plan, start: int, outputs: stage_outputs.Outputs) -> stage_log.MetricsDrain:
  """The stage's metrics log cut back to `start` (a killed run may have logged past its last
  checkpoint), and the drain that appends to it."""
  is_main = jax.process_index() == 0
  outputs.writer = metrics_lib.MetricWriter(plan.stage_dir, enabled=is_main, resume_step=start)
  # Every process reads the log (process 0 may be rewriting it: keep only rows <= start).
  history = [r for r in metrics_lib.read_jsonl(outputs.writer.path) if r.get("step", 0) <= start]
  return stage_log.MetricsDrain(
      plan.name,
      plan.cfg,
      start,
      outputs.writer,
      history,
      show_progress=bool(is_main and plan.cfg["progress"]),
  )


def _loop(
    plan: _Plan,
    state: step_lib.TrainState,
    frozen: Any,
    step_fn: Callable,
    batch_iter_fn: Callable[[int], Iterable[step_lib.Batch]],
    eval_fn: Callable[[step_lib.Params], Mapping[str, float]] | None,
    manager: ocp.CheckpointManager,
    drain: stage_log.MetricsDrain,
) -> step_lib.TrainState:
  """The Python loop around the jitted step, with an evaluation and a checkpoint when due. Ctrl-C
  or SIGTERM stop it at a step boundary, checkpointed (preemption.py)."""
  name, start, total = plan.name, drain.start, plan.total
  ckpt_every, eval_every = int(plan.cfg["checkpoint_every"]), int(plan.cfg["eval_every"])
  it: Iterator[step_lib.Batch] = iter(batch_iter_fn(start))
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
      batch = sharding_lib.make_global_batch(local, plan.mesh)
      if step == start:  # before the call: the state is donated to it
        drain.step_flops = _step_flops(step_fn, state, frozen, batch)
      state, device_metrics = step_fn(state, frozen, batch)
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


def _step_flops(step_fn: Callable, state: Any, frozen: Any, batch: Any) -> float | None:
  """XLA's FLOP count of one step on the whole global batch (the lowered program's cost
  analysis: no compile, the trace is jit's cached one); None where the backend gives none."""
  try:
    cost = step_fn.lower(state, frozen, batch).cost_analysis()
  except Exception as e:  # noqa: BLE001 (a backend without cost analysis: the rate alone is logged)
    logging.debug("no FLOP count for the step: %s", e)
    return None
  if isinstance(cost, (list, tuple)):  # older JAX: one dict per computation
    cost = cost[0] if cost else None
  flops = (cost or {}).get("flops")
  return float(flops) if flops and flops > 0 else None


# ------------------------------------------------------------------------------------------------
# Handing on.


def _handed_on(state: step_lib.TrainState, init_params: Any, plan: _Plan) -> step_lib.Params:
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
