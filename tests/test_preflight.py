"""preflight.py: a stage block holds exactly the fields its kind reads; anything else is an error
that names the field and the kind, before any compute (config files and --config overrides)."""

import json
import os
import subprocess
import sys

import ml_collections as mlc
import pytest

from linvit_jax import preflight
from linvit_jax.configuration import config_lib
from linvit_jax.runtime.errors import ConfigError
from tests.helpers.stage_configs import finetune_only

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_each_kind_has_its_own_schema():
  assert "w_feature" not in config_lib.stage_fields("distill_attention")  # config.distill's
  assert {"w_label", "label_loss"} <= config_lib.stage_fields("finetune")
  assert "w_label" not in config_lib.stage_fields("align")  # label-free
  assert config_lib.stage("align", steps=4, batch_size=2, lr=1.0)["trainable"] == "all"
  with pytest.raises(
      ValueError, match=r"a distill_attention stage has no field\(s\) \['w_feature'\]"
  ):
    config_lib.stage("distill_attention", steps=4, batch_size=2, lr=1.0, w_feature=1.0)


def test_a_field_the_kind_does_not_read_is_an_error():
  config = config_lib.base_config()
  preflight.check_stage_fields("finetune", config.finetune)
  config.distill_attention.w_feature = 1.0  # what a config file could write (it is not locked)
  with pytest.raises(ConfigError, match=r"config.distill_attention.w_feature: a distill_attention"):
    preflight.validate(config)
  config = config_lib.base_config()
  del config.finetune["label_loss"]
  with pytest.raises(
      ConfigError, match=r"config.finetune \(finetune stage\) lacks \['label_loss'\]"
  ):
    preflight.validate(config)
  config = config_lib.base_config()
  config.finetune.kind = "distil"
  with pytest.raises(ConfigError, match=r"config.finetune.kind='distil': unknown stage kind"):
    preflight.validate(config)


def test_attention_option_values_are_checked_against_the_image():
  """More sink keys than patch tokens, or a bad window, fail before compute naming the field."""
  config = config_lib.base_config()  # 28-px images of 4-px patches: 49 patch tokens
  config.stages = ()  # (no teacher needed)

  def with_attention(**spec):
    config.student = {**config.student.to_dict(), "attention": dict(kind="linear", **spec)}
    return config

  with pytest.raises(ConfigError, match=r"sinks=50 is more than the 49 patch tokens of a 28-px"):
    preflight.validate(with_attention(sinks=50))
  preflight.validate(with_attention(sinks=49))
  with pytest.raises(ConfigError, match=r"config.student.attention: attention sinks must be >= 0"):
    preflight.validate(with_attention(sinks=-1))
  with pytest.raises(
      ConfigError, match=r"config.student.attention: attention window must be an odd number.*got 2"
  ):
    preflight.validate(with_attention(window=2))


class _null:

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    return False


def test_cli_override_of_an_unread_field_names_the_kind(tmp_path):
  cmd = [
      sys.executable, "-m", "linvit_jax.main", "--config", "configs/demo.py:tiny=True",
      "--workdir", str(tmp_path / "w"), "--config.distill_attention.w_feature=1",
  ]  # fmt: skip
  out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert out.returncode == 2
  last = out.stderr.strip().splitlines()[-1]
  assert "no such config field 'w_feature'" in last
  assert "a distill_attention stage does not read 'w_feature'" in last
  assert "config.distill's" in last and not os.path.exists(tmp_path / "w")


def test_a_field_whose_feature_is_off_is_overridden_like_any_other():
  """Every field exists in every run at its off value (w_structure 0, lora_rank 0, ...): an
  override of it means the same whether or not the config turned the feature on."""
  from linvit_jax import main

  config = main._load_config("configs/demo.py:tiny=True")
  assert config.finetune.w_structure == 0.0 and config.finetune.optimizer.lora_rank == 0
  assert main._stage_field_hint(config, "--config.finetune.w_structure=1") == ""
  hint = main._stage_field_hint(config, "--config.finetune.w_bogus=1")
  assert "a finetune stage does not read 'w_bogus'" in hint


