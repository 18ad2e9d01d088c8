"""train.py: the stage runner on one device, 8 simulated devices, 2 processes, and after kill -9
(between steps and during a checkpoint write) or a full disk.

The task is tests/helpers/tiny_task.py (an MLP matching a frozen linear teacher, with RNG noise,
one frozen leaf); multi-device runs are subprocesses of that script.
"""

import errno
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest

from linvit_jax.conversion import optim
from linvit_jax.conversion import preemption
from linvit_jax.conversion import stage_log
from linvit_jax.conversion import train
from linvit_jax.conversion import train_step
from linvit_jax.runtime import errors
from linvit_jax.runtime import metrics as metrics_lib
from linvit_jax.runtime import sharding
from tests.helpers import robust_common as robust
from tests.helpers import robust_slow_save
from tests.helpers import tiny_task as tt
from tests.helpers.subprocs import HELPERS
from tests.helpers.subprocs import ROOT
from tests.helpers.subprocs import subprocess_env

HELPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "helpers", "tiny_task.py")
TOL = 1e-5


def _mesh():
  return sharding.make_mesh([("data", -1), ("fsdp", 1)])


def _run(workdir, steps=5, batch_iter_fn=None, **cfg):
  return train.run_stage(
      stage_cfg=tt.stage_cfg(steps, **cfg),
      loss_fn=tt.loss_fn,
      init_params=tt.init_params,
      trainable_mask=tt.TRAINABLE,
      frozen=tt.frozen_teacher(),
      workdir=str(workdir),
      mesh=_mesh(),
      batch_iter_fn=batch_iter_fn or tt.batch_iter_fn(),
      seed=0,
      min_shard_size=tt.MIN_SHARD_SIZE,
  )


def _losses(history):
  return [r["loss"] for r in history if "loss" in r]


def _cut_after_step_3_and_resumed(workdir, **cfg):
  """The 5-step stage, its input failing at step 3 (checkpointed there), then rerun: the params
  the resumed stage ends with."""

  def three_batches(start):
    for i, batch in enumerate(tt.batch_iter_fn()(start)):
      if start + i == 3:
        raise OSError("the input went away")
      yield batch

  with pytest.raises(OSError, match="went away"):
    _run(workdir, checkpoint_every=3, batch_iter_fn=three_batches, **cfg)
  resumed, _ = _run(workdir, checkpoint_every=3, **cfg)
  return resumed


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """The 5-step run on this process's single device."""
  workdir = tmp_path_factory.mktemp("ref")
  params, history = _run(workdir)
  return workdir, params, history


def _run_helper(tmp_path, *args, num_devices=8, env_extra=None, timeout=300, **popen):
  out = str(tmp_path / "out.json")
  env = subprocess_env(num_devices)
  env.update(env_extra or {})
  cmd = [sys.executable, HELPER, "--workdir", str(tmp_path / "work"), "--out", out, *args]
  return out, subprocess.Popen(
      cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **popen
  )


def _wait(proc, timeout=300):
  try:
    output, _ = proc.communicate(timeout=timeout)
  except subprocess.TimeoutExpired:
    proc.kill()
    output, _ = proc.communicate()
    raise AssertionError(f"subprocess timed out:\n{output[-4000:]}") from None
  assert proc.returncode == 0, output[-4000:]
  return output


# ------------------------------------------------------------------------------------------------
# Single device.


def test_reference_run_trains_logs_and_checkpoints(reference):
  workdir, params, history = reference
  losses = _losses(history)
  assert len(losses) == 5 and all(np.isfinite(losses))
  assert [r["step"] for r in history] == [1, 2, 3, 4, 5]
  assert history[-1]["nonfinite_total"] == 0
  assert "target_rms" in history[0] and "lr" in history[0] and "grad_norm" in history[0]
  # XLA's count of one step, the same in every row: at least the forward and backward matmuls of
  # the MLP (3 × 2·B·(IN·HIDDEN + HIDDEN·OUT)); each row's GFLOP/s is that count × its rate.
  matmuls = 3 * 2.0 * tt.GLOBAL_BATCH * (tt.IN * tt.HIDDEN + tt.HIDDEN * tt.OUT)
  assert len({r["step_gflops"] for r in history}) == 1
  assert matmuls / 1e9 <= history[0]["step_gflops"] < 20 * matmuls / 1e9
  for r in history:
    assert r["gflops_per_sec"] == pytest.approx(r["step_gflops"] * r["steps_per_sec"])
  stage_dir = os.path.join(workdir, "tiny")
  assert metrics_lib.read_jsonl(os.path.join(stage_dir, "metrics.jsonl")) == history
  assert any(f.startswith("events.out.tfevents") for f in os.listdir(stage_dir))
  assert sorted(os.listdir(os.path.join(stage_dir, "checkpoints"))) == ["5"]
  # The frozen leaf never moves; the trained ones do.
  np.testing.assert_array_equal(
      np.asarray(params["Dense_0"]["bias"]), np.full((tt.HIDDEN,), 0.01, np.float32)
  )  # its init value
  assert np.any(np.asarray(params["Dense_1"]["bias"]))  # initialized to zeros


