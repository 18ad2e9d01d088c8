"""Robustness matrix (issue 9): bad checkpoints, bad configs, interrupted runs and numerics.

The user-facing path first: `python -m linvit_jax.main` (a known user error ends in one
`error: <message>` line on stderr, exit code 2, no traceback; Ctrl-C exits 130) and `run.run`
(every config error is a `ConfigError` raised before the workdir is touched or anything is
computed; a bad teacher checkpoint is a `CheckpointError` raised before the first compile). Then
the gaps below the runner: Ctrl-C, kill -9 during a checkpoint write and a full disk, each leaving
a checkpoint a rerun resumes from bit for bit; bf16 linear attention on extreme inputs inside the
whole model; FAVOR features across processes. ROBUSTNESS.md lists every case and its test.

The per-module cases stay where they are (not repeated here): tests/test_checkpoints.py (15 bad
npz files against load_vit_params), tests/test_attention.py (bf16 extreme q/k/v per feature map,
FAVOR seeds), tests/test_train.py (kill -9 between steps, non-finite skip), tests/test_main.py
(unknown config field or arg at the CLI).
"""

import errno
import json
import os
import signal
import subprocess
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from linvit_jax import checkpoints
from linvit_jax import gfile
from linvit_jax import main as main_lib
from linvit_jax import metrics as metrics_lib
from linvit_jax import run as run_lib
from linvit_jax import sharding
from linvit_jax import surgery
from linvit_jax import train
from linvit_jax.models import vit
from linvit_jax.models import vit_checkpoint
from tests.helpers import robust_config as rc
from tests.helpers import robust_slow_save
from tests.helpers import tiny_task as tt
from tests.helpers.subprocs import HELPERS, ROBUST_CONFIG, ROOT, last_line, subprocess_env

GS_PATH = "gs://nonexistent-bucket/x.npz"
SAME_XLA = os.environ.get("XLA_FLAGS", "")  # for subprocesses compared bit for bit with this one


class ComputeStarted(Exception):
  """Raised by the sentinels below: the run got past its checks into real work."""


def _cli(*args, num_devices=1, timeout=300, env_extra=None):
  return subprocess.run(
      [sys.executable, "-m", "linvit_jax.main", *args],
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=timeout,
      env=subprocess_env(num_devices, **(env_extra or {})),
  )


def _assert_clean_error(proc, *fragments, code=2):
  """Exit `code`, no traceback, and a last stderr line `error: ...` holding every fragment."""
  tail = proc.stderr[-4000:]
  assert proc.returncode == code, tail
  assert "Traceback" not in proc.stderr, tail
  last = last_line(proc.stderr)
  assert last.startswith("error: "), tail
  for fragment in fragments:
    assert fragment in last, (fragment, last)
  return last


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("teacher") / "teacher.npz")
  rc.make_teacher(path)
  return path


def _config(teacher_path: str, **arg):
  spec = ",".join(f"{k}={v}" for k, v in {"teacher": teacher_path, **arg}.items())
  return rc.get_config(spec)


def _flat(tree) -> dict:
  return {k: np.asarray(v) for k, v in checkpoints.flatten(jax.device_get(tree)).items()}


def _assert_bitwise(a: dict, b: dict):
  assert sorted(a) == sorted(b)
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)


# ================================================================================================
# A. The CLI: one `error:` line, no traceback.


@pytest.mark.parametrize(
    "case", ["unknown_feature_map", "mesh_impossible", "batch_not_divisible", "gs_teacher_offline"]
)
def test_cli_user_error_is_one_line(case, teacher, tmp_path):
  workdir = str(tmp_path / "w")
  args, devices, env = ["--config", f"{ROBUST_CONFIG}:teacher={teacher}"], 1, {}
  if case == "unknown_feature_map":
    args.append("--config.student.attention=elu2")
    fragments = ["config.student.attention", "'elu2'", "hedgehog"]
  elif case == "mesh_impossible":  # the mesh is a tuple: overridable on the command line
    args.append("--config.mesh=(('data', 3), ('fsdp', 1))")
    devices, fragments = 8, ["config.mesh", "= 3 devices, but 8 devices are available"]
  elif case == "batch_not_divisible":
    args.append("--config.finetune.batch_size=12")
    devices, fragments = 8, ["config.finetune.batch_size=12", "multiple of 8"]
  else:
    args = ["--config", f"{ROBUST_CONFIG}:teacher={GS_PATH}"]
    env = {"LINVIT_REMOTE_TIMEOUT_S": "60"}
    fragments = [f"checkpoint '{GS_PATH}'", "credentials"]
  t0 = time.time()
  proc = _cli(*args, "--workdir", workdir, num_devices=devices, env_extra=env)
  _assert_clean_error(proc, *fragments)
  if case == "gs_teacher_offline":  # failed, and fast: no minutes of retries
    assert time.time() - t0 < 240
    # No stage started, and no config.json: the corrected rerun must not be refused.
    assert sorted(os.listdir(workdir)) == [".write_test"]
  else:
    assert not os.path.exists(workdir)  # rejected before anything was written


