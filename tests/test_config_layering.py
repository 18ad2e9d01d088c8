"""Configs are data: a config file only states options, so it imports config_lib alone and checks
nothing itself; the checks it runs on its options live in config_checks, which stays light (no jax,
no driver), so reading a config (`import linvit_jax` reads convert_folder's options) stays cheap."""

import ast
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = sorted(
    os.path.join(ROOT, "configs", n)
    for n in os.listdir(os.path.join(ROOT, "configs"))
    if n.endswith(".py")
)


def _tree(path: str) -> ast.Module:
  with open(path) as f:
    return ast.parse(f.read())


def _imports(tree: ast.Module) -> set[str]:
  out = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      out.update(a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module:
      out.update(f"{node.module}.{a.name}" for a in node.names)
  return out


@pytest.mark.parametrize("path", CONFIGS, ids=os.path.basename)
def test_a_config_imports_config_lib_only(path):
  assert _imports(_tree(path)) <= {"linvit_jax.configuration.config_lib"}, path


@pytest.mark.parametrize("path", CONFIGS, ids=os.path.basename)
def test_a_config_raises_nothing_itself(path):
  # Its option checks are config_checks' (one place for their messages); parse_arg types them.
  raises = [n.lineno for n in ast.walk(_tree(path)) if isinstance(n, ast.Raise)]
  assert not raises, f"{path}: raise at line(s) {raises}"


def test_config_checks_read_only_config_lib():
  imports = _imports(_tree(os.path.join(ROOT, "linvit_jax", "configuration", "config_checks.py")))
  assert {m for m in imports if m.startswith("linvit_jax")} == {
      "linvit_jax.configuration.config_lib"
  }


def test_every_config_with_checks_is_a_shipped_config():
  from linvit_jax.configuration import config_checks

  names = {os.path.basename(p)[: -len(".py")] for p in CONFIGS}
  assert set(config_checks.CHECKS) <= names


def test_reading_every_config_imports_no_jax():
  # Its options only: convert_folder's get_config needs init= and images= to build a config.
  code = (
      "import importlib.util, sys\n"
      "from linvit_jax.configuration import config_lib\n"
      f"for path in {CONFIGS!r}:\n"
      "  spec = importlib.util.spec_from_file_location('c', path)\n"
      "  module = importlib.util.module_from_spec(spec)\n"
      "  spec.loader.exec_module(module)\n"
      "  config_lib.option_defaults(module.get_config)\n"
      "print([m for m in ('jax', 'linvit_jax.run', 'linvit_jax.studies.ablation') if m in sys.modules])\n"
  )
  result = subprocess.run(
      [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
  )
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.strip() == "[]", result.stdout