def test_finished_stage_is_skipped_and_returns_its_params(reference):
  workdir, params, history = reference

  def no_batches(start):
    raise AssertionError(f"a finished stage asked for data from step {start}")

  params2, history2 = _run(workdir, batch_iter_fn=no_batches)
  assert history2 == history
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params2)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("average", [{"ema_decay": 0.5}, {"average_last": 0.5}])
def test_a_stage_with_an_average_hands_it_on_also_when_skipped_or_resumed(
    reference, tmp_path, average
):
  _, plain, _ = reference
  opt = {**tt.stage_cfg()["optimizer"], **average}
  params, history = _run(tmp_path / "ema", optimizer=opt)
  assert _losses(history) == _losses(reference[2])  # the average does not change the training
  diff = [
      np.max(np.abs(np.asarray(a) - np.asarray(b)))
      for a, b in zip(*map(jax.tree.leaves, (params, plain)))
  ]
  assert max(diff) > 1e-6  # the average of the walk, not its last point

  def no_batches(start):
    raise AssertionError(f"a finished stage asked for data from step {start}")

  again, _ = _run(tmp_path / "ema", optimizer=opt, batch_iter_fn=no_batches)

  # cut after step 3 and resumed: the average is checkpointed with the optimizer state
  resumed = _cut_after_step_3_and_resumed(tmp_path / "cut", optimizer=opt)
  for a, b, c in zip(*map(jax.tree.leaves, (params, again, resumed))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_allclose(np.asarray(a), np.asarray(c), rtol=TOL, atol=TOL)


def test_start_weight_hands_on_a_point_between_the_start_and_the_trained_params(
    reference, tmp_path
):
  _, trained, history = reference
  start = tt.init_params(jax.random.split(jax.random.PRNGKey(0))[0])  # run_stage's init key
  params, history2 = _run(tmp_path, start_weight=0.25)
  assert _losses(history2) == _losses(history)  # the training itself is the same
  again, _ = _run(tmp_path, start_weight=0.25, batch_iter_fn=lambda s: iter(()))  # skipped
  for got in (params, again):
    for p, t, s0 in zip(*map(jax.tree.leaves, (got, trained, start))):
      np.testing.assert_allclose(
          p, 0.75 * np.asarray(t) + 0.25 * np.asarray(s0), rtol=1e-5, atol=1e-7
      )
  with pytest.raises(ValueError, match="stage 'tiny': start_weight=1.0"):
    train.stage_settings(tt.stage_cfg(start_weight=1.0))


def test_host_params_and_frozen_arrays_stay_usable(tmp_path):
  """numpy init params shared with `frozen` (like copied teacher leaves) are never donated away."""
  init = tt.init_params(jax.random.PRNGKey(3))
  init["Dense_0"] = jax.tree.map(np.asarray, init["Dense_0"])  # host and device leaves mixed
  frozen = {"w": jnp.asarray(tt.frozen_teacher()["w"]), "shared": init["Dense_1"]["kernel"]}
  cfg = ml_collections.ConfigDict(
      tt.stage_cfg(
          2,
          eval_every=1,
          kind="finetune",
          w_label=1.0,
          optimizer=dict(name="sgd", lr=0.1, wd=0.0, grad_clip=0.0, schedule="constant"),
      )
  )
  eval_fn = jax.jit(lambda p: {"bias_norm": jnp.linalg.norm(p["Dense_1"]["bias"])})
  params, history = train.run_stage(
      stage_cfg=cfg,
      name="sgd_stage",
      loss_fn=tt.loss_fn,
      init_params=init,
      trainable_mask=None,
      frozen=frozen,
      workdir=str(tmp_path),
      mesh=_mesh(),
      batch_iter_fn=tt.batch_iter_fn(),
      min_shard_size=tt.MIN_SHARD_SIZE,
      eval_fn=eval_fn,
  )
  assert os.path.isdir(tmp_path / "sgd_stage" / "checkpoints" / "2")
  evals = [r for r in history if "eval/bias_norm" in r]
  assert [r["step"] for r in evals] == [1, 2] and evals[-1]["eval/bias_norm"] > 0
  assert not frozen["shared"].is_deleted() and not init["Dense_1"]["kernel"].is_deleted()
  assert np.isfinite(np.asarray(frozen["shared"])).all()
  assert len(_losses(history)) == 2
  assert not np.array_equal(np.asarray(params["Dense_0"]["bias"]), init["Dense_0"]["bias"])


def test_nonfinite_batches_are_skipped_counted_and_stop_the_stage(tmp_path):
  """Step 3 (batch index 2) has a NaN: its update is skipped. Steps 5 and 6 too: the stage stops."""
  with pytest.raises(stage_log.NonFiniteLossError) as e:
    _run(
        tmp_path,
        steps=10,
        batch_iter_fn=tt.batch_iter_fn(nan_steps={2, 4, 5}),
        checkpoint_every=1,
        max_to_keep=10,
        max_nonfinite_in_a_row=2,
    )
  msg = str(e.value)
  assert "2 steps in a row" in msg and "steps 5..6" in msg and "step 4" in msg
  rows = metrics_lib.read_jsonl(str(tmp_path / "tiny" / "metrics.jsonl"))
  by_step = {r["step"]: r for r in rows}
  assert by_step[3]["nonfinite"] == 1 and by_step[3]["loss"] is None
  assert by_step[4]["nonfinite"] == 0 and by_step[4]["nonfinite_in_a_row"] == 0
  assert np.isfinite(by_step[4]["loss"])
  assert by_step[6]["nonfinite_total"] == 3 and by_step[6]["nonfinite_in_a_row"] == 2
  # The skipped step left params and optimizer state exactly as they were.
  ckpts = ocp.CheckpointManager(str(tmp_path / "tiny" / "checkpoints"))
  s2, s3, s4 = (ckpts.restore(s, args=ocp.args.StandardRestore()) for s in (2, 3, 4))
  for a, b in zip(jax.tree.leaves(s2["params"]), jax.tree.leaves(s3["params"])):
    np.testing.assert_array_equal(a, b)
  for a, b in zip(jax.tree.leaves(s2["opt_state"]), jax.tree.leaves(s3["opt_state"])):
    np.testing.assert_array_equal(a, b)
  assert int(s3["step"]) == 3 and int(s3["nonfinite_total"]) == 1
  assert not np.array_equal(s3["params"]["Dense_0"]["kernel"], s4["params"]["Dense_0"]["kernel"])
  assert ckpts.all_steps() == [1, 2, 3, 4, 5]  # none at the stop
  ckpts.close()


def test_metrics_drain_reads_one_step_late_at_the_logging_cadence(tmp_path):
  """Rows at the first step, every log_every-th, the last, and every non-finite one; a step is read
  when the next one is pushed (or on drain); too many non-finite steps in a row stop the stage."""
  cfg = dict(steps=10, log_every=4, max_nonfinite_in_a_row=2, batch_size=8)
  writer = metrics_lib.MetricWriter(str(tmp_path), tensorboard=False)
  drain = stage_log.MetricsDrain("tiny", cfg, 2, writer, [], show_progress=False)

  def metrics(bad=0, in_a_row=0):
    return {"loss": np.float32(np.nan if bad else 1.0), "grad_norm": np.float32(1.0),
            "nonfinite": np.int32(bad), "nonfinite_total": np.int32(bad),
            "nonfinite_in_a_row": np.int32(in_a_row)}  # fmt: skip

  drain.push(3, metrics())
  assert drain.history == []  # not read yet: the device may still be computing it
  for step in (4, 5, 6, 7, 8, 9, 10):
    drain.push(step, metrics(bad=int(step == 6), in_a_row=int(step == 6)))
  drain.write(10, {"eval/top1": 0.5})
  drain.drain()
  drain.close()
  assert [r["step"] for r in drain.history] == [3, 4, 6, 8, 10, 10]
  assert drain.history[2]["loss"] is None and drain.history[-1]["examples_per_sec"] > 0
  assert drain.history[-2] == {"step": 10, "eval/top1": 0.5}  # written before step 10 was read
  writer.close()
  assert metrics_lib.read_jsonl(writer.path) == drain.history
  stop = stage_log.MetricsDrain("tiny", cfg, 0, metrics_lib.MetricWriter(str(tmp_path), enabled=False), [],
                            show_progress=False)  # fmt: skip
  stop.push(1, metrics(bad=1, in_a_row=2))
  with pytest.raises(stage_log.NonFiniteLossError, match=r"2 steps in a row \(steps 0..1\)"):
    stop.drain()


def test_gradient_accumulation_matches_one_big_batch():
  """accum_steps=2 averages two micro-batch gradients: the full batch's loss and update."""
  loss_fn = lambda p, f, b, r: tt.loss_fn(p, f, b, r, noise=0.0)
  mask = optim.trainable_mask(jax.eval_shape(tt.init_params, jax.random.PRNGKey(0)), tt.TRAINABLE)
  opt = train.stage_settings(tt.stage_cfg(3))["optimizer"]
  tx, schedule = optim.make_optimizer(opt, 3, mask)
  steps = [train_step.make_train_step(loss_fn, tx, schedule, mask, accum_steps=k) for k in (1, 2)]

  @jax.jit
  def both(batch):
    state = train_step.init_train_state(
        tt.init_params(jax.random.PRNGKey(0)), tx, jax.random.PRNGKey(1)
    )
    return [step(state, tt.frozen_teacher(), batch) for step in steps]

  (s1, m1), (s2, m2) = both(tt.global_batch(0))
  np.testing.assert_allclose(m2["loss"], m1["loss"], rtol=TOL)
  np.testing.assert_allclose(m2["grad_norm"], m1["grad_norm"], rtol=1e-4)
  for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s2.params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
  assert int(s2.step) == 1


def test_frozen_leaves_are_frozen_by_the_optimizer_alone():
  """No stop_gradient in the step: the frozen leaf's gradient (nonzero) is neither applied nor
  counted in grad_norm, which is the trained leaves' norm."""
  loss_fn = lambda p, f, b, r: tt.loss_fn(p, f, b, r, noise=0.0)
  params, frozen = tt.init_params(jax.random.PRNGKey(0)), tt.frozen_teacher()
  batch = tt.global_batch(0)
  mask = optim.trainable_mask(params, tt.TRAINABLE)
  opt = dict(train.stage_settings(tt.stage_cfg(3))["optimizer"], warmup_steps=0)  # lr(0) > 0
  tx, schedule = optim.make_optimizer(opt, 3, mask)
  step = jax.jit(train_step.make_train_step(loss_fn, tx, schedule, mask))
  new, metrics = step(train_step.init_train_state(params, tx, jax.random.PRNGKey(1)), frozen, batch)
  grads = jax.grad(lambda p: loss_fn(p, frozen, batch, None)[0])(params)
  assert np.any(np.asarray(grads["Dense_0"]["bias"]))
  trained = [g for g, m in zip(jax.tree.leaves(grads), jax.tree.leaves(mask)) if m]
  np.testing.assert_allclose(metrics["grad_norm"], optax.tree.norm(trained), rtol=1e-5)
  np.testing.assert_array_equal(new.params["Dense_0"]["bias"], params["Dense_0"]["bias"])
  assert not np.array_equal(new.params["Dense_0"]["kernel"], params["Dense_0"]["kernel"])


def test_config_errors_are_clear_and_early(tmp_path):
  def run(**over):
    cfg = tt.stage_cfg(3)
    cfg.update(over)
    return train.run_stage(
        stage_cfg=cfg,
        loss_fn=tt.loss_fn,
        init_params=tt.init_params,
        trainable_mask=tt.TRAINABLE,
        frozen=None,
        workdir=str(tmp_path),
        mesh=_mesh(),
        batch_iter_fn=tt.batch_iter_fn(),
    )

  with pytest.raises(ValueError, match="accumulation"):
    run(optimizer=dict(accum_steps=3))
  with pytest.raises(ValueError, match=r"unknown optimizer field\(s\) \['learning_rate'\]"):
    run(optimizer=dict(learning_rate=0.1))
  with pytest.raises(ValueError, match="steps must be a positive integer"):
    run(steps=None)
  with pytest.raises(ValueError, match="selects no parameters"):
    optim.trainable_mask({"a": np.zeros(3)}, "nothing-matches")
  with pytest.raises(ValueError, match="does not match the params tree"):
    optim.trainable_mask({"a": np.zeros(3)}, {"b": True})
  assert not os.listdir(tmp_path)  # nothing was created before the errors


# ------------------------------------------------------------------------------------------------
# Many devices, many processes, kill -9.


@pytest.fixture(scope="module")
def eight_devices(tmp_path_factory):
  """The 5-step run on 8 simulated devices, meshes (8, 1) and (4, 2), checkpointing every step."""
  tmp = tmp_path_factory.mktemp("eight")
  out, proc = _run_helper(tmp, "--mesh", "8,1", "--mesh", "4,2", "--checkpoint_every", "1")
  _wait(proc)
  with open(out) as f:
    return out, json.load(f)


def test_same_losses_on_8_devices_meshes_8x1_and_4x2(reference, eight_devices):
  out, res = eight_devices
  ref = _losses(reference[2])
  assert res["device_count"] == 8
  for tag in ("8x1", "4x2"):
    np.testing.assert_allclose(res["runs"][tag]["losses"], ref, rtol=TOL, atol=TOL)
  assert res["runs"]["4x2"]["kernel_spec"] == "P(None, 'fsdp')"  # really fsdp-sharded
  ref_params = tt.flat(reference[1])
  got = np.load(out + ".4x2.npz")
  for k, v in ref_params.items():
    np.testing.assert_allclose(got[k], v, rtol=1e-4, atol=1e-5)


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def test_same_losses_on_2_processes_x_4_devices(reference, tmp_path):
  port = _free_port()
  procs = []
  for pid in range(2):
    env = {
        "JAX_COORDINATOR_ADDRESS": f"localhost:{port}",
        "JAX_NUM_PROCESSES": "2",
        "JAX_PROCESS_ID": str(pid),
    }
    procs.append(_run_helper(tmp_path, "--mesh", "4,2", num_devices=4, env_extra=env)[1])
  try:
    outputs = [_wait(p, timeout=300) for p in procs]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  with open(tmp_path / "out.json") as f:
    res = json.load(f)
  assert res["process_count"] == 2 and res["device_count"] == 8, outputs
  np.testing.assert_allclose(
      res["runs"]["4x2"]["losses"], _losses(reference[2]), rtol=TOL, atol=TOL
  )
  assert res["runs"]["4x2"]["rows"] == [0, 8]  # process 0 fed the first half of each batch


def test_kill_9_then_restart_ends_bitwise_equal(eight_devices, tmp_path):
  """Killed at a random step of the (4, 2) run, restarted: the same final params, bit for bit."""
  steps, seed = 5, random.randrange(1 << 30)
  kill_at = random.Random(seed).randint(2, steps - 1)
  common = ["--steps", str(steps), "--checkpoint_every", "1", "--mesh", "4,2"]
  progress = tmp_path / "progress.txt"
  out, proc = _run_helper(tmp_path, *common, "--sleep", "0.3", "--progress_file", str(progress))
  deadline = time.time() + 240
  while time.time() < deadline and proc.poll() is None:
    requested = progress.read_text().split() if progress.exists() else []
    if requested and int(requested[-1]) >= kill_at:
      break
    time.sleep(0.05)
  assert proc.poll() is None, f"finished before the kill (seed {seed}):\n{proc.communicate()[0]}"
  os.kill(proc.pid, signal.SIGKILL)
  proc.communicate()
  assert not os.path.exists(out), "the killed run must not have finished"

  restart_progress = tmp_path / "progress_restart.txt"
  _, proc = _run_helper(tmp_path, *common, "--progress_file", str(restart_progress))
  _wait(proc)
  resumed_from = int(restart_progress.read_text().split()[0])
  assert 1 <= resumed_from <= kill_at, (seed, kill_at, resumed_from)
  ref_out, ref = eight_devices
  ref_params = np.load(ref_out + ".4x2.npz")
  got = np.load(out + ".4x2.npz")
  assert sorted(ref_params) == sorted(got)
  for k in ref_params:
    np.testing.assert_array_equal(
        got[k], ref_params[k], err_msg=f"{k} (seed {seed}, kill at {kill_at})"
    )
  with open(out) as f:
    assert json.load(f)["runs"]["4x2"]["losses"] == ref["runs"]["4x2"]["losses"]


# ------------------------------------------------------------------------------------------------
# Robustness (ROBUSTNESS.md): kill -9 during a checkpoint write, a full disk.


def test_kill_9_during_a_checkpoint_write_keeps_the_previous_one(tmp_path):
  """SIGKILL while checkpoint 2 is being written (a 64 MB frozen leaf makes the write slow):
  checkpoint 1 restores, the torn one is discarded, the rerun ends bit-identical."""
  script = os.path.join(HELPERS, "robust_slow_save.py")
  ckpt_dir = tmp_path / "w" / "tiny" / "checkpoints"

  def start(out):
    return subprocess.Popen(
        [sys.executable, script, "--workdir", str(tmp_path / "w"), "--out", str(out)],
        cwd=ROOT,
        env=subprocess_env(1, XLA_FLAGS=robust.SAME_XLA),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )

  proc = start(tmp_path / "killed.npz")
  deadline, killed_in = time.time() + 240, None
  try:
    while time.time() < deadline and proc.poll() is None:
      names = os.listdir(ckpt_dir) if ckpt_dir.is_dir() else []
      torn = [n for n in names if n.startswith("2.") and "tmp" in n]
      if torn and "1" in names:
        os.kill(proc.pid, signal.SIGKILL)
        killed_in = torn[0]
        break
      time.sleep(0.002)
  finally:
    proc.kill()
    _, err = proc.communicate()
  assert killed_in, f"never caught checkpoint 2 mid-write:\n{err[-3000:]}"
  assert not (tmp_path / "killed.npz").exists()
  names = os.listdir(ckpt_dir)
  assert killed_in in names and "2" not in names, names  # the write was really cut short
  with ocp.CheckpointManager(
      str(ckpt_dir), options=ocp.CheckpointManagerOptions(read_only=True)
  ) as m:
    assert m.latest_step() == 1
    state = m.restore(1, args=ocp.args.StandardRestore())
  assert int(state["step"]) == 1

  proc = start(tmp_path / "resumed.npz")
  _, err = proc.communicate(timeout=300)
  assert proc.returncode == 0, err[-3000:]
  assert "resuming from step 1 of 4" in err
  assert not [n for n in os.listdir(ckpt_dir) if "tmp" in n]  # the torn write was cleaned up
  reference = robust_slow_save.run(str(tmp_path / "ref"), steps=4, ballast_mb=64)
  resumed = dict(np.load(tmp_path / "resumed.npz"))
  robust.assert_bitwise(resumed, reference)


def test_full_disk_is_reported_and_nothing_is_lost(tmp_path, tiny_reference):
  mnt = tmp_path / "disk"
  if not robust.mount_tmpfs(mnt, "size=1m"):
    pytest.skip("cannot mount a tmpfs here (needs root)")
  try:
    workdir = mnt / "w"
    with pytest.raises(preemption.StageInterrupted):  # stopped at step 3, saved: it fits
      tt.run_stage(workdir, batch_iter_fn=robust.signal_at(2, signal.SIGINT))
    ballast = mnt / "ballast"
    with open(ballast, "wb", buffering=0) as f:  # fill the disk (unbuffered: close cannot fail)
      try:
        while True:
          f.write(b"\0" * 65536)
      except OSError as e:
        assert e.errno == errno.ENOSPC
    with pytest.raises(errors.WorkdirWriteError) as info:
      tt.run_stage(workdir, steps=6)
    assert info.value.errno == errno.ENOSPC
    assert str(info.value) == (
        f"stage 'tiny': cannot write checkpoints/metrics in '{workdir}/tiny': the disk is full "
        "(No space left on device). Free space or pass another --workdir; the last complete "
        "checkpoint (step 3) is intact and a rerun resumes from it."
    )
    os.remove(ballast)
    params, _ = tt.run_stage(workdir, steps=6)  # space again: resumes from 3
  finally:
    robust.umount(mnt)
  robust.assert_bitwise(robust.flat(params), tiny_reference[0])


def test_full_disk_in_the_async_writer_is_reported(tmp_path, monkeypatch):
  """Without root: orbax reports a full disk as a ValueError from its writer thread."""
  original = ocp.CheckpointManager.save

  def save(self, step, *a, **k):
    if step == 4:
      raise ValueError(
          'RESOURCE_EXHAUSTED: Error writing local file "x/_sharding": Failed to '
          "write 4465 bytes to file 8: No space left on device [os_error_code='28']"
      )
    return original(self, step, *a, **k)

  monkeypatch.setattr(ocp.CheckpointManager, "save", save)
  with pytest.raises(
      errors.WorkdirWriteError, match=r"the disk is full .* checkpoint \(step 2\) " "is intact"
  ):
    tt.run_stage(tmp_path, steps=6)