@pytest.mark.parametrize(
    "args,fragments",
    [
        (
            [f"{ROBUST_CONFIG}:teacher=x.npz", "--config.finetune.steps=abc"],
            ["config.finetune.steps=abc", "invalid literal for int"],
        ),
        (
            [f"{ROBUST_CONFIG}:teacher=x.npz", "--config.surgery.calibrate=maybe"],
            ["config.surgery.calibrate"],
        ),
        ([f"{ROBUST_CONFIG}:teacher=x.npz", "--config.model.width=1.5"], ["config.model.width"]),
        (
            [f"{ROBUST_CONFIG}:teacher=x.npz,steps=abc"],
            ["config arg steps='abc' is not an integer"],
        ),
        (
            [f"{ROBUST_CONFIG}:teacher=x.npz", "--config.steps=3"],
            ["no such config field 'steps'", "--config.steps=3"],
        ),
        (
            [f"{ROBUST_CONFIG}:teacher=x.npz", "--config.finetune.stpes=3"],
            ["'stpes'", "Did you mean"],
        ),
    ],
    ids=[
        "int_given_text",
        "bool_given_text",
        "int_given_float",
        "config_arg_type",
        "unknown_top_level_field",
        "unknown_nested_field",
    ],
)
def test_cli_bad_override_is_rejected_while_parsing_flags(args, fragments, tmp_path):
  proc = _cli("--config", *args, "--workdir", str(tmp_path / "w"), timeout=120)
  assert proc.returncode != 0
  assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
  for fragment in fragments:
    assert fragment in proc.stderr, (fragment, proc.stderr[-2000:])
  assert not os.path.exists(tmp_path / "w")


def _entry_with(monkeypatch, capsys, error):
  def fake_run(main, **kw):
    raise error

  monkeypatch.setattr(main_lib.app, "run", fake_run)
  with pytest.raises(SystemExit) as exit_info:
    main_lib.cli()
  return exit_info.value.code, capsys.readouterr().err


@pytest.mark.parametrize(
    "error,code,expected",
    [
        (run_lib.ConfigError("config.x: bad"), 2, "error: config.x: bad\n"),
        (
            checkpoints.CheckpointError("checkpoint 'a.npz': missing 'cls'"),
            2,
            "error: checkpoint 'a.npz': missing 'cls'\n",
        ),
        (
            surgery.SurgeryError("unknown surgery policy 'p'"),
            2,
            "error: unknown surgery policy 'p'\n",
        ),
        (train.NonFiniteLossError("stage 's': non-finite"), 2, "error: stage 's': non-finite\n"),
        (
            train.WorkdirWriteError("stage 's': cannot write ...: the disk is full", errno.ENOSPC),
            2,
            "error: stage 's': cannot write ...: the disk is full\n",
        ),
        (
            OSError(errno.ENOSPC, "No space left on device", "/w/student.npz"),
            2,
            "error: cannot write '/w/student.npz': No space left on device\n",
        ),
        (OSError(errno.EROFS, "Read-only file system"), 2, "Read-only file system\n"),
        (
            train.StageInterrupted(
                "stage 's' interrupted at step 3 of 9; checkpoint saved, rerun the "
                "same command to resume"
            ),
            130,
            "error: stage 's' interrupted at step 3 of 9; checkpoint saved, rerun the same command to "
            "resume\n",
        ),
        (
            train.StageInterrupted(
                "stage 's' interrupted by SIGTERM at step 3 of 9; checkpoint saved", signum=15
            ),
            143,
            "error: stage 's' interrupted by SIGTERM at step 3 of 9; checkpoint saved\n",
        ),
        (
            KeyboardInterrupt(),
            130,
            "error: interrupted outside a training stage; finished stages are "
            "checkpointed, rerun the same command to resume\n",
        ),
    ],
    ids=[
        "config",
        "checkpoint",
        "surgery",
        "nonfinite",
        "workdir_write",
        "disk_full_file",
        "read_only",
        "stage_interrupted",
        "sigterm",
        "ctrl_c_elsewhere",
    ],
)
def test_entry_formats_user_errors(error, code, expected, monkeypatch, capsys):
  got_code, err = _entry_with(monkeypatch, capsys, error)
  assert got_code == code
  assert err.endswith(expected) and err.startswith("error: ") and err.count("\n") == 1, err


