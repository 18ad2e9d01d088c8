"""Heads that cannot split a foreign model's width (models/foreign.py): one line naming the width
and the heads, checked before the attention kernels are reshaped (before, `import_weights
--num_heads 5` ended in numpy's "cannot reshape array of size 1024 into shape (32,5,6)").

The fixtures are the tiny models of tests/data/foreign (width 32, 2 heads); cheap, no compile.
"""

import os

import pytest

from linvit_jax.models import foreign
from linvit_jax.models import import_weights
from linvit_jax.models.checkpoints import CheckpointError
from linvit_jax.runtime.errors import UserError
from tests.helpers.foreign_fixtures import FOREIGN
from tests.helpers.foreign_fixtures import copy_folder


def _folder(tmp_path, family, **config_edit):
  return copy_folder(tmp_path, family, config_edit=config_edit)


def _one_line(e):
  text = str(e.value)
  assert "\n" not in text and "reshape" not in text, text
  return text


@pytest.mark.parametrize("heads", [5, 3, 64])
def test_num_heads_that_do_not_divide_the_width(heads):
  src = os.path.join(FOREIGN, "timm_vit", "model.safetensors")  # a bare timm file, width 32
  with pytest.raises(CheckpointError) as e:
    foreign.read(src, num_heads=heads)
  text = _one_line(e)
  assert isinstance(e.value, UserError)
  assert f"--num_heads {heads} does not fit '{src}'" in text
  assert f"its width 32 is not a multiple of {heads}" in text
  assert "heads that fit: 1, 2, 4, 8, 16, 32)" in text


def test_import_weights_passes_the_line_through_unchanged(tmp_path):
  src = os.path.join(FOREIGN, "timm_vit", "model.safetensors")
  out = tmp_path / "out" / "x.npz"
  with pytest.raises(UserError) as e:
    import_weights.import_weights(src, str(out), num_heads=5)
  assert _one_line(e).startswith("--num_heads 5 does not fit")
  assert not out.exists()


def test_timm_config_heads_that_do_not_divide_the_width(tmp_path):
  src = _folder(tmp_path, "timm_vit", model_args={"num_heads": 5})
  with pytest.raises(CheckpointError) as e:
    foreign.read(src)
  text = _one_line(e)
  assert f"checkpoint '{src}': width 32 is not a multiple of 5 heads" in text
  assert "model_args.num_heads" in text


def test_timm_size_name_heads_that_do_not_divide_the_width(tmp_path):
  # 'vit_tiny_*' means 3 heads in timm; a width-32 model without model_args cannot have them.
  src = _folder(tmp_path, "timm_vit", model_args={})
  with pytest.raises(CheckpointError) as e:
    foreign.read(src)
  text = _one_line(e)
  assert "width 32 is not a multiple of 3 heads" in text
  assert "'tiny' size" in text and "--num_heads N" in text
  assert foreign.read(src, num_heads=2).arch["num_heads"] == 2  # the way out it names


def test_hugging_face_config_heads_that_do_not_divide_the_width(tmp_path):
  src = _folder(tmp_path, "hf_vit", num_attention_heads=5)
  with pytest.raises(CheckpointError) as e:
    foreign.read(src)
  text = _one_line(e)
  assert f"checkpoint '{src}': width 32 is not a multiple of 5 heads" in text
  assert "num_attention_heads" in text


def test_heads_that_divide_the_width_still_read(tmp_path, caplog):
  src = os.path.join(FOREIGN, "timm_vit", "model.safetensors")
  assert foreign.read(src, num_heads=2).arch["num_heads"] == 2  # what model_args says
  # A size name is timm's convention, not the file's word ('medium': 8 heads, which divide the
  # width 32): an override is read, and said in a warning.
  named = _folder(tmp_path, "timm_vit", model_args={}, architecture="vit_medium_patch16_224")
  with caplog.at_level("WARNING"):
    assert foreign.read(named, num_heads=4).arch["num_heads"] == 4
  assert any("--num_heads 4 overrides" in r.getMessage() for r in caplog.records)
