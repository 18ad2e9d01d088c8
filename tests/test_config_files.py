"""Shipped configs by name (linvit_jax/configuration/config_files.py) and their place in the wheel (setup.py)."""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

from linvit_jax.configuration import config_files

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
      "from linvit_jax import main\n"
      "from linvit_jax.configuration import config_files\n"
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
  assert "linvit_jax/configuration/config_files.py" in names
  assert "linvit_jax/assets/teacher_fmnist_vit.npz" in names
  assert not any(n.startswith("configs/") for n in names)  # no top-level `configs` package


def test_installed_wheel_finds_configs_by_name(wheel, tmp_path):
  site = tmp_path / "site"
  zipfile.ZipFile(wheel).extractall(site)  # a pure-Python wheel installs as unpacked
  code = (
      "import linvit_jax\n"
      "from linvit_jax.configuration import config_files\n"
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


# ------------------------------------------------------------------------------------------------
# Every shipped config builds the same ConfigDict as when the snapshot was taken (commit b5a0ea5,
# before its checks and shared blocks moved to config_checks / config_lib): a refactor of a
# config file or of config_lib must not change a run. A deliberate change of a config rewrites
# the snapshot: `python -m tests.test_config_files write` (and says so in its commit).

SNAPSHOT = ROOT / "tests" / "data" / "config_snapshots.json"
# gs://: no local folder to check. deploy_res is pinned where a case does not set it: its default
# may move (a recipe choice, not what this snapshot guards).
_PHOTOS = "init=/teacher.npz,images=gs://bucket/photos"
_CF = _PHOTOS + ",deploy_res=0"
CASES = {
    "demo": [
        "",
        "tiny=True",
        "center_keys=True,conv_v=True,window=3,sinks=2,exact_prefix=True",
        "align_steps=5,align_lora=4",
        "align_steps=50,tiny=True,feature_map=elu1,policy=copy_all",
    ],
    "convert_folder": [
        _CF,
        _PHOTOS + ",deploy_res=448",
        _PHOTOS + ",deploy_res=448,deploy_fraction=0.5,tiny=True",
        _CF + ",softmax_layers=0",  # the hybrid is the default since 2026-12-07
        _CF + ",align_lora=8",
        _CF + ",distill_fraction=1.0",
        _CF + ",distill_fraction=1.0,tiny=True",
        _CF + ",tiny=True",
        _CF + ",align_ema=0.99,num_features=32,exact_prefix=True",
        _CF + ",align_average=0.5,center_keys=False,conv_v=False,feature_map=elu1",
        _CF + ",knn=image_folder:/knn,holdout=0.3,norm=source,gelu=tanh,pool=0",
        _CF + ",knn=none,norm=imagenet,distill_augment=color,align_augment=color",
        _CF + ",max_images=100,batch=3,res=112,eval_images=4,compose=0.5,distill_mixup=0.5",
        _CF + ",align_start_weight=0.5,align_trainable=attention,align_update_scale=absolute",
    ],
    "imagenet_vit": ["", "head=fresh", "variant=S/16,norm=imagenet", "policy=copy_same,fsdp=2"],
    "jft_vit": ["", "eval_files=gs://x/v-*,head=fresh", "variant=B/16,policy=copy_same"],
    "teacher_fmnist": ["", "epochs=2,patch=7"],
    "ablation": ["", "tiny=True,seed_list=1+2", "patch=7,arms=copy_same+random,seeds=2"],
}
_ABSENT = "<absent>"


def _portable(tree):
  """`tree` as JSON data (tuples as lists), the package's assets folder spelled `<assets>`."""
  from linvit_jax.configuration import recipes

  text = json.dumps(tree).replace(json.dumps(recipes.ASSETS)[1:-1], "<assets>")
  return json.loads(text)


def _flat(tree, prefix=""):
  out = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      out.update(_flat(value, f"{prefix}{key}."))
    else:
      out[prefix + key] = value
  return out


def config_dicts(directory: pathlib.Path) -> dict:
  """Every case of CASES built by the config files in `directory`: a config's first case whole,
  the others as what they change from it (dotted paths; `<absent>`: a field it drops)."""
  out = {}
  for name, args in CASES.items():
    spec = importlib.util.spec_from_file_location(f"snapshot_{name}", directory / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    whole = _portable(module.get_config(args[0]).to_dict())
    out[f"{name}:{args[0]}"] = whole
    base = _flat(whole)
    for arg in args[1:]:
      flat = _flat(_portable(module.get_config(arg).to_dict()))
      changed = {k: v for k, v in flat.items() if base.get(k, _ABSENT) != v}
      changed.update({k: _ABSENT for k in base if k not in flat})
      out[f"{name}:{arg}"] = changed
  return out


def test_every_config_builds_its_snapshot():
  expected = json.loads(SNAPSHOT.read_text())
  got = config_dicts(CONFIGS)
  assert list(got) == list(expected)
  for case, value in expected.items():
    assert got[case] == value, case


# The base convert_folder case as earlier defaults built it, frozen from their era's snapshot: what
# a workdir begun then holds in its config.json; with how many fields today's default refuses it
# by (check_same_run names the first two, the all-linear student's, and counts the rest) and the
# options docs/recipe.md says to add to resume it.
_LINEAR = ",softmax_layers=0,softmax_pick=tf_cosine,softmax_key_grid=0"
_NAMED = ('student.softmax_key_grid: 0 there, "2x" now', "student.softmax_layers: 0 there, 1 now")
EARLIER_DEFAULTS = {
    # rank-8 LoRA align, 2026-12-02 to 2026-12-07
    "rank8": (
        "convert_folder_rank8_default.json",
        5,  # and student.softmax_pick, align.optimizer.lora_rank, align.w_attn_tf
        _LINEAR + ",align_lora=8,align_w_attn_tf=1",
    ),
    # full-rank align with its teacher-forced term, 2026-12-07
    "lora0_tf1": ("convert_folder_lora0_tf1_default.json", 4, _LINEAR + ",align_w_attn_tf=1"),
    # the all-linear student, until 2026-12-07
    "linear_tf0": ("convert_folder_linear_tf0_default.json", 3, _LINEAR),
}


@pytest.mark.parametrize("era", sorted(EARLIER_DEFAULTS))
def test_a_workdir_of_an_earlier_default_is_refused_then_resumes_as_recipe_md_says(tmp_path, era):
  """docs/recipe.md's advice, against the config that default really wrote: today's default is
  refused naming the fields that changed, and with the options the docs give it is the same run
  again."""
  from linvit_jax import preflight
  from linvit_jax.configuration import recipes
  from linvit_jax.runtime.errors import ConfigError

  name, differing, resume_options = EARLIER_DEFAULTS[era]
  frozen = (ROOT / "tests" / "data" / name).read_text()
  text = frozen.replace("<assets>", json.dumps(recipes.ASSETS)[1:-1])
  (tmp_path / "config.json").write_text(text)
  today = config_files.load(str(CONFIGS / "convert_folder.py"), _CF)
  with pytest.raises(ConfigError, match="holds a run of another config") as e:
    preflight.check_same_run(str(tmp_path), today)
  for field in _NAMED:
    assert field in str(e.value)
  assert f"(+{differing - len(_NAMED)} more)" in str(e.value), str(e.value)
  resumed = config_files.load(str(CONFIGS / "convert_folder.py"), _CF + resume_options)
  preflight.check_same_run(str(tmp_path), resumed)


def test_the_ablation_config_lists_the_drivers_arms():
  from linvit_jax.studies import ablation

  spec = importlib.util.spec_from_file_location("ablation_config", CONFIGS / "ablation.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  assert module.ARMS == tuple(ablation.ARMS)
  assert module.get_config().ablation.arms == tuple(ablation.ARMS)


if __name__ == "__main__":
  # python -m tests.test_config_files write [CONFIG_DIR]: the snapshot from CONFIG_DIR's files
  # (default: configs/).
  if sys.argv[1:2] != ["write"]:
    sys.exit("usage: python -m tests.test_config_files write [CONFIG_DIR]")
  directory = pathlib.Path(sys.argv[2]) if len(sys.argv) > 2 else CONFIGS
  SNAPSHOT.write_text(json.dumps(config_dicts(directory), indent=1) + "\n")
  print(f"wrote {SNAPSHOT}")