def test_entry_keeps_the_traceback_of_a_bug(monkeypatch, capsys):
  with pytest.raises(ZeroDivisionError):
    _entry_with(monkeypatch, capsys, ZeroDivisionError("a bug"))


# ================================================================================================
# B. Configs: a ConfigError naming the field, before the workdir or any compute.


def _no_compute(monkeypatch):
  def boom(*a, **k):
    raise ComputeStarted("the run got past its checks")

  monkeypatch.setattr(run_lib, "_sample_images", boom)


def _set(path: str, value):
  def mutate(c):
    *parents, leaf = path.split(".")
    node = c
    for p in parents:
      node = node[p]
    with node.ignore_type():  # e.g. a per-layer list where the field holds a string
      node[leaf] = value

  return mutate


def _add_field(block: str, field: str, value):
  def mutate(c):
    c[block][field] = value

  return mutate


CONFIG_CASES = {
    "unknown_feature_map": (
        _set("student.attention", "elu2"),
        "config.student.attention: unknown attention kind 'elu2'",
    ),
    "unknown_linear_feature_map": (
        _set("student.attention", "linear:favour"),
        "config.student.attention: unknown feature map 'favour'",
    ),
    "unknown_attention_field": (
        _set("student.attention", {"kind": "linear", "fmap": "elu1"}),
        "config.student.attention: unknown attention field(s) ['fmap']",
    ),
    "per_layer_attention_wrong_length": (
        _set("student.attention", ["elu1"] * 3),
        "3 per-layer specs but depth is 2",
    ),
    "unknown_policy": (
        _set("surgery.policy", "copy_most"),
        "config.surgery.policy: unknown surgery policy 'copy_most'",
    ),
    "unknown_pp_op_train": (
        _set("data.pp_train", "decode(1)|flipp_lr"),
        "config.data.pp_train: unknown preprocessing op 'flipp_lr'",
    ),
    "unknown_pp_op_eval": (
        _set("data.pp_eval", "decode(1)|resise(8)"),
        "config.data.pp_eval: unknown preprocessing op 'resise'",
    ),
    "unknown_stage_kind": (
        _set("finetune.kind", "distil"),
        "config.finetune.kind='distil': unknown stage kind",
    ),
    "stage_block_missing": (
        _set("stages", ["distill_attention", "finetnue"]),
        "config.finetnue is missing",
    ),
    "distill_without_teacher": (_set("teacher.init", ""), "config.teacher.init is empty"),
    "zero_steps": (
        _set("finetune.steps", 0),
        "config.finetune: stage 'finetune': steps must be a positive integer, got 0",
    ),
    "unknown_optimizer": (
        _set("finetune.optimizer.name", "adamm"),
        "config.finetune.optimizer: optimizer.name='adamm'",
    ),
    "unknown_schedule": (
        _set("distill_attention.optimizer.schedule", "cosin"),
        "config.distill_attention.optimizer: optimizer.schedule='cosin'",
    ),
    "unknown_optimizer_field": (
        _add_field("finetune", "optimizer", {"learning_rate": 0.1}),
        "unknown optimizer field(s) ['learning_rate']",
    ),
    "unknown_label_loss": (
        _set("finetune.label_loss", "xent"),
        "config.finetune.label_loss='xent': unknown",
    ),
    "unknown_distill_metric": (
        _set("distill.metric", "l2"),
        "config.distill: distill.metric must be nmse or cosine",
    ),
    "unknown_distill_field": (
        _add_field("distill", "w_atn", 1.0),
        "config.distill: unknown distill config field(s) ['w_atn']",
    ),
    "unknown_variant": (
        _set("model.variant", "X/16"),
        "config.model.variant: unknown ViT variant 'X/16'",
    ),
    "unknown_model_field": (_add_field("model", "depht", 3), "unknown ViT model field(s)"),
    "mesh_impossible": (
        _set("mesh", (("data", 3), ("fsdp", 1))),
        "config.mesh / batch_size on 1 devices",
    ),
    "mesh_two_rest_axes": (_set("mesh", (("data", -1), ("fsdp", -1))), "at most one axis"),
    "batch_not_divisible_by_accumulation": (
        _set("finetune.optimizer.accum_steps", 3),
        "config.finetune.batch_size=8",
    ),
}


