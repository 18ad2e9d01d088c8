"""The run driver (`run.run`) against bad configs and bad teacher checkpoints.

Every config error is a `ConfigError` naming the field, raised before the workdir is touched or
anything is computed; a bad teacher checkpoint is a `CheckpointError` raised before the first
compile; a workdir holding another config's run is refused; a loss that stays non-finite stops the
run with a message that says what to change. Part of the robustness matrix (ROBUSTNESS.md lists
every case and its test).
"""

import os

import jax
import numpy as np
import pytest

from linvit_jax import build
from linvit_jax import run as run_lib
from linvit_jax.conversion import stage_log
from linvit_jax.models import checkpoints
from linvit_jax.runtime import errors
from linvit_jax.runtime import metrics as metrics_lib
from tests.helpers import robust_common as robust
from tests.helpers import robust_config as rc


class ComputeStarted(Exception):
  """Raised by the sentinels below: the run got past its checks into real work."""


# ================================================================================================
# Configs: a ConfigError naming the field, before the workdir or any compute.


def _no_compute(monkeypatch):
  def boom(*a, **k):
    raise ComputeStarted("the run got past its checks")

  monkeypatch.setattr(build, "_sample_images", boom)


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
  config = robust.config(teacher)
  mutate(config)
  _no_compute(monkeypatch)
  workdir = str(tmp_path / "w")
  with pytest.raises(errors.ConfigError) as info:
    run_lib.run(config, workdir)
  assert message in str(info.value), str(info.value)
  assert not os.path.exists(workdir)


def test_valid_config_passes_the_checks(teacher, tmp_path, monkeypatch):
  """The sentinel is reached: the matrix above fails for its own reasons, not a broken config."""
  _no_compute(monkeypatch)
  with pytest.raises(ComputeStarted):
    run_lib.run(robust.config(teacher), str(tmp_path / "w"))


def test_workdir_under_a_file_is_reported(teacher, tmp_path, monkeypatch):
  _no_compute(monkeypatch)
  (tmp_path / "a_file").write_text("x")
  with pytest.raises(errors.ConfigError, match=r"workdir .*a_file/w' is not writable"):
    run_lib.run(robust.config(teacher), str(tmp_path / "a_file" / "w"))


def test_read_only_workdir_is_reported(teacher, tmp_path, monkeypatch):
  mnt = tmp_path / "ro"
  if not robust.mount_tmpfs(mnt, "ro,size=64k"):
    pytest.skip("cannot mount a tmpfs here (needs root)")
  try:
    _no_compute(monkeypatch)
    with pytest.raises(errors.ConfigError, match=r"is not writable: .*Read-only file system"):
      run_lib.run(robust.config(teacher), str(mnt / "w"))
  finally:
    robust.umount(mnt)


def test_workdir_of_another_run_is_not_resumed_or_overwritten(teacher, tmp_path, monkeypatch):
  # config.json is written once the inputs load; stop right after that, at the surgery.
  def boom(*a, **k):
    raise ComputeStarted("the run got past its checks")

  monkeypatch.setattr(run_lib.surgery, "transplant", boom)
  workdir = str(tmp_path / "w")
  with pytest.raises(ComputeStarted):  # the first run records its config
    run_lib.run(robust.config(teacher, feature_map="elu1"), workdir)
  recorded = (tmp_path / "w" / "config.json").read_text()
  with pytest.raises(
      errors.ConfigError,
      match=r"holds a run of another config \(student\."
      r"attention: \"elu1\" there, \"relu\" now\)",
  ):
    run_lib.run(robust.config(teacher, feature_map="relu"), workdir)
  assert (tmp_path / "w" / "config.json").read_text() == recorded
  changed = robust.config(teacher, feature_map="elu1")
  changed.finetune.log_every = 7  # bookkeeping, not the run's identity: resumes
  with pytest.raises(ComputeStarted):
    run_lib.run(changed, workdir)


# ================================================================================================
# Teacher checkpoints: a CheckpointError before the first compile.


QKV = "Transformer/encoderblock_1/MultiHeadDotProductAttention_0/query/kernel"


def _ckpt_truncated(path):
  rc.make_teacher(path)
  data = open(path, "rb").read()
  open(path, "wb").write(data[: len(data) // 3])
  return "truncated or corrupt"


def _ckpt_missing_key(path):
  robust.save_variant(path, mutate=lambda f: f.pop(QKV))
  return f"missing '{QKV}' (expected shape (32, 2, 16))"


def _ckpt_extra_key(path):
  robust.save_variant(path, mutate=lambda f: f.update({"Transformer/extra/kernel": np.zeros(3)}))
  return "unexpected key 'Transformer/extra/kernel'"


def _ckpt_wrong_shape(path):
  robust.save_variant(path, mutate=lambda f: f.update({QKV: np.zeros((32, 2, 8), np.float32)}))
  return f"shape mismatch at '{QKV}': checkpoint (32, 2, 8) vs model (32, 2, 16)"


def _ckpt_wrong_dtype(path):
  robust.save_variant(path, mutate=lambda f: f.update({"cls": f["cls"].astype(np.int32)}))
  return "dtype mismatch at 'cls': checkpoint int32 (integer) vs model float32 (float)"


def _ckpt_nan(path):
  def poison(f):
    f[QKV] = f[QKV].copy()
    f[QKV][0, 0, :2] = np.nan

  robust.save_variant(path, mutate=poison)
  return f"non-finite values at '{QKV}': 2 of"


def _ckpt_inf(path):
  def poison(f):
    f["head/kernel"] = f["head/kernel"].copy()
    f["head/kernel"][0, 0] = -np.inf

  robust.save_variant(path, mutate=poison)
  return "non-finite values at 'head/kernel': 1 of"


def _ckpt_patch_size(path):
  robust.save_variant(path, patch_size=(4, 4))
  return "patch size (4, 4)"


def _ckpt_width(path):
  robust.save_variant(path, width=48, num_heads=2)
  return "width 48"


def _ckpt_depth(path):
  robust.save_variant(path, depth=3)
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
      build, "_sample_images", lambda config, n: np.zeros((n, 28, 28, 1), np.float32)
  )

  def no_jit(*a, **k):
    raise ComputeStarted("jax.jit was called before the checkpoint was checked")

  monkeypatch.setattr(jax, "jit", no_jit)


@pytest.mark.parametrize("case", sorted(CKPT_CASES))
def test_bad_teacher_fails_before_compile(case, tmp_path, before_compile):
  path = str(tmp_path / "teacher.npz")
  message = CKPT_CASES[case](path)
  with pytest.raises(checkpoints.CheckpointError) as info:
    run_lib.run(robust.config(path), str(tmp_path / "w"))
  assert f"checkpoint '{path}'" in str(info.value) and message in str(info.value), str(info.value)


def test_good_teacher_reaches_compile(teacher, tmp_path, before_compile):
  with pytest.raises(ComputeStarted):
    run_lib.run(robust.config(teacher), str(tmp_path / "w"))


# ================================================================================================
# Numerics: a loss that stays non-finite stops the run.


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
      stage_log.NonFiniteLossError,
      match=r"stage 'train': the loss or its gradients "
      r"were non-finite for 2 steps in a row .* Lower optimizer.lr",
  ):
    run_lib.run(config, str(tmp_path / "w"))
  rows = metrics_lib.read_jsonl(str(tmp_path / "w" / "train" / metrics_lib.METRICS_FILE))
  assert rows[-1]["nonfinite_in_a_row"] == 2
  assert rows[-1]["loss"] is None or rows[-1]["grad_norm"] is None  # logged as null
