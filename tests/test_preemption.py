"""preemption.py: Ctrl-C, and SIGTERM (how Cloud TPU VMs announce a preemption), stop a stage.

The step in flight finishes, a checkpoint of that step is written, the CLI exits 130 after Ctrl-C
and 143 (128 + SIGTERM) after SIGTERM with `error: stage '<name>' interrupted [by SIGTERM] at step
N of M; checkpoint saved, rerun the same command to resume`, and the same command resumes at N,
bit for bit. A second signal stops at once; the previous signal handlers come back. The cases use
the helpers in tests/helpers/ and the tiny config of the robustness matrix (ROBUSTNESS.md).
"""

import ctypes
import json
import os
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
import pytest

from linvit_jax.conversion import preemption
from linvit_jax.conversion import train_step
from linvit_jax.runtime import metrics as metrics_lib
from linvit_jax.runtime import sharding
from tests.helpers import robust_common as robust
from tests.helpers import tiny_task as tt
from tests.helpers.subprocs import ROBUST_CONFIG
from tests.helpers.subprocs import ROOT
from tests.helpers.subprocs import last_line
from tests.helpers.subprocs import subprocess_env

sys.path.insert(0, os.path.join(ROOT, "launch"))
import local_multihost  # noqa: E402

SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _c_handler(signum: int) -> int:
  """The handler address the kernel holds for `signum` (0 = SIG_DFL, 1 = SIG_IGN): what
  `signal.getsignal` does not see when the handler was installed outside Python."""
  action = preemption._sigaction(signum)
  return ctypes.c_void_p.from_buffer(action).value or 0


# ------------------------------------------------------------------------------------------------
# In-process: the stage runner.


def test_ctrl_c_saves_and_the_rerun_is_bitwise_equal(tmp_path, tiny_reference):
  with pytest.raises(preemption.StageInterrupted) as info:
    tt.run_stage(
        tmp_path, batch_iter_fn=robust.signal_at(2, signal.SIGINT)
    )  # periodic checkpoints: 2, 4, 6
  assert str(info.value) == (
      "stage 'tiny' interrupted at step 3 of 6; checkpoint saved, rerun "
      "the same command to resume"
  )
  with ocp.CheckpointManager(str(tmp_path / "tiny" / "checkpoints")) as m:
    assert m.all_steps() == [2, 3]
  params, history = tt.run_stage(tmp_path)
  robust.assert_bitwise(robust.flat(params), tiny_reference[0])
  assert [r["loss"] for r in history if "loss" in r] == [
      r["loss"] for r in tiny_reference[1] if "loss" in r
  ]


def test_second_ctrl_c_stops_at_once_and_restores_the_handler(tmp_path):
  inner = tt.batch_iter_fn()
  # Python's default_int_handler in a plain run; what a test runner's worker set (xdist's
  # ignore SIGINT) otherwise: the stage must hand back whichever was there.
  before = signal.getsignal(signal.SIGINT)

  def twice_at_3(start):
    for step, batch in enumerate(inner(start), start):
      if step == 3:
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)
      yield batch

  with pytest.raises(
      preemption.StageInterrupted, match="interrupted at step 3 of 6; checkpoint saved"
  ):
    tt.run_stage(tmp_path, batch_iter_fn=twice_at_3)
  assert signal.getsignal(signal.SIGINT) is before


def test_ctrl_c_inside_a_step_falls_back_to_the_last_checkpoint(tmp_path):
  """A donated (deleted) state cannot be saved: the message says where a rerun resumes."""
  mesh = sharding.make_mesh([("data", -1), ("fsdp", 1)])
  tt.run_stage(tmp_path, steps=2)
  x = jax.device_put(jnp.zeros(3), sharding.replicated(mesh))
  x.delete()
  state = train_step.TrainState(
      step=jnp.asarray(5),
      params={"x": x},
      opt_state=(),
      rng=x,
      nonfinite_total=jnp.asarray(0),
      nonfinite_in_a_row=jnp.asarray(0),
  )
  with ocp.CheckpointManager(str(tmp_path / "tiny" / "checkpoints")) as m:
    err = preemption.stage_interrupted("tiny", 9, state, m)
  assert isinstance(err, KeyboardInterrupt)
  assert (
      "nothing new was saved, rerunning the same command resumes from the last checkpoint, "
      "step 2" in str(err)
  )