@pytest.mark.parametrize("case", sorted(CONFIG_CASES))
def test_config_error_before_workdir_or_compute(case, teacher, tmp_path, monkeypatch):
  mutate, message = CONFIG_CASES[case]
  config = _config(teacher)
  mutate(config)
  _no_compute(monkeypatch)
  workdir = str(tmp_path / "w")
  with pytest.raises(run_lib.ConfigError) as info:
    run_lib.run(config, workdir)
  assert message in str(info.value), str(info.value)
  assert not os.path.exists(workdir)


def test_valid_config_passes_the_checks(teacher, tmp_path, monkeypatch):
  """The sentinel is reached: the matrix above fails for its own reasons, not a broken config."""
  _no_compute(monkeypatch)
  with pytest.raises(ComputeStarted):
    run_lib.run(_config(teacher), str(tmp_path / "w"))


def test_workdir_under_a_file_is_reported(teacher, tmp_path, monkeypatch):
  _no_compute(monkeypatch)
  (tmp_path / "a_file").write_text("x")
  with pytest.raises(run_lib.ConfigError, match=r"workdir .*a_file/w' is not writable"):
    run_lib.run(_config(teacher), str(tmp_path / "a_file" / "w"))


def _mount_tmpfs(path, options: str) -> bool:
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


def _umount(path):
  subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)


def test_read_only_workdir_is_reported(teacher, tmp_path, monkeypatch):
  mnt = tmp_path / "ro"
  if not _mount_tmpfs(mnt, "ro,size=64k"):
    pytest.skip("cannot mount a tmpfs here (needs root)")
  try:
    _no_compute(monkeypatch)
    with pytest.raises(run_lib.ConfigError, match=r"is not writable: .*Read-only file system"):
      run_lib.run(_config(teacher), str(mnt / "w"))
  finally:
    _umount(mnt)


def test_workdir_of_another_run_is_not_resumed_or_overwritten(teacher, tmp_path, monkeypatch):
  # config.json is written once the inputs load; stop right after that, at the surgery.
  def boom(*a, **k):
    raise ComputeStarted("the run got past its checks")

  monkeypatch.setattr(run_lib.surgery, "transplant", boom)
  workdir = str(tmp_path / "w")
  with pytest.raises(ComputeStarted):  # the first run records its config
    run_lib.run(_config(teacher, feature_map="elu1"), workdir)
  recorded = (tmp_path / "w" / "config.json").read_text()
  with pytest.raises(
      run_lib.ConfigError,
      match=r"holds a run of another config \(student\."
      r"attention: \"elu1\" there, \"relu\" now\)",
  ):
    run_lib.run(_config(teacher, feature_map="relu"), workdir)
  assert (tmp_path / "w" / "config.json").read_text() == recorded
  changed = _config(teacher, feature_map="elu1")
  changed.finetune.log_every = 7  # bookkeeping, not the run's identity: resumes
  with pytest.raises(ComputeStarted):
    run_lib.run(changed, workdir)


# ================================================================================================
# C. Teacher checkpoints through run.run: a CheckpointError before the first compile.


def _save_variant(path, seed=0, scan=False, mutate=None, **model_over):
  """A teacher npz like rc.make_teacher's, optionally scanned and edited (flat name -> array)."""
  rc.make_teacher(path, seed=seed, **model_over)
  flat = checkpoints.flatten(checkpoints.load_npz(path))
  if mutate is not None:
    mutate(flat)
  tree = checkpoints.unflatten(flat)
  if scan:
    tree = vit_checkpoint.pyloop_to_scan(tree)
  checkpoints.save_npz(path, tree)


QKV = "Transformer/encoderblock_1/MultiHeadDotProductAttention_0/query/kernel"


