"""Teachers whose patch embedding takes 1 channel (a Fashion-MNIST ViT, medical or infrared models):
convert_folder reads the channel count from the checkpoint and decodes the photos to match; an RGB
teacher's config stays exactly as written; a pp that cannot feed the teacher is a ConfigError
naming the field and the fix."""

import os

import numpy as np
import pytest

from linvit_jax import build
from linvit_jax.models import vit_checkpoint
from linvit_jax.runtime.errors import ConfigError
from tests.helpers import tiny_teacher

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FMNIST_TEACHER = os.path.join(ROOT, "linvit_jax", "assets", "teacher_fmnist_vit.npz")
BIG_VISION = os.path.join(ROOT, "tests", "data", "vit_w192_d4_p16_i64_tok_learn.npz")


def _checkpoint(path: str, channels: int) -> dict:
  return tiny_teacher.headless_checkpoint(path, channels)


def _photos(folder: str, n: int = 8) -> None:
  tiny_teacher.smooth_photos(folder, n, gray_odd=True)


_config = tiny_teacher.convert_folder_config


def test_input_channels_reads_the_patch_embedding():
  assert vit_checkpoint.input_channels(FMNIST_TEACHER) == 1
  assert vit_checkpoint.input_channels(BIG_VISION) == 3  # a real big_vision checkpoint


def test_decode_channels_rewrites_bare_decodes_and_names_what_cannot_feed_the_teacher():
  pp = 'decode|inception_crop(28)|flip_lr|value_range(-1,1)|keep("image")'
  assert build.decode_channels(pp, 1, "f", "t.npz") == pp.replace("decode", "decode(channels=1)")
  assert build.decode_channels("decode(precise=True)|resize(8)", 1, "f", "t") == (
      "decode(channels=1, precise=True)|resize(8)"
  )
  for same in ("decode(channels=1)|resize(8)", "decode(1)|resize(8)", "decode(1, precise=True)"):
    assert build.decode_channels(same, 1, "f", "t") == same  # positional channels, as in big_vision
  with pytest.raises(ConfigError, match=r"decode\(3\) decodes 3-channel"):
    build.decode_channels("decode(3)|resize(8)", 1, "f", "t")
  with pytest.raises(ConfigError, match=r"config.data.pp_eval: decode\(channels=3\) decodes 3-ch"):
    build.decode_channels("decode(channels=3)|resize(8)", 1, "config.data.pp_eval", "t.npz")
  with pytest.raises(ConfigError, match="decode_jpeg_and_inception_crop gives 3-channel"):
    build.decode_channels("decode_jpeg_and_inception_crop(28)", 1, "f", "t")
  with pytest.raises(ConfigError, match="ImageNet's RGB mean/std.*norm=minus_one_one"):
    build.decode_channels("decode|resize(8)|vgg_value_range", 1, "f", "t")
  explicit = "decode|vgg_value_range(mean=(127.5,), std=(127.5,))"
  assert build.decode_channels(explicit, 1, "f", "t").startswith("decode(channels=1)|")


def test_resolve_from_init_decodes_as_many_channels_as_the_teacher_takes(tmp_path):
  config = _config(FMNIST_TEACHER, str(tmp_path), ",norm=minus_one_one")
  resolved = build.resolve_from_init(config)
  for block, field in build._pp_fields(resolved):
    if resolved[block][field]:
      assert resolved[block][field].startswith("decode(channels=1)|"), (block, field)
  assert resolved.model.width == 128 and resolved.teacher.architecture == "config"
  # Its source declares no normalisation: ImageNet's RGB default cannot apply, said at once.
  with pytest.raises(ConfigError, match="takes 1-channel images.*norm=minus_one_one"):
    build.resolve_from_init(_config(FMNIST_TEACHER, str(tmp_path)))


def test_an_rgb_teacher_keeps_its_pp_strings_as_written(tmp_path):
  ckpt = str(tmp_path / "rgb.npz")
  _checkpoint(ckpt, 3)
  config = _config(ckpt, str(tmp_path))
  resolved = build.resolve_from_init(config)
  for block, field in build._pp_fields(config):
    want = config[block][field].replace("init_norm", "vgg_value_range")
    assert resolved[block][field] == want, (block, field)


def test_a_grayscale_teacher_converts_end_to_end_and_its_student_reads_photos(tmp_path):
  from linvit_jax import run as run_lib
  from linvit_jax.artifacts import student_loader

  ckpt = str(tmp_path / "gray.npz")
  teacher = _checkpoint(ckpt, 1)
  _photos(str(tmp_path / "photos"))
  config = _config(ckpt, str(tmp_path / "photos"), ",norm=minus_one_one,knn=none")
  config.stages = ("distill_attention",)
  config.eval.plots, config.eval.resolution_factors = False, [1]
  results = run_lib.run(config, str(tmp_path / "work"))
  assert np.isfinite(results["end_to_end_after_distill_attention"]["cls_cosine"])
  student = student_loader.load_student(str(tmp_path / "work"))
  assert student.channels == 1
  np.testing.assert_array_equal(
      student.params["embedding"]["kernel"], teacher["embedding"]["kernel"]
  )  # copied verbatim, not re-made for 3 channels
  photo = os.path.join(str(tmp_path / "photos"), "photo_0.jpg")  # an RGB file: decoded to luma
  features = student.encode([photo, photo])
  assert features.shape == (2, tiny_teacher.TINY["width"]) and np.all(np.isfinite(features))