def test_sigterm_saves_at_the_step_boundary_and_restores_the_handlers(tmp_path):
  before = {s: (signal.getsignal(s), _c_handler(s)) for s in SIGNALS}
  with pytest.raises(preemption.StageInterrupted) as info:
    tt.run_stage(tmp_path, batch_iter_fn=robust.signal_at(2, signal.SIGTERM))
  assert str(info.value) == (
      "stage 'tiny' interrupted by SIGTERM at step 3 of 6; checkpoint "
      "saved, rerun the same command to resume"
  )
  assert info.value.signum == signal.SIGTERM
  assert isinstance(info.value, KeyboardInterrupt)  # the CLI's Ctrl-C path: exit 130
  with ocp.CheckpointManager(str(tmp_path / "tiny" / "checkpoints")) as m:
    assert m.all_steps() == [2, 3]
  assert {s: (signal.getsignal(s), _c_handler(s)) for s in SIGNALS} == before
  _, history = tt.run_stage(tmp_path)  # resumes at 3: no step logged twice
  steps = [r["step"] for r in history if "loss" in r]
  assert steps == sorted(set(steps)) and steps[-1] == 6


def test_second_sigterm_stops_at_once(tmp_path):
  with pytest.raises(
      preemption.StageInterrupted,
      match="interrupted by SIGTERM at step 3 of 6; " "checkpoint saved",
  ):
    tt.run_stage(tmp_path, batch_iter_fn=robust.signal_at(3, signal.SIGTERM, times=2))
  assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_handler_installed_outside_python_comes_back(tmp_path):
  """JAX's preemption notifier holds SIGTERM in a multi-process run, installed from C++, where
  `signal.signal` sees SIG_DFL: putting SIG_DFL back after a stage would make a later SIGTERM kill
  the process. Here SIG_IGN set through libc stands in for it."""
  libc = ctypes.CDLL(None, use_errno=True)
  libc.signal.restype = ctypes.c_void_p
  libc.signal.argtypes = (ctypes.c_int, ctypes.c_void_p)
  libc.signal(signal.SIGTERM, 1)  # SIG_IGN, behind Python's back
  try:
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL and _c_handler(signal.SIGTERM) == 1
    tt.run_stage(tmp_path, steps=2)
    assert _c_handler(signal.SIGTERM) == 1
    os.kill(os.getpid(), signal.SIGTERM)  # ignored, as before the stage
  finally:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
  assert _c_handler(signal.SIGTERM) == 0


# ------------------------------------------------------------------------------------------------
# The CLI, with real signals from outside.


def _cli_args(teacher, workdir, steps: int) -> list[str]:
  """`python -m linvit_jax.main` on the robustness config: a `steps`-step distillation stage that
  checkpoints only when stopped."""
  return [
      sys.executable,
      "-m",
      "linvit_jax.main",
      "--config",
      f"{ROBUST_CONFIG}:teacher={teacher},steps={steps},finetune_steps=2,checkpoint_every=1000",
      "--workdir",
      str(workdir),
  ]


def _wait_for_rows(procs, metrics, rows: int = 3, timeout: float = 400) -> None:
  """Until `metrics` has `rows` lines (the stage is running), or a process ends."""
  deadline = time.time() + timeout
  while time.time() < deadline and all(p.poll() is None for p in procs):
    if metrics.exists() and len(metrics.read_text().splitlines()) >= rows:
      return
    time.sleep(0.05)
  raise AssertionError(f"the stage never got going: {metrics}")


def _interrupt_cli(teacher, tmp_path, steps: int, signum, code: int, by: str = ""):
  """Runs the CLI (one process, its output in first.log), sends `signum` once the stage is
  running, and checks that it exits `code` without a traceback, naming the step it saved and
  writing no results: (args, workdir, output, step)."""
  workdir = tmp_path / "w"
  args = _cli_args(teacher, workdir, steps)
  with open(tmp_path / "first.log", "w") as f:
    proc = subprocess.Popen(args, cwd=ROOT, env=subprocess_env(1), stdout=f, stderr=f)
    try:
      _wait_for_rows([proc], workdir / "distill_attention" / metrics_lib.METRICS_FILE)
      proc.send_signal(signum)
      proc.wait(timeout=120)
    finally:
      if proc.poll() is None:
        proc.kill()
  out = (tmp_path / "first.log").read_text()
  assert proc.returncode == code, out[-4000:]
  assert "Traceback" not in out, out[-4000:]
  step = _interrupted_step(last_line(out), workdir, steps, by)
  assert not (workdir / "results.json").exists()
  return args, workdir, out, step