def _ckpt_truncated(path):
  rc.make_teacher(path)
  data = open(path, "rb").read()
  open(path, "wb").write(data[: len(data) // 3])
  return "truncated or corrupt"


def _ckpt_missing_key(path):
  _save_variant(path, mutate=lambda f: f.pop(QKV))
  return f"missing '{QKV}' (expected shape (32, 2, 16))"


def _ckpt_extra_key(path):
  _save_variant(path, mutate=lambda f: f.update({"Transformer/extra/kernel": np.zeros(3)}))
  return "unexpected key 'Transformer/extra/kernel'"


def _ckpt_wrong_shape(path):
  _save_variant(path, mutate=lambda f: f.update({QKV: np.zeros((32, 2, 8), np.float32)}))
  return f"shape mismatch at '{QKV}': checkpoint (32, 2, 8) vs model (32, 2, 16)"


def _ckpt_wrong_dtype(path):
  _save_variant(path, mutate=lambda f: f.update({"cls": f["cls"].astype(np.int32)}))
  return "dtype mismatch at 'cls': checkpoint int32 (integer) vs model float32 (float)"


def _ckpt_nan(path):
  def poison(f):
    f[QKV] = f[QKV].copy()
    f[QKV][0, 0, :2] = np.nan

  _save_variant(path, mutate=poison)
  return f"non-finite values at '{QKV}': 2 of"


def _ckpt_inf(path):
  def poison(f):
    f["head/kernel"] = f["head/kernel"].copy()
    f["head/kernel"][0, 0] = -np.inf

  _save_variant(path, mutate=poison)
  return "non-finite values at 'head/kernel': 1 of"


def _ckpt_patch_size(path):
  _save_variant(path, patch_size=(4, 4))
  return "patch size (4, 4)"


def _ckpt_width(path):
  _save_variant(path, width=48, num_heads=2)
  return "width 48"


def _ckpt_depth(path):
  _save_variant(path, depth=3)
  return "unexpected key 'Transformer/encoderblock_2/"


def _ckpt_directory(path):
  os.makedirs(path)  # read as a Hugging Face / timm model folder, which this is not
  return "a folder without config.json"


def _ckpt_not_found(path):
  return "file not found"


CKPT_CASES = {
    f.__name__[6:]: f
    for f in (
        _ckpt_truncated,
        _ckpt_missing_key,
        _ckpt_extra_key,
        _ckpt_wrong_shape,
        _ckpt_wrong_dtype,
        _ckpt_nan,
        _ckpt_inf,
        _ckpt_patch_size,
        _ckpt_width,
        _ckpt_depth,
        _ckpt_directory,
        _ckpt_not_found,
    )
}


@pytest.fixture
def before_compile(monkeypatch):
  """Images without the data pipeline, and a jax.jit that must not be reached."""
  monkeypatch.setattr(
      run_lib, "_sample_images", lambda config, n: np.zeros((n, 28, 28, 1), np.float32)
  )

  def no_jit(*a, **k):
    raise ComputeStarted("jax.jit was called before the checkpoint was checked")

  monkeypatch.setattr(jax, "jit", no_jit)


@pytest.mark.parametrize("case", sorted(CKPT_CASES))
def test_bad_teacher_fails_before_compile(case, tmp_path, before_compile):
  path = str(tmp_path / "teacher.npz")
  message = CKPT_CASES[case](path)
  with pytest.raises(checkpoints.CheckpointError) as info:
    run_lib.run(_config(path), str(tmp_path / "w"))
  assert f"checkpoint '{path}'" in str(info.value) and message in str(info.value), str(info.value)


def test_good_teacher_reaches_compile(teacher, tmp_path, before_compile):
  with pytest.raises(ComputeStarted):
    run_lib.run(_config(teacher), str(tmp_path / "w"))


@pytest.mark.parametrize(
    "saved_scan,model_scan",
    [(True, False), (False, True)],
    ids=["scanned_file_loop_model", "loop_file_scanned_model"],
)
def test_scan_layout_mismatch_is_converted_not_an_error(saved_scan, model_scan, tmp_path):
  """big_vision's semantics: the layout follows the model config; values are unchanged."""
  loop_path, path = str(tmp_path / "loop.npz"), str(tmp_path / "t.npz")
  rc.make_teacher(loop_path)
  _save_variant(path, scan=saved_scan)
  config = _config(path)
  config.model.scan = model_scan
  kw = run_lib.model_kwargs(config)
  model = vit.Model(**kw, attention="softmax")
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((1, 28, 28, 1)))["params"]
  loaded = vit.load(shapes, path, kw)
  expected = checkpoints.load_npz(loop_path)
  if model_scan:
    expected = vit_checkpoint.pyloop_to_scan(expected)
  _assert_bitwise(_flat(loaded), _flat(expected))


def test_gs_path_without_network_fails_fast_and_says_why():
  import tensorflow as tf  # imported first: its import time is not what is measured

  del tf
  t0 = time.time()
  with pytest.raises(checkpoints.CheckpointError, match="credentials") as info:
    checkpoints.load_npz(GS_PATH)
  assert time.time() - t0 < 60
  assert str(info.value).startswith(f"checkpoint '{GS_PATH}': ")


def test_remote_read_that_hangs_is_cut_off(monkeypatch):
  release = threading.Event()

  class HangingGFile:

    @staticmethod
    def exists(path):
      release.wait(30)
      return True

  monkeypatch.setattr(gfile, "tf_gfile", lambda: HangingGFile)
  monkeypatch.setattr(checkpoints, "REMOTE_TIMEOUT_S", 0.5)
  t0 = time.time()
  try:
    with pytest.raises(checkpoints.CheckpointError, match=r"no answer within 0 s .*credentials"):
      checkpoints.load_npz("gs://bucket/slow.npz")
  finally:
    release.set()
  assert time.time() - t0 < 10


# ================================================================================================
# D. Runs: Ctrl-C, kill -9 during a checkpoint write, a full disk, non-finite losses.


@pytest.fixture(scope="module")
def tiny_reference(tmp_path_factory):
  params, history = tt.run_stage(tmp_path_factory.mktemp("tiny_ref"))
  return _flat(params), history


def _interrupt_at(step_to_interrupt: int):
  """tiny_task's batches; asking for batch `step_to_interrupt` sends this process a SIGINT (the
  runner finishes that step, then saves: the checkpoint is step_to_interrupt + 1)."""
  inner = tt.batch_iter_fn()

  def make(start):
    for step, batch in enumerate(inner(start), start):
      if step == step_to_interrupt:
        os.kill(os.getpid(), signal.SIGINT)
      yield batch

  return make


def test_ctrl_c_saves_and_the_rerun_is_bitwise_equal(tmp_path, tiny_reference):
  with pytest.raises(train.StageInterrupted) as info:
    tt.run_stage(tmp_path, batch_iter_fn=_interrupt_at(2))  # periodic checkpoints: 2, 4, 6
  assert str(info.value) == (
      "stage 'tiny' interrupted at step 3 of 6; checkpoint saved, rerun "
      "the same command to resume"
  )
  with ocp.CheckpointManager(str(tmp_path / "tiny" / "checkpoints")) as m:
    assert m.all_steps() == [2, 3]
  params, history = tt.run_stage(tmp_path)
  _assert_bitwise(_flat(params), tiny_reference[0])
  assert [r["loss"] for r in history if "loss" in r] == [
      r["loss"] for r in tiny_reference[1] if "loss" in r
  ]


def test_second_ctrl_c_stops_at_once_and_restores_the_handler(tmp_path):
  inner = tt.batch_iter_fn()

  def twice_at_3(start):
    for step, batch in enumerate(inner(start), start):
      if step == 3:
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)
      yield batch

  with pytest.raises(train.StageInterrupted, match="interrupted at step 3 of 6; checkpoint saved"):
    tt.run_stage(tmp_path, batch_iter_fn=twice_at_3)
  assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_ctrl_c_inside_a_step_falls_back_to_the_last_checkpoint(tmp_path):
  """A donated (deleted) state cannot be saved: the message says where a rerun resumes."""
  mesh = sharding.make_mesh([("data", -1), ("fsdp", 1)])
  tt.run_stage(tmp_path, steps=2)
  x = jax.device_put(jnp.zeros(3), sharding.replicated(mesh))
  x.delete()
  state = train.TrainState(
      step=jnp.asarray(5),
      params={"x": x},
      opt_state=(),
      rng=x,
      nonfinite_total=jnp.asarray(0),
      nonfinite_in_a_row=jnp.asarray(0),
  )
  with ocp.CheckpointManager(str(tmp_path / "tiny" / "checkpoints")) as m:
    err = train._interrupted("tiny", 9, state, m)
  assert isinstance(err, KeyboardInterrupt)
  assert (
      "nothing new was saved, rerunning the same command resumes from the last checkpoint, "
      "step 2" in str(err)
  )