def test_composed_images_with_a_label_loss_are_refused():
  config = config_lib.base_config()
  config.stages = ("finetune",)
  config.data.compose = 0.5
  with pytest.raises(ConfigError, match=r"config.data.compose=0.5: composed images have no one"):
    preflight.validate(config)


def test_align_options_are_checked_before_compute():
  config = config_lib.base_config()
  config.teacher.init = "teacher.npz"  # not read: the checks below come first
  config.align = config_lib.stage("align", steps=2, batch_size=2, lr=1e-4, blocks_top_weight=0.0)
  config.stages = ("align",)
  with pytest.raises(ConfigError, match=r"config.align.blocks_top_weight=0.0: must be > 0"):
    preflight.validate(config)
  config.align = config_lib.stage("align", steps=2, batch_size=2, lr=1e-4, update_scale="rms")
  with pytest.raises(ConfigError, match=r"update_scale='rms'"):
    preflight.validate(config)


def test_a_stage_pp_string_is_parsed_before_compute():
  config = config_lib.base_config()
  config.finetune = config_lib.stage(
      "finetune", steps=2, batch_size=2, lr=1e-4, pp_train="decode|color_jitter(p=2)"
  )
  config.stages = ("finetune",)
  with pytest.raises(ConfigError, match=r"config.finetune.pp_train: .*p=2"):
    preflight.validate(config)
  config.finetune.pp_train = ""  # "": the data block's pp string
  preflight.validate(config)


def test_a_run_recorded_before_stage_pp_train_existed_still_resumes(tmp_path):
  import json

  config = config_lib.base_config()
  old = json.loads(config.to_json_best_effort())
  for name in config.stages:
    del old[name]["pp_train"]  # what config.json held before the fields were added
    del old[name]["start_weight"]
    del old[name]["mixup"]
  (tmp_path / "config.json").write_text(json.dumps(old))
  preflight.check_same_run(str(tmp_path), config)  # their defaults are what that run did
  stage = config.stages[0]
  config[stage].pp_train = "decode|flip_lr"
  with pytest.raises(ConfigError, match=rf"{stage}.pp_train: \"\" there"):
    preflight.check_same_run(str(tmp_path), config)
  config[stage].pp_train = ""
  config[stage].start_weight = 0.5
  with pytest.raises(ConfigError, match=rf"{stage}.start_weight: 0.0 there, 0.5 now"):
    preflight.check_same_run(str(tmp_path), config)


def test_a_bad_start_weight_fails_before_compute_naming_the_stage():
  config = finetune_only(start_weight=1.5)
  with pytest.raises(ConfigError, match=r"config.finetune: stage 'finetune': start_weight=1.5"):
    preflight.validate(config)
  config.finetune.start_weight = 0.5
  preflight.validate(config)
  config = finetune_only(ema_decay=1.0)
  with pytest.raises(ConfigError, match=r"config.finetune.optimizer: optimizer.ema_decay=1.0"):
    preflight.validate(config)
  config = finetune_only(average_last=2.0)
  with pytest.raises(ConfigError, match=r"config.finetune.optimizer: optimizer.average_last=2.0"):
    preflight.validate(config)


def test_mixup_is_checked_before_compute_naming_the_stage():
  config = finetune_only(mixup=-0.5)
  with pytest.raises(ConfigError, match=r"config.finetune.mixup=-0.5: the Beta concentration"):
    preflight.validate(config)
  config.finetune.mixup = float("nan")
  with pytest.raises(ConfigError, match=r"config.finetune.mixup=nan: .* finite"):
    preflight.validate(config)
  config.finetune.mixup, config.finetune.batch_size = 1.0, 1
  with pytest.raises(ConfigError, match=r"config.finetune.mixup=1.0: blends images within"):
    preflight.validate(config)
  config.finetune.batch_size = 2
  config.finetune.mixup = 1.0  # blends have no one label: refused while the stage reads labels
  with pytest.raises(ConfigError, match=r"config.finetune.mixup=1.0: blended images have no one"):
    preflight.validate(config)
  config.finetune.w_label = 0.0
  config.finetune.w_feature = 1.0
  config.teacher.init = "teacher.npz"
  preflight.validate(config)


