"""What main.py's one-line errors rely on in absl and ml_collections, pinned through their public
APIs: an upgrade that changes one of these fails here, by name, instead of turning a friendly
error back into a traceback somewhere in the CLI tests."""

import os
import subprocess
import sys

import pytest
from absl import flags
from absl import logging  # noqa: F401  (defines --verbosity / -v on absl's FLAGS)
from ml_collections import config_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = (
    "import ml_collections as mlc\n"
    "def get_config(arg=None):\n"
    "  return mlc.ConfigDict(dict(steps=3, finetune=dict(lr=0.1)))\n"
)


@pytest.fixture
def config_file(tmp_path):
  path = tmp_path / "cfg.py"
  path.write_text(CONFIG)
  return str(path)


def _config_flag_values(argv: list[str]) -> flags.FlagValues:
  values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=values, sys_argv=argv)
  return values


def test_an_override_of_a_missing_field_raises_a_key_or_attribute_error_naming_it(config_file):
  argv = ["prog", "--config", config_file, "--config.finetune.stpes=3"]
  with pytest.raises((KeyError, AttributeError)) as raised:
    _config_flag_values(argv)(argv)
  detail = raised.value
  while isinstance(detail, BaseException) and detail.args:  # what main._missing_field reads
    detail = detail.args[0]
  assert "stpes" in str(detail)


def test_an_override_of_the_wrong_type_is_a_flags_error_naming_the_flag(config_file):
  argv = ["prog", "--config", config_file, "--config.steps=abc"]
  with pytest.raises(flags.Error) as raised:
    _config_flag_values(argv)(argv)
  assert "config.steps" in str(raised.value)


def test_an_override_applies_to_the_loaded_config(config_file):
  argv = ["prog", "--config", config_file, "--config.finetune.lr=0.5"]
  values = _config_flag_values(argv)
  values(argv)
  assert values.config.finetune.lr == 0.5
  assert config_flags.get_config_filename(values["config"]) == config_file


def test_known_only_parsing_returns_the_flags_it_does_not_know():
  values = flags.FlagValues()
  flags.DEFINE_string("config", None, "", flag_values=values)
  rest = values(
      ["prog", "--config", "c.py:x=1", "--config.a.b=2", "--workdir=w", "-v", "1"], known_only=True
  )
  assert values.config == "c.py:x=1"
  assert "--config.a.b=2" in rest and "--workdir=w" in rest


def test_verbosity_is_absl_loggings_flag_with_short_name_v():
  assert flags.FLAGS["verbosity"].short_name == "v"
  values = flags.FlagValues()
  flags.DEFINE_integer("verbosity", 0, "", flag_values=values, short_name="v")
  values(["prog", "-v", "1"])
  assert values["verbosity"].present


def test_a_field_whose_feature_is_off_is_overridden_from_the_command_line(tmp_path):
  code = (
      "import sys\n"
      "from linvit_jax import main\n"
      "sys.argv = ['m', '--config', 'configs/demo.py:tiny=True,align_steps=4',\n"
      "  '--config.finetune.w_structure=0.5', '--config.align.optimizer.lora_rank=2',\n"
      "  '--config.align.optimizer.ema_decay=0.9', '--workdir', 'w']\n"
      "main._parse_flags(sys.argv)  # ml_collections finds the overrides in sys.argv\n"
      "c = main.FLAGS.config\n"
      "print(c.finetune.w_structure, c.align.optimizer.lora_rank, c.align.optimizer.ema_decay)\n"
  )
  r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
  assert r.returncode == 0, r.stderr[-2000:]
  assert r.stdout.split() == ["0.5", "2", "0.9"]


@pytest.mark.parametrize(
    "config_arg", ["base", "convert_folder:softmax_key_grid=32", "convert_folder:", "demo:"]
)
@pytest.mark.parametrize(("flag", "expected"), [("2x", "2x"), ("32", 32), ("1.5x", "1.5x")])
def test_softmax_key_grid_takes_either_form_from_the_command_line(
    tmp_path, config_arg, flag, expected
):
  """The field holds an int or 'Nx' (config_lib.key_grid_field): an override in the other form
  than the config's value is read, not refused as the field's type (an int field refuses '2x').
  The configs hold 0 (base, demo), 32 and '2x' (convert_folder's default)."""
  if config_arg == "base":
    path = tmp_path / "base.py"
    path.write_text(
        "from linvit_jax.configuration import config_lib\n"
        "def get_config(arg=None):\n"
        "  return config_lib.base_config()\n"
    )
    config = str(path)
  else:
    photos = tmp_path / "photos"
    photos.mkdir()
    name, arg = config_arg.split(":")
    given = f"init=t.npz,images={photos},{arg}" if name == "convert_folder" else "tiny=True"
    config = f"{ROOT}/configs/{name}.py:{given}"
  argv = ["prog", "--config", config, f"--config.student.softmax_key_grid={flag}"]
  values = _config_flag_values(argv)
  values(argv)
  assert values.config.student.softmax_key_grid == expected