def test_kill_9_during_a_checkpoint_write_keeps_the_previous_one(tmp_path):
  """SIGKILL while checkpoint 2 is being written (a 64 MB frozen leaf makes the write slow):
  checkpoint 1 restores, the torn one is discarded, the rerun ends bit-identical."""
  script = os.path.join(HELPERS, "robust_slow_save.py")
  ckpt_dir = tmp_path / "w" / "tiny" / "checkpoints"

  def start(out):
    return subprocess.Popen(
        [sys.executable, script, "--workdir", str(tmp_path / "w"), "--out", str(out)],
        cwd=ROOT,
        env=subprocess_env(1, XLA_FLAGS=SAME_XLA),
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
  _assert_bitwise(resumed, reference)


def test_full_disk_is_reported_and_nothing_is_lost(tmp_path, tiny_reference):
  mnt = tmp_path / "disk"
  if not _mount_tmpfs(mnt, "size=1m"):
    pytest.skip("cannot mount a tmpfs here (needs root)")
  try:
    workdir = mnt / "w"
    with pytest.raises(train.StageInterrupted):  # stopped at step 3, saved: it fits
      tt.run_stage(workdir, batch_iter_fn=_interrupt_at(2))
    ballast = mnt / "ballast"
    with open(ballast, "wb") as f:  # fill the disk
      try:
        while True:
          f.write(b"\0" * 65536)
          f.flush()
      except OSError as e:
        assert e.errno == errno.ENOSPC
    with pytest.raises(train.WorkdirWriteError) as info:
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
    _umount(mnt)
  _assert_bitwise(_flat(params), tiny_reference[0])


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
      train.WorkdirWriteError, match=r"the disk is full .* checkpoint \(step 2\) " "is intact"
  ):
    tt.run_stage(tmp_path, steps=6)