def _interrupted_step(last: str, workdir, total: int, by: str = "") -> int:
  """The step in the CLI's last line `error: stage 'distill_attention' interrupted [by]at step N
  of total; ...`, checked to lie inside the stage and to have its checkpoint."""
  assert last.startswith(f"error: stage 'distill_attention' interrupted {by}at step "), last
  assert last.endswith(f" of {total}; checkpoint saved, rerun the same command to resume"), last
  step = int(last.split(" at step ")[1].split()[0])
  assert 1 <= step < total
  assert (workdir / "distill_attention" / "checkpoints" / str(step)).is_dir()
  return step


def _assert_resumed(args, workdir, step, total, env):
  again = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
  assert f"stage 'distill_attention': resuming from step {step} of {total}" in (
      again.stdout + again.stderr
  )
  rows = metrics_lib.read_jsonl(str(workdir / "distill_attention" / metrics_lib.METRICS_FILE))
  steps = [r["step"] for r in rows if "loss" in r]
  assert steps == sorted(set(steps)) and steps[-1] == total  # no step logged twice
  with open(workdir / "results.json") as f:
    assert 0.0 <= json.load(f)["student_top1"] <= 1.0


def test_cli_ctrl_c_saves_exits_130_and_the_rerun_resumes(teacher, tmp_path):
  """SIGINT to `python -m linvit_jax.main` in the middle of a stage, then the same command."""
  args, workdir, _, step = _interrupt_cli(teacher, tmp_path, 400, signal.SIGINT, 130)
  _assert_resumed(args, workdir, step, 400, subprocess_env(1))


def test_cli_sigterm_saves_exits_143_and_the_rerun_resumes(teacher, tmp_path):
  """SIGTERM to `python -m linvit_jax.main` in the middle of a stage, then the same command."""
  _, _, out, _ = _interrupt_cli(teacher, tmp_path, 200, signal.SIGTERM, 143, by="by SIGTERM ")
  assert "SIGTERM: checkpointing after this step" in out, out[-4000:]
  # SIGTERM saves through the same path as Ctrl-C (StageInterrupted after the step): the rerun
  # from that checkpoint is the Ctrl-C test's, not run twice.


def test_cli_two_processes_sigterm_to_one_stops_both_at_the_same_step(teacher, tmp_path):
  """A 2-process run (the loopback launcher's environment): SIGTERM reaches only process 1, where
  JAX's preemption notifier held SIGTERM until the stage began; both processes stop at the same
  step, name the same signal, and the checkpoint holds that step (the resume itself is the
  single-process Ctrl-C test's)."""
  workdir = tmp_path / "w"
  args = _cli_args(teacher, workdir, 200)
  port, procs, logs = local_multihost.free_port(), [], []
  try:
    for i in range(2):
      env = local_multihost.process_env(
          subprocess_env(1),
          process_id=i,
          num_processes=2,
          port=port,
          devices_per_process=1,
          platform="cpu",
      )
      logs.append(tmp_path / f"process{i}.log")
      with open(logs[-1], "w") as f:
        procs.append(subprocess.Popen(args, cwd=ROOT, env=env, stdout=f, stderr=f))
    _wait_for_rows(procs, workdir / "distill_attention" / metrics_lib.METRICS_FILE)
    procs[1].send_signal(signal.SIGTERM)
    for p in procs:
      p.wait(timeout=120)
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  outs = [log.read_text() for log in logs]
  assert [p.returncode for p in procs] == [143, 143], "\n".join(o[-3000:] for o in outs)
  lasts = [last_line(o) for o in outs]
  assert lasts[0] == lasts[1], lasts  # the same step on both
  _interrupted_step(lasts[0], workdir, 200, by="by SIGTERM ")
