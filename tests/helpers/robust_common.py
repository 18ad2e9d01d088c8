"""Helpers shared by the robustness cases (bad inputs, crashes, disks, signals) that live in the
test module of what each one exercises: test_cli_errors, test_run, test_checkpoints, test_train,
test_preemption and test_model_numerics. ROBUSTNESS.md lists every case and its test.

The fixtures these cases share (`teacher`, `tiny_reference`) are in tests/conftest.py.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np

from linvit_jax.models import checkpoints
from linvit_jax.models import vit_checkpoint
from tests.helpers import robust_config as rc
from tests.helpers import tiny_task as tt

GS_PATH = "gs://nonexistent-bucket/x.npz"
SAME_XLA = os.environ.get("XLA_FLAGS", "")  # for subprocesses compared bit for bit with this one


def config(teacher_path: str, **arg: Any) -> Any:
  """robust_config's ConfigDict for `teacher_path`, with `arg` as its config args."""
  spec = ",".join(f"{k}={v}" for k, v in {"teacher": teacher_path, **arg}.items())
  return rc.get_config(spec)


def flat(tree: Any) -> dict[str, np.ndarray]:
  return {k: np.asarray(v) for k, v in checkpoints.flatten(jax.device_get(tree)).items()}


def assert_bitwise(a: dict, b: dict) -> None:
  assert sorted(a) == sorted(b)
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def mount_tmpfs(path: Any, options: str) -> bool:
  """Mounts a tmpfs with `options` on `path`; False where that needs a root we do not have."""
  os.makedirs(path, exist_ok=True)
  try:
    return (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
            capture_output=True,
            timeout=30,
        ).returncode
        == 0
    )
  except (OSError, subprocess.SubprocessError):
    return False


def umount(path: Any) -> None:
  subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)


def save_variant(path: str, seed: int = 0, scan: bool = False, mutate=None, **model_over) -> None:
  """A teacher npz like rc.make_teacher's, optionally scanned and edited (flat name -> array)."""
  rc.make_teacher(path, seed=seed, **model_over)
  flat_params = checkpoints.flatten(checkpoints.load_npz(path))
  if mutate is not None:
    mutate(flat_params)
  tree = checkpoints.unflatten(flat_params)
  if scan:
    tree = vit_checkpoint.pyloop_to_scan(tree)
  checkpoints.save_npz(path, tree)


def signal_at(
    step_to_signal: int, signum: int, times: int = 1
) -> Callable[[int], Iterator[dict[str, np.ndarray]]]:
  """tiny_task's batches; asking for batch `step_to_signal` sends this process `signum` (the
  runner finishes that step, then saves: the checkpoint is step_to_signal + 1)."""
  inner = tt.batch_iter_fn()

  def make(start):
    for step, batch in enumerate(inner(start), start):
      if step == step_to_signal:
        for _ in range(times):
          os.kill(os.getpid(), signum)
      yield batch

  return make
