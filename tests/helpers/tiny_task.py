"""A tiny deterministic training task for the runner's tests, importable and runnable.

An MLP student learns to match a fixed linear "teacher" (passed as `frozen`) on Gaussian inputs
generated from the step index alone, with RNG noise on the inputs so that resume must restore the
RNG exactly. One leaf (`Dense_0/bias`) is frozen by the trainable mask.

As a script (one process, or one of several with JAX_COORDINATOR_ADDRESS & co. set):
  python tests/helpers/tiny_task.py --workdir W --out OUT.json --mesh 8,1 --mesh 4,2
      [--steps 5] [--checkpoint_every 0] [--sleep 0] [--progress_file F]
Writes OUT.json (losses per mesh) and OUT.<mesh>.npz (final params) on process 0.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

IN, HIDDEN, OUT = 16, 256, 4
GLOBAL_BATCH = 16
MIN_SHARD_SIZE = 1024  # small enough that the MLP kernels are fsdp-sharded in the tests


def init_params(rng):
  import jax
  import jax.numpy as jnp

  k0, k1 = jax.random.split(rng)
  return {
      "Dense_0": {
          "kernel": jax.random.normal(k0, (IN, HIDDEN), jnp.float32) / np.sqrt(IN),
          "bias": jnp.full((HIDDEN,), 0.01, jnp.float32),
      },
      "Dense_1": {
          "kernel": jax.random.normal(k1, (HIDDEN, OUT), jnp.float32) / np.sqrt(HIDDEN),
          "bias": jnp.zeros((OUT,), jnp.float32),
      },
  }


TRAINABLE = r"(?!Dense_0/bias$).*"  # everything except Dense_0/bias (re.fullmatch)


def frozen_teacher():
  return {"w": np.random.default_rng(1234).normal(size=(IN, OUT)).astype(np.float32)}


def loss_fn(params, frozen, batch, rng, noise=0.1):
  import jax
  import jax.numpy as jnp

  x = batch["x"]
  target = x @ frozen["w"]
  if noise:
    x = x + noise * jax.random.normal(rng, x.shape)
  h = jax.nn.gelu(x @ params["Dense_0"]["kernel"] + params["Dense_0"]["bias"])
  y = h @ params["Dense_1"]["kernel"] + params["Dense_1"]["bias"]
  loss = jnp.mean((y - target) ** 2)
  return loss, {"target_rms": jnp.sqrt(jnp.mean(target**2))}


def global_batch(step: int, batch_size: int = GLOBAL_BATCH) -> dict[str, np.ndarray]:
  return {"x": np.random.default_rng(step).normal(size=(batch_size, IN)).astype(np.float32)}


def batch_iter_fn(
    rows: slice | None = None,
    batch_size: int = GLOBAL_BATCH,
    nan_steps=(),
    sleep: float = 0.0,
    progress_file: str | None = None,
):
  """Per-process batches: this process's rows of the step's global batch."""

  def make(start_step):
    step = start_step
    while True:
      if progress_file:
        with open(progress_file, "a") as f:
          f.write(f"{step}\n")
      if sleep:
        time.sleep(sleep)
      b = global_batch(step, batch_size)
      if step in nan_steps:
        b["x"][0, 0] = np.nan
      yield {k: v[rows] if rows is not None else v for k, v in b.items()}
      step += 1

  return make


def stage_cfg(steps=5, **over):
  """A stage block written by hand, as the runner reads it: config_lib's optimizer block at lr
  3e-3 with b2 0.99 and 2 warm-up steps, a metrics row every step, no periodic checkpoint."""
  from linvit_jax.configuration import config_lib

  cfg = dict(
      name="tiny",
      steps=steps,
      batch_size=GLOBAL_BATCH,
      optimizer=config_lib.optimizer(3e-3, b2=0.99, warmup_steps=2),
      checkpoint_every=0,
      max_to_keep=2,
      log_every=1,
      max_nonfinite_in_a_row=3,
      progress=False,
  )
  cfg.update(over)
  return cfg


def _all_rows():
  return batch_iter_fn()  # the module's function (run_stage's argument of that name hides it)


def run_stage(workdir, steps=6, batch_iter_fn=None, **cfg):
  """`train.run_stage` on this task in one process (all rows of each batch unless
  `batch_iter_fn` says otherwise): checkpoints every 2 steps, up to 10 kept; returns
  (params, history)."""
  from linvit_jax.conversion import train
  from linvit_jax.runtime import sharding

  return train.run_stage(
      stage_cfg=stage_cfg(steps, **{"checkpoint_every": 2, "max_to_keep": 10, **cfg}),
      loss_fn=loss_fn,
      init_params=init_params,
      trainable_mask=TRAINABLE,
      frozen=frozen_teacher(),
      workdir=str(workdir),
      mesh=sharding.make_mesh([("data", -1), ("fsdp", 1)]),
      batch_iter_fn=batch_iter_fn or _all_rows(),
      seed=0,
  )


def flat(tree) -> dict[str, np.ndarray]:
  import jax
  from jax.experimental import multihost_utils

  from linvit_jax.runtime import tree as tree_lib

  def fetch(x):  # multi-process: every process gathers the full value (a collective)
    if x.is_fully_addressable:
      return np.asarray(jax.device_get(x))
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))

  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {tree_lib.path_str(p): fetch(x) for p, x in leaves}


def main(argv=None) -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--workdir", required=True)
  ap.add_argument("--out", required=True)
  ap.add_argument("--mesh", action="append", default=[], help="data,fsdp e.g. 8,1")
  ap.add_argument("--steps", type=int, default=5)
  ap.add_argument("--checkpoint_every", type=int, default=0)
  ap.add_argument("--sleep", type=float, default=0.0)
  ap.add_argument("--progress_file", default=None)
  args = ap.parse_args(argv)

  from linvit_jax.runtime import distributed
  from linvit_jax.runtime import sharding

  distributed.maybe_initialize_distributed()
  import jax

  from linvit_jax.conversion import train

  results = {"process_count": jax.process_count(), "device_count": jax.device_count(), "runs": {}}
  for spec in args.mesh or ["-1,1"]:
    data, fsdp = (int(v) for v in spec.split(","))
    mesh = sharding.make_mesh([("data", data), ("fsdp", fsdp)])
    tag = spec.replace(",", "x").replace("-", "m")
    rows = sharding.process_batch_rows(GLOBAL_BATCH, mesh)
    params, history = train.run_stage(
        stage_cfg=stage_cfg(args.steps, checkpoint_every=args.checkpoint_every),
        loss_fn=loss_fn,
        init_params=init_params,
        trainable_mask=TRAINABLE,
        frozen=frozen_teacher(),
        workdir=os.path.join(args.workdir, tag),
        mesh=mesh,
        batch_iter_fn=batch_iter_fn(rows, sleep=args.sleep, progress_file=args.progress_file),
        seed=0,
        min_shard_size=MIN_SHARD_SIZE,
    )
    kernel = params["Dense_0"]["kernel"]
    results["runs"][tag] = {
        "losses": [r["loss"] for r in history if "loss" in r],
        "kernel_spec": str(kernel.sharding.spec),
        "rows": [rows.start, rows.stop],
    }
    flat_params = flat(params)  # a collective on multi-process meshes: every process gathers
    if jax.process_index() == 0:
      np.savez(f"{args.out}.{tag}.npz", **flat_params)
  if jax.process_index() == 0:
    with open(args.out, "w") as f:
      json.dump(results, f)


if __name__ == "__main__":
  sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
  main()
