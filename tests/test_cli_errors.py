"""The CLI's user errors: `python -m linvit_jax.main` ends a known user error in one
`error: <message>` line on stderr, exit code 2, no traceback (Ctrl-C: 130, SIGTERM: 143); a bad
flag override is rejected while the flags are parsed; a bug keeps its traceback.

Part of the robustness matrix (ROBUSTNESS.md lists every case and its test). The Ctrl-C and
SIGTERM runs of the CLI are in tests/test_preemption.py; the other CLI cases in tests/test_main.py.
"""

import errno
import os
import time

import pytest

from linvit_jax import main as main_lib
from linvit_jax.conversion import preemption
from linvit_jax.conversion import stage_log
from linvit_jax.conversion import surgery
from linvit_jax.models import checkpoints
from linvit_jax.runtime import errors
from tests.helpers.robust_common import GS_PATH
from tests.helpers.subprocs import ROBUST_CONFIG
from tests.helpers.subprocs import last_line
from tests.helpers.subprocs import run_cli
from tests.helpers.subprocs import subprocess_env


def _cli(*args, num_devices=1, timeout=300, env_extra=None):
  return run_cli(*args, timeout=timeout, env=subprocess_env(num_devices, **(env_extra or {})))


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
  # Rejected before anything was written (the teacher's digest is taken before the workdir is
  # made): the corrected rerun must not be refused.
  assert not os.path.exists(workdir)


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
        (errors.ConfigError("config.x: bad"), 2, "error: config.x: bad\n"),
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
        (
            stage_log.NonFiniteLossError("stage 's': non-finite"),
            2,
            "error: stage 's': non-finite\n",
        ),
        (
            errors.WorkdirWriteError("stage 's': cannot write ...: the disk is full", errno.ENOSPC),
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
            preemption.StageInterrupted(
                "stage 's' interrupted at step 3 of 9; checkpoint saved, rerun the "
                "same command to resume"
            ),
            130,
            "error: stage 's' interrupted at step 3 of 9; checkpoint saved, rerun the same command to "
            "resume\n",
        ),
        (
            preemption.StageInterrupted(
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