def test_nonfinite_loss_stops_the_run_with_a_clear_error(tmp_path):
  """SGD at a learning rate of 1e30 blows the student up after one update (its gradients
  overflow); two skipped steps in a row stop the stage with a message that says what to change.
  (Adam's updates are bounded by the lr, and big_vision's decoupled wd no longer multiplies
  params by lr·wd each step, so adam alone stays finite here.)"""
  config = rc.get_config("stages=train,steps=6")
  config.train.optimizer.name = "sgd"
  config.train.optimizer.lr = 1e30
  config.train.optimizer.grad_clip = 0.0
  config.train.max_nonfinite_in_a_row = 2
  with pytest.raises(
      train.NonFiniteLossError,
      match=r"stage 'train': the loss or its gradients "
      r"were non-finite for 2 steps in a row .* Lower optimizer.lr",
  ):
    run_lib.run(config, str(tmp_path / "w"))
  rows = metrics_lib.read_jsonl(str(tmp_path / "w" / "train" / metrics_lib.METRICS_FILE))
  assert rows[-1]["nonfinite_in_a_row"] == 2
  assert rows[-1]["loss"] is None or rows[-1]["grad_norm"] is None  # logged as null


def test_cli_ctrl_c_saves_exits_130_and_the_rerun_resumes(teacher, tmp_path):
  """SIGINT to `python -m linvit_jax.main` in the middle of a stage, then the same command."""
  workdir = tmp_path / "w"
  args = [
      sys.executable,
      "-m",
      "linvit_jax.main",
      "--config",
      f"{ROBUST_CONFIG}:teacher={teacher},steps=400,finetune_steps=2,checkpoint_every=1000",
      "--workdir",
      str(workdir),
  ]
  log = workdir.parent / "first.log"
  metrics = workdir / "distill_attention" / metrics_lib.METRICS_FILE
  with open(log, "w") as f:
    proc = subprocess.Popen(args, cwd=ROOT, env=subprocess_env(1), stdout=f, stderr=f)
    try:
      deadline = time.time() + 400
      while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
          proc.send_signal(signal.SIGINT)
          break
        time.sleep(0.05)
      proc.wait(timeout=120)
    finally:
      if proc.poll() is None:
        proc.kill()
  out = log.read_text()
  assert proc.returncode == 130, out[-4000:]
  assert "Traceback" not in out, out[-4000:]
  last = last_line(out)
  assert last.startswith("error: stage 'distill_attention' interrupted at step "), last
  assert last.endswith(" of 400; checkpoint saved, rerun the same command to resume"), last
  step = int(last.split(" at step ")[1].split()[0])
  assert 1 <= step < 400
  assert (workdir / "distill_attention" / "checkpoints" / str(step)).is_dir()
  assert not (workdir / "results.json").exists()

  again = subprocess.run(
      args, cwd=ROOT, env=subprocess_env(1), capture_output=True, text=True, timeout=600
  )
  assert again.returncode == 0, again.stderr[-4000:]
  assert f"stage 'distill_attention': resuming from step {step} of 400" in again.stderr
  rows = metrics_lib.read_jsonl(str(metrics))
  steps = [r["step"] for r in rows if "loss" in r]
  assert steps == sorted(set(steps)) and steps[-1] == 400  # no step logged twice
  with open(workdir / "results.json") as f:
    assert 0.0 <= json.load(f)["student_top1"] <= 1.0


