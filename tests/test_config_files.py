"""Shipped configs by name (linvit_jax/config_files.py) and their place in the wheel (setup.py)."""

from __future__ import annotations

import glob
import os
import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

from linvit_jax import config_files

ROOT = pathlib.Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "configs"
DEMO = str(CONFIGS / "demo.py")


@pytest.fixture
def elsewhere(tmp_path, monkeypatch):
  """A working directory outside the checkout, as a pip-installed user has."""
  monkeypatch.chdir(tmp_path)
  return tmp_path


def test_list_configs_is_the_configs_directory():
  expected = sorted(
      os.path.basename(p)[:-3]
      for p in glob.glob(str(CONFIGS / "*.py"))
      if not os.path.basename(p).startswith("_")
  )
  assert config_files.list_configs() == expected
  assert "demo" in expected
  assert config_files.config_dir() == str(CONFIGS)


def test_existing_path_untouched(monkeypatch):
  monkeypatch.chdir(ROOT)
  for argv in (
      ["main", "--config", "configs/demo.py", "--workdir", "w"],
      ["main", "--config=configs/demo.py:tiny=True", "--workdir", "w"],
      ["main", "--config", DEMO + ":feature_map=elu1"],
  ):
    assert config_files.resolve_config_argv(argv) == argv


def test_existing_local_file_wins_over_a_name(elsewhere):
  (elsewhere / "demo").write_text("def get_config(arg=None):\n  return None\n")
  argv = ["main", "--config", "demo"]
  assert config_files.resolve_config_argv(argv) == argv


@pytest.mark.parametrize("name", ["demo", "demo.py", "configs/demo.py", "./configs/demo.py"])
def test_name_to_file(elsewhere, name):
  assert config_files.find_config(name) == DEMO
  assert config_files.resolve_config_argv(["main", "--config", name, "--workdir", "w"]) == [
      "main",
      "--config",
      DEMO,
      "--workdir",
      "w",
  ]
  assert config_files.resolve_config_argv(["main", f"--config={name}"]) == [
      "main",
      f"--config={DEMO}",
  ]
  assert config_files.resolve_config_argv(["main", "-config", name]) == ["main", "-config", DEMO]


def test_name_with_arg_keeps_the_arg(elsewhere):
  arg = "init=gs://big_vision/vit_s16_i1k_300ep.npz,res=224"
  argv = [
      "main",
      "--config",
      f"configs/convert_folder.py:{arg}",
      "--workdir",
      "w",
      "--config.seed=3",
  ]
  assert config_files.resolve_config_argv(argv) == [
      "main",
      "--config",
      f"{CONFIGS / 'convert_folder.py'}:{arg}",
      "--workdir",
      "w",
      "--config.seed=3",
  ]
  assert config_files.resolve_config_argv(["main", "--config=demo:tiny=True"]) == [
      "main",
      f"--config={DEMO}:tiny=True",
  ]


@pytest.mark.parametrize(
    "value",
    [
        "nope",
        "nope.py",
        "nope:x=1",
        "configs/nope.py",
        "other/demo.py",
        "/no/such/dir/demo.py",
        "",
        "configs/",
        "demo/",
    ],
)
def test_unknown_name_untouched(elsewhere, value):
  argv = ["main", "--config", value, "--workdir", "w"]
  assert config_files.resolve_config_argv(argv) == argv
  assert config_files.resolve_config_argv(["main", f"--config={value}"]) == [
      "main",
      f"--config={value}",
  ]


def test_other_arguments_untouched(elsewhere):
  argv = [
      "demo",
      "--config.model.depth=2",
      "--configs",
      "demo",
      "--workdir",
      "demo",
      "--",
      "--config",
      "demo",
  ]
  assert config_files.resolve_config_argv(argv) == argv
  assert config_files.resolve_config_argv(["main", "--config"]) == ["main", "--config"]
  argv = ["main", "--workdir", "w"]
  out = config_files.resolve_config_argv(argv)
  assert out == argv and out is not argv  # a new list: the caller's argv is not mutated


def test_resolved_argv_loads_through_mains_flags(elsewhere):
  # What main.py's entry point does with the hook: the name loads, `:arg` and overrides apply.
  code = (
      "import sys\n"
      "from linvit_jax import config_files, main\n"
      "argv = config_files.resolve_config_argv(sys.argv)\n"
      "main.FLAGS(argv)\n"
      "c = main.FLAGS.config\n"
      "print(c.student.attention, c.distill.routing_temperature)\n"
  )
  result = subprocess.run(
      [
          sys.executable,
          "-c",
          code,
          "--config",
          "demo:feature_map=elu1",
          "--workdir",
          "w",
          "--config.distill.routing_temperature=2.0",
      ],
      cwd=elsewhere,
      capture_output=True,
      text=True,
      timeout=120,
      check=False,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.split() == ["elu1", "2.0"]


# ------------------------------------------------------------------------------------------------
# The wheel: configs/ inside it as linvit_jax.configs, found by name when installed.


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> pathlib.Path:
  """A wheel built from a copy of the checkout (build/ and *.egg-info stay out of the repo)."""
  for module in ("setuptools", "wheel"):
    pytest.importorskip(module)
  tmp = tmp_path_factory.mktemp("wheel")
  src = tmp / "src"
  src.mkdir()
  for name in ("setup.py", "README.md"):
    shutil.copy(ROOT / name, src / name)
  ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
  for name in ("linvit_jax", "configs"):
    shutil.copytree(ROOT / name, src / name, ignore=ignore)
  result = subprocess.run(
      [
          sys.executable,
          "-m",
          "pip",
          "wheel",
          "--no-deps",
          "--no-build-isolation",
          "--no-index",
          "-q",
          "-w",
          str(tmp / "dist"),
          str(src),
      ],
      capture_output=True,
      text=True,
      timeout=300,
      check=False,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  (path,) = (tmp / "dist").glob("linvit_jax-*.whl")
  return path


def test_wheel_ships_configs_and_assets(wheel):
  names = set(zipfile.ZipFile(wheel).namelist())
  for config in glob.glob(str(CONFIGS / "*.py")):
    assert f"linvit_jax/configs/{os.path.basename(config)}" in names
  assert "linvit_jax/config_files.py" in names
  assert "linvit_jax/assets/teacher_fmnist_vit.npz" in names
  assert not any(n.startswith("configs/") for n in names)  # no top-level `configs` package


def test_installed_wheel_finds_configs_by_name(wheel, tmp_path):
  site = tmp_path / "site"
  zipfile.ZipFile(wheel).extractall(site)  # a pure-Python wheel installs as unpacked
  code = (
      "import linvit_jax\n"
      "from linvit_jax import config_files\n"
      "print(linvit_jax.__file__)\n"
      "argv = ['main', '--config', 'configs/demo.py:tiny=True']\n"
      "print(config_files.resolve_config_argv(argv)[2])\n"
      "print(','.join(config_files.list_configs()))\n"
  )
  # -P and PYTHONPATH: the unpacked wheel, not this checkout, even where it is installed editable.
  flags = ["-P"] if sys.version_info >= (3, 11) else []
  result = subprocess.run(
      [sys.executable, *flags, "-c", code],
      cwd=tmp_path,
      env={**os.environ, "PYTHONPATH": str(site)},
      capture_output=True,
      text=True,
      timeout=120,
      check=False,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  package, resolved, names = result.stdout.split()
  assert package == str(site / "linvit_jax" / "__init__.py")
  assert resolved == f"{site / 'linvit_jax' / 'configs' / 'demo.py'}:tiny=True"
  assert names.split(",") == config_files.list_configs()