def test_fields_at_their_off_value_resume_a_run_recorded_before_they_were_written(tmp_path):
  """Every stage holds w_structure and every optimizer field (off: 0); a run recorded when they
  were written only when on (no w_structure, a short optimizer block) is the same run; turning
  one on is another run; a stage kind without the loss refuses it."""
  config = config_lib.base_config()
  config.align = config_lib.align_stage(steps=2, batch_size=2)
  config.stages = tuple(config.stages) + ("align",)
  assert config.align.w_structure == 0.0 and config.align.optimizer.lora_rank == 0
  recorded = json.loads(config.to_json_best_effort())
  for name in config.stages:  # as runs recorded before 2026-12-06 wrote their stages
    recorded[name].pop("w_structure", None)
    for field in ("ema_decay", "average_last", "lora_rank", "b1", "eps", "momentum"):
      recorded[name]["optimizer"].pop(field)
  (tmp_path / "config.json").write_text(json.dumps(recorded))
  preflight.check_same_run(str(tmp_path), config)
  config.align = config_lib.align_stage(steps=2, batch_size=2, w_structure=0.5)
  preflight.check_stage_fields("align", config.align)  # a field of the kind
  with pytest.raises(ConfigError, match=r"align.w_structure: 0.0 there, 0.5 now"):
    preflight.check_same_run(str(tmp_path), config)
  config.align = config_lib.align_stage(steps=2, batch_size=2, lora_rank=4)
  with pytest.raises(ConfigError, match=r"align.optimizer.lora_rank: 0 there, 4 now"):
    preflight.check_same_run(str(tmp_path), config)
  block = mlc.ConfigDict(config_lib.stage("distill_attention", steps=2, batch_size=2, lr=1e-3))
  block.w_structure = 1.0  # written by hand: the kind does not read it
  with pytest.raises(ConfigError, match=r"distill.w_structure: a distill_attention stage does not"):
    preflight.check_stage_fields("distill", block)
  with pytest.raises(ValueError, match="finite and >= 0"):
    config_lib.align_stage(steps=2, batch_size=2, w_structure=-1.0)
  with pytest.raises(ValueError, match="distill_attention stage has no field w_structure"):
    config_lib.stage("distill_attention", steps=2, batch_size=2, lr=1e-3, w_structure=1.0)


def test_student_fields_added_later_resume_at_their_default(tmp_path):
  """A run recorded before student.softmax_pick (2026-12-06), softmax_key_grid (2026-12-07) and
  softmax_pick_images (2026-12-08) existed ran with their defaults: the same run; a pooled hybrid
  is another."""
  config = config_lib.base_config()
  recorded = json.loads(config.to_json_best_effort())
  for field in ("softmax_pick", "softmax_key_grid", "softmax_pick_images"):
    recorded["student"].pop(field)
  (tmp_path / "config.json").write_text(json.dumps(recorded))
  preflight.check_same_run(str(tmp_path), config)
  config.student.softmax_key_grid = 16
  with pytest.raises(ConfigError, match=r"student.softmax_key_grid: 0 there, 16 now"):
    preflight.check_same_run(str(tmp_path), config)


def test_key_grid_spellings_resume_as_one(tmp_path):
  """A run recorded with softmax_key_grid 32 (an int, before 'Nx' existed) resumes under '32';
  '2.0x' under '2x'; a grid written the other way ('2x' against 32) is another run's setting."""
  config = config_lib.base_config()
  recorded = json.loads(config.to_json_best_effort())
  recorded["student"]["softmax_key_grid"] = 32
  (tmp_path / "config.json").write_text(json.dumps(recorded))
  config.student = dict(config.student.to_dict(), softmax_key_grid="32")
  preflight.check_same_run(str(tmp_path), config)
  recorded["student"]["softmax_key_grid"] = "2.0x"
  (tmp_path / "config.json").write_text(json.dumps(recorded))
  config.student = dict(config.student.to_dict(), softmax_key_grid="2x")
  preflight.check_same_run(str(tmp_path), config)
  config.student = dict(config.student.to_dict(), softmax_key_grid=32)
  with pytest.raises(ConfigError, match=r'student.softmax_key_grid: "2x" there, 32 now'):
    preflight.check_same_run(str(tmp_path), config)