# ================================================================================================
# E. Numerics in the whole model (the operator-level cases live in tests/test_attention.py).


@pytest.mark.parametrize("fmap", ["elu1", "relu", "hedgehog", "favor", "chunked_softmax"])
def test_bf16_student_with_extreme_inputs_stays_finite(fmap):
  """bf16 matmuls under jit (a whole model: XLA:CPU once failed here on bf16×bf16→f32 dots), and
  inputs that push each feature map to its edge: q/k of norm ~1e3, q/k pre-activations ≤ -8
  (elu+1 ≈ 0, relu = 0: the normaliser is ε alone), all tokens equal (a constant image: zero
  LayerNorm variance)."""
  model = vit.Model(
      num_classes=10, attention=fmap, dtype_mm="bfloat16", head_zeroinit=False, **rc.MODEL
  )
  image = jax.random.normal(jax.random.PRNGKey(1), (2, 28, 28, 1))
  params = model.init(jax.random.PRNGKey(0), image)["params"]

  def edit(params, fn):
    flat = checkpoints.flatten(params)
    for name in list(flat):
      if "/query/" in name or "/key/" in name:
        flat[name] = fn(name, flat[name])
    return checkpoints.unflatten(flat)

  large = edit(params, lambda n, x: x * 300.0 if n.endswith("kernel") else x)
  negative = edit(params, lambda n, x: x * 0.0 + (-40.0 if n.endswith("bias") else 0.0))
  constant = jnp.full_like(image, 0.7)
  apply = jax.jit(lambda p, x: model.apply({"params": p}, x))
  for what, p, x in (
      ("large-norm q/k", large, image),
      ("q/k <= -8", negative, image),
      ("all tokens equal", params, constant),
      ("all equal + large", large, constant),
  ):
    logits, out = apply(p, x)
    for name, value in (("logits", logits), ("encoded", out["encoded"])):
      value = np.asarray(value.astype(jnp.float32))
      assert np.isfinite(value).all(), (fmap, what, name)
    assert np.abs(np.asarray(logits, np.float32)).max() > 0, (fmap, what)  # a real output


_FAVOR_PROBE = """
import jax, numpy as np
from linvit_jax.models import vit
from tests.helpers import robust_config as rc
m = vit.Model(num_classes=10, attention={"kind": "linear", "feature_map": "favor",
              "favor_seed": 3, "num_features": 16}, **rc.MODEL)
x = jax.random.normal(jax.random.PRNGKey(1), (2, 28, 28, 1))
p = m.init(jax.random.PRNGKey(0), x)["params"]
print(repr(np.asarray(m.apply({"params": p}, x)[1]["pre_logits"]).tobytes().hex()))
"""


def test_favor_features_are_the_same_for_a_seed_in_a_fresh_process():
  other = subprocess.run(
      [sys.executable, "-c", _FAVOR_PROBE],
      cwd=ROOT,
      env=subprocess_env(1, XLA_FLAGS=SAME_XLA),
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert other.returncode == 0, other.stderr[-2000:]

  def logits(seed):
    m = vit.Model(
        num_classes=10,
        attention={
            "kind": "linear",
            "feature_map": "favor",
            "favor_seed": seed,
            "num_features": 16,
        },
        **rc.MODEL,
    )
    x = jax.random.normal(jax.random.PRNGKey(1), (2, 28, 28, 1))
    p = m.init(jax.random.PRNGKey(0), x)["params"]
    return repr(np.asarray(m.apply({"params": p}, x)[1]["pre_logits"]).tobytes().hex())

  assert last_line(other.stdout) == logits(3)  # same seed, another process: the same bits
  assert logits(4) != logits(3)  # another seed: other features
