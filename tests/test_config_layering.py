"""Configs are data: a config file imports configuration modules alone and checks nothing itself;
the checks it runs on its options live in config_checks, which stays light (no jax, no driver), so
reading a config (`import linvit_jax` reads convert_folder's options) stays cheap. The
configuration modules import each other without a circle, the schema (config_lib) at the bottom."""

import ast
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGURATION = sorted(
    n[: -len(".py")]
    for n in os.listdir(os.path.join(ROOT, "linvit_jax", "configuration"))
    if n.endswith(".py") and n != "__init__.py"
)
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
def test_a_config_imports_configuration_modules_only(path):
  allowed = {f"linvit_jax.configuration.{m}" for m in CONFIGURATION}
  assert _imports(_tree(path)) <= allowed, path


@pytest.mark.parametrize("path", CONFIGS, ids=os.path.basename)
def test_a_config_raises_nothing_itself(path):
  # Its option checks are config_checks' (one place for their messages); parse_arg types them.
  raises = [n.lineno for n in ast.walk(_tree(path)) if isinstance(n, ast.Raise)]
  assert not raises, f"{path}: raise at line(s) {raises}"


def _configuration_imports(name: str) -> set[str]:
  path = os.path.join(ROOT, "linvit_jax", "configuration", f"{name}.py")
  prefix = "linvit_jax.configuration."
  out = set()
  for m in _imports(_tree(path)):
    assert not m.startswith("linvit_jax.") or m.startswith(("linvit_jax.runtime.", prefix)), m
    if m.startswith(prefix):
      out.add(m[len(prefix) :].split(".")[0])
  return out


def test_configuration_modules_import_no_circle():
  graph = {name: _configuration_imports(name) for name in CONFIGURATION}
  assert not graph["config_lib"], "the schema is the bottom: it imports no configuration module"
  done: set[str] = set()

  def visit(name: str, path: tuple[str, ...]) -> None:
    assert name not in path, f"import circle: {' -> '.join((*path, name))}"
    if name not in done:
      for dep in graph[name]:
        visit(dep, (*path, name))
      done.add(name)

  for name in graph:
    visit(name, ())


def test_every_config_with_checks_is_a_shipped_config():
  from linvit_jax.configuration import config_checks

  names = {os.path.basename(p)[: -len(".py")] for p in CONFIGS}
  assert set(config_checks.CHECKS) <= names


def test_reading_every_config_imports_no_jax():
  # Its options only: convert_folder's get_config needs init= and images= to build a config.
  code = (
      "import importlib.util, sys\n"
      "from linvit_jax.configuration import options\n"
      f"for path in {CONFIGS!r}:\n"
      "  spec = importlib.util.spec_from_file_location('c', path)\n"
      "  module = importlib.util.module_from_spec(spec)\n"
      "  spec.loader.exec_module(module)\n"
      "  options.option_defaults(module.get_config)\n"
      "print([m for m in ('jax', 'linvit_jax.run', 'linvit_jax.studies.ablation') if m in sys.modules])\n"
  )
  result = subprocess.run(
      [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
  )
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.strip() == "[]", result.stdout
