"""The Python API's options (linvit_jax/api.py, options.parse_arg): Python values, not a
`:arg` string; every option problem a UserError; every option in `help(linvit_jax.convert)`."""

from __future__ import annotations

import pathlib
import pydoc

import pytest

import linvit_jax
from linvit_jax import api
from linvit_jax.configuration import config_files
from linvit_jax.configuration import options
from linvit_jax.runtime.errors import UserError


@pytest.fixture
def photos(tmp_path):
  folder = tmp_path / "my,photos"  # a comma: the `:arg` string could never carry it
  folder.mkdir()
  return folder


def _convert_folder(photos, **opts):
  return api.load_config("convert_folder", init="/models/vit,s16.npz", images=str(photos), **opts)


def test_a_value_may_hold_a_comma(photos):
  config = _convert_folder(photos)
  assert config.teacher.init == "/models/vit,s16.npz"
  assert config.data.data_dir == str(photos)


def test_a_path_object_is_its_string(photos):
  config = api.load_config("convert_folder", init=pathlib.Path("/m/vit.npz"), images=photos)
  assert (config.teacher.init, config.data.data_dir) == ("/m/vit.npz", str(photos))


def test_square_resolution_as_a_pair(photos):
  assert _convert_folder(photos, res=(448, 448)).data.image_size == 448
  assert _convert_folder(photos, res=[112, 112]).data.image_size == 112
  with pytest.raises(api.OptionError, match=r"res=\(448, 320\).*one integer"):
    _convert_folder(photos, res=(448, 320))


def test_bools_stay_bools(photos):
  config = _convert_folder(photos, exact_prefix=True, conv_v=False)
  attention = config.student.attention
  assert attention.exact_prefix_rows is True and attention.conv_v is False
  with pytest.raises(api.OptionError, match="conv_v=1 is not a boolean"):
    _convert_folder(photos, conv_v=1)
  assert _convert_folder(photos, conv_v="false").student.attention.conv_v is False  # CLI text


@pytest.mark.parametrize(
    "opts, message",
    [
        (dict(max_images=2.5), "max_images=2.5 is not an integer"),
        (dict(max_images=True), "max_images=True is not an integer"),
        (dict(lr_distill="fast"), "lr_distill='fast' is not a number"),
        (dict(feature_map=3), "feature_map=3 is not a string"),
    ],
)
def test_a_value_of_the_wrong_type_is_an_option_error(photos, opts, message):
  with pytest.raises(api.OptionError, match=message):
    _convert_folder(photos, **opts)


def test_numbers_widen_as_python_does(photos):
  config = _convert_folder(photos, distill_fraction=1, max_images=64)  # int for a float option
  assert config.stages == ("distill_attention",)


def test_unknown_option_names_the_nearest(photos):
  with pytest.raises(UserError, match="unknown config arg 'max_imgs'; did you mean 'max_images'"):
    _convert_folder(photos, max_imgs=3)
  with pytest.raises(ValueError, match="unknown config arg 'zzz'"):  # still a ValueError too
    _convert_folder(photos, zzz=3)


def test_a_value_the_config_rejects_is_a_user_error(photos, tmp_path):
  with pytest.raises(UserError, match="gelu=.fast."):
    _convert_folder(photos, gelu="fast")
  with pytest.raises(UserError, match="is not a folder"):
    api.load_config("convert_folder", init="x.npz", images=str(tmp_path / "none"))


def test_convert_rejects_an_option_before_any_work(photos, tmp_path):
  with pytest.raises(api.OptionError, match="did you mean 'batch'"):
    linvit_jax.convert("x.npz", images=photos, workdir=tmp_path / "w", bach=4)
  assert not (tmp_path / "w").exists()


def test_the_cli_string_still_works(photos):
  path = config_files.find_config("convert_folder")
  config = config_files.load(path, f"init=x.npz,images={photos.parent},res=112,tiny=True")
  assert config.data.image_size == 112 and config.distill_attention.steps == 2
  with pytest.raises(UserError, match="config arg res='big' is not an integer"):
    config_files.load(path, "init=x.npz,res=big")


def test_every_option_is_in_help():
  names = api.option_defaults("convert_folder")
  assert {"res", "max_images", "feature_map", "tiny"} <= set(names)
  text = pydoc.render_doc(linvit_jax.convert, renderer=pydoc.plaintext)
  for name in names:
    if name not in ("init", "images"):  # convert's own `teacher` and `images`
      assert f"{name}=" in linvit_jax.convert.__doc__, name
      assert f"{name}=" in text, name


def test_option_defaults_run_none_of_the_configs_checks():
  # convert_folder rejects an empty init; asking its options must not run that check.
  defaults = api.option_defaults("convert_folder")
  assert defaults["init"] == "" and defaults["res"] == 224
  assert options.option_defaults(lambda arg=None: options.parse_arg(arg, a=1)) == {"a": 1}


def test_option_meanings_from_a_docstring(tmp_path):
  config = tmp_path / "cfg.py"
  config.write_text(
      '"""A config.\n\n'
      "Options:\n"
      "  res: the image side, in pixels\n"
      "  max_images=10000: photos seen in all,\n"
      "      over every stage\n"
      "  `tiny`: a few steps\n"
      "  other: not an option\n"
      '"""\n'
      "from linvit_jax.configuration import options\n\n\n"
      "def get_config(arg=None):\n"
      "  return options.parse_arg(arg, res=224, max_images=10000, tiny=False, knn='')\n"
  )
  meanings = api.option_meanings(str(config))
  assert meanings == {
      "res": "the image side, in pixels",
      "max_images": "photos seen in all, over every stage",
      "tiny": "a few steps",
  }
  help_text = api.options_help(str(config))
  assert "    res=224: the image side, in pixels" in help_text
  assert "    knn=''" in help_text  # no meaning given: its name and default


def test_the_package_exports_the_errors_to_catch(photos):
  assert linvit_jax.UserError is UserError and issubclass(linvit_jax.OptionError, UserError)
  with pytest.raises(linvit_jax.UserError):
    linvit_jax.load_config("convert_folder", init="x.npz", images=photos, norm="bgr")
