"""tiny_task's stage with a large frozen 'ballast' leaf, so that each checkpoint write takes a
while (the window in which the robustness test kills the process with SIGKILL).

  python tests/helpers/robust_slow_save.py --workdir W --out OUT.npz [--steps 4] [--ballast_mb 64]

Writes OUT.npz (the final trained params, ballast excluded) when the stage completes.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tiny_task as tt  # noqa: E402

TRAINABLE = r"Dense_1/.*"  # the ballast (and Dense_0) stay frozen: they are saved, not trained


def run(workdir: str, steps: int, ballast_mb: int) -> dict[str, np.ndarray]:
  import jax
  import jax.numpy as jnp

  from linvit_jax.conversion import train
  from linvit_jax.runtime import sharding

  def init_params(rng):
    params = tt.init_params(rng)
    # Random, so that the checkpoint's compression cannot shrink it.
    params["ballast"] = jax.random.normal(
        jax.random.fold_in(rng, 7), (ballast_mb << 18,), jnp.float32
    )
    return params

  mesh = sharding.make_mesh([("data", -1), ("fsdp", 1)])
  params, _ = train.run_stage(
      stage_cfg=tt.stage_cfg(steps, checkpoint_every=1, max_to_keep=steps + 1),
      loss_fn=tt.loss_fn,
      init_params=init_params,
      trainable_mask=TRAINABLE,
      frozen=tt.frozen_teacher(),
      workdir=workdir,
      mesh=mesh,
      batch_iter_fn=tt.batch_iter_fn(),
      seed=0,
  )
  del params["ballast"]
  return tt.flat(params)


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--workdir", required=True)
  ap.add_argument("--out", required=True)
  ap.add_argument("--steps", type=int, default=4)
  ap.add_argument("--ballast_mb", type=int, default=64)
  args = ap.parse_args()
  import logging

  logging.basicConfig(level=logging.INFO)  # the runner says where it resumed
  sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
  np.savez(args.out, **run(args.workdir, args.steps, args.ballast_mb))


if __name__ == "__main__":
  main()
