"""build.py: models from a config, and what a config asks the driver to read from
teacher.init (architecture, input normalisation) — so that config files themselves read nothing."""

import os

import pytest

from linvit_jax import build
from linvit_jax.configuration import config_lib
from linvit_jax.runtime.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HF_DINOV2 = os.path.join(ROOT, "tests", "data", "foreign", "hf_dinov2")  # declares mean/std, gelu
BV_NPZ = os.path.join(ROOT, "tests", "data", "vit_w192_d4_p16_i64_tok_learn.npz")


def _convert_folder(**args):
  import configs.convert_folder as cf

  arg = ",".join(f"{k}={v}" for k, v in {"images": ROOT, "res": 28, **args}.items())
  return cf.get_config(arg)


def test_convert_folder_config_reads_no_checkpoint(tmp_path):
  config = _convert_folder(init=str(tmp_path / "not_there.npz"))  # would fail if it were read
  assert config.teacher.architecture == "init" and "init_norm" in config.data.pp_train
  with pytest.raises(Exception, match="not_there.npz"):  # the driver's step reads it
    build.resolve_from_init(config)


def test_resolve_reads_architecture_and_the_sources_normalisation():
  resolved = build.resolve_from_init(_convert_folder(init=HF_DINOV2, align_augment="color"))
  assert resolved.teacher.architecture == "config"  # what ran is written down resolved
  assert resolved.model.width == 32 and resolved.model.gelu_approximate is False
  assert "color_jitter" in resolved.align.pp_train  # a stage's own pp string is resolved too
  for pp in (
      resolved.data.pp_train,
      resolved.data.pp_eval,
      resolved.eval.sample_pp,
      resolved.align.pp_train,
  ):
    assert "init_norm" not in pp
    assert "vgg_value_range(mean=(123.675, 116.28, 103.53), std=(58.395, 57.12, 57.375))" in pp


def test_config_fields_keep_what_the_user_set():
  resolved = build.resolve_from_init(_convert_folder(init=HF_DINOV2, gelu="tanh"))
  assert resolved.model.gelu_approximate is True  # the source says exact; gelu=tanh wins
  resolved = build.resolve_from_init(_convert_folder(init=HF_DINOV2, norm="minus_one_one"))
  assert "value_range(-1,1)" in resolved.data.pp_train


def test_init_norm_without_a_declared_normalisation():
  # A bare big_vision npz declares nothing: init_norm falls back to ImageNet's mean/std ...
  config = _convert_folder(init=BV_NPZ)
  assert "|vgg_value_range|" in build.resolve_from_init(config).data.pp_eval
  # ... and norm=source (init_norm(required=True)) names the checkpoint instead.
  with pytest.raises(ConfigError, match=r"norm=source.*vit_w192_d4.*does not say"):
    build.resolve_from_init(_convert_folder(init=BV_NPZ, norm="source"))


def test_a_config_that_asks_nothing_is_returned_as_is():
  config = config_lib.base_config()
  assert build.resolve_from_init(config) is config
  config.teacher.architecture = "checkpoint"
  with pytest.raises(ConfigError, match="teacher.architecture='checkpoint'"):
    build.resolve_from_init(config)
  config.teacher.architecture = "config"
  config.data.pp_eval = "decode|init_norm"
  with pytest.raises(ConfigError, match="init_norm needs config.teacher.init"):
    build.resolve_from_init(config)


def test_variant_decides_the_shape_fields():
  config = config_lib.base_config()
  config.model.variant = "S/16"
  teacher, student = build.models(config, "elu1")
  assert (teacher.width, teacher.depth, teacher.num_heads) == (384, 12, 6)
  assert teacher.attention.kind == "softmax" and student.attention.kind == "linear"
