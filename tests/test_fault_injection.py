"""Fault injection: a tiny run killed (SIGKILL) at 10 random points of its file writes, rerun
after each kill, ends with a student bit-identical to an uninterrupted run's, and no kill leaves an
export that `load_student` accepts before it is complete.

The points are the renames that commit every file a run writes (tests/helpers/fault_run.py): just
before one (the new file fully written, not yet in place) and just after, in the workdir's probe,
its identity and config, the surgery report, every orbax checkpoint, student.npz,
student.safetensors, the model card, student_config.json and results.json. An uninterrupted run
lists them; 10 are drawn at random (a new seed each run, named in every failure; LINVIT_FAULT_SEED
replays one; at least 2 inside checkpoint writes and 2 inside the export), and one workdir is
killed at each in turn: every rerun resumes from what the last kill left.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys

import numpy as np
import pytest

from linvit_jax.artifacts import student_loader
from linvit_jax.models import checkpoints
from linvit_jax.runtime.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KILLS = 10
EXPORT_FILES = ("student.npz", "student.safetensors", "README.md", "student_config.json")


def _run(teacher: str, workdir: str, log: str, kill: str = "") -> subprocess.CompletedProcess:
  env = dict(os.environ, LINVIT_FAULT_LOG=log, LINVIT_FAULT_ROOT=workdir, LINVIT_FAULT_KILL=kill)
  return subprocess.run(
      [
          sys.executable,
          "-m",
          "tests.helpers.fault_run",
          # One stage of 2 steps, neither the teacher's own top-1 nor a resolution sweep: each
          # of the 12 processes costs ~11 s on 2 cores, most of it imports and tracing.
          f"--config=tests/helpers/robust_config.py:teacher={teacher},steps=2,"
          "stages=distill_attention",
          "--config.eval.teacher=False",
          "--config.eval.resolution_factors=()",
          f"--workdir={workdir}",
      ],
      cwd=ROOT,
      env=env,
      capture_output=True,
      text=True,
      timeout=300,
  )


def _student(workdir: str) -> dict[str, np.ndarray]:
  return checkpoints.flatten(checkpoints.load_npz(os.path.join(workdir, "student.npz")))


def _draw(points: list[str], seed: int) -> list[str]:
  """KILLS distinct points, in the order a run passes them: 2 inside checkpoint writes, 2 inside
  the export, the rest anywhere."""
  rng = random.Random(seed)
  in_checkpoints = [p for p in points if "checkpoints/" in p]
  in_export = [p for p in points if p.split(" ", 1)[1].split("#")[0] in EXPORT_FILES]
  chosen = set(rng.sample(in_checkpoints, 2)) | set(rng.sample(in_export, 2))
  rest = [p for p in points if p not in chosen]
  chosen |= set(rng.sample(rest, KILLS - len(chosen)))
  return [p for p in points if p in chosen]


def test_killed_at_random_points_resumes_to_the_same_student(teacher, tmp_path):
  seed = int(os.environ.get("LINVIT_FAULT_SEED") or random.randrange(1 << 30))
  reference = str(tmp_path / "reference")
  done = _run(teacher, reference, str(tmp_path / "reference.log"))
  assert done.returncode == 0, done.stderr[-2000:]
  points = (tmp_path / "reference.log").read_text().split()
  points = [f"{a} {b}" for a, b in zip(points[::2], points[1::2])]
  kills = _draw(points, seed)
  assert len(kills) == KILLS

  workdir = str(tmp_path / "w")
  for i, kill in enumerate(kills):
    killed = _run(teacher, workdir, str(tmp_path / f"run{i}.log"), kill)
    assert killed.returncode == -9, (seed, kill, killed.returncode, killed.stderr[-2000:])
    try:  # a kill leaves no export that loads but is not the finished student
      loaded = student_loader.load_student(workdir)
    except UserError:
      continue
    got = checkpoints.flatten(loaded.params)
    want = _student(reference)
    assert sorted(got) == sorted(want), (seed, kill)
    for name in want:
      np.testing.assert_array_equal(got[name], want[name], err_msg=f"{kill}: {name}")
  finished = _run(teacher, workdir, str(tmp_path / "last.log"))
  assert finished.returncode == 0, (seed, kills, finished.stderr[-2000:])
  want, got = _student(reference), _student(workdir)
  assert sorted(got) == sorted(want)
  for name in want:
    np.testing.assert_array_equal(got[name], want[name], err_msg=f"seed {seed}: {name}")
  leftovers = [n for n in os.listdir(workdir) if n.endswith(".tmp")]
  assert not leftovers, leftovers  # what the kills left, the reruns removed


if __name__ == "__main__":
  pytest.main([__file__, "-q"])
