"""The config files shipped with linvit_jax, by name: `--config demo[:arg]` works anywhere.

In a checkout they are the top-level `configs/` directory. A wheel carries the same files as the
package `linvit_jax.configs` (setup.py maps that package onto `configs/`), so a pip-installed
user, who has no `configs/` folder, can still pass `--config demo`, `--config demo.py` or the
README's `--config configs/demo.py:feature_map=elu1`: `resolve_config_argv` turns such a name
into the shipped file's absolute path before absl parses the flags.

  resolve_config_argv(["main", "--config", "demo:tiny=True"])
      -> ["main", "--config", "/…/linvit_jax/configs/demo.py:tiny=True"]
  list_configs() -> ["ablation", "convert_folder", "demo", ...]
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from typing import Any

_PACKAGE = "linvit_jax.configs"
_FLAG_NAMES = ("--config", "-config")  # absl accepts one or two dashes


def config_dir() -> str | None:
  """The directory holding the shipped config files, or None if there is none.

  The installed package `linvit_jax.configs` first (a wheel, or an editable install that maps
  it), then the checkout's `configs/` beside the `linvit_jax` package. A real directory, not an
  importlib.resources Traversable: ml_collections loads a config file by its path.
  """
  try:
    spec = importlib.util.find_spec(_PACKAGE)
  except (ImportError, ValueError):
    spec = None
  # configs/ has no __init__.py: in a wheel it is a namespace package, whose only trace is
  # submodule_search_locations (no origin).
  for location in (spec.submodule_search_locations or []) if spec else []:
    if os.path.isdir(location):
      return os.path.abspath(location)
  package_dir = os.path.dirname(os.path.abspath(importlib.util.find_spec("linvit_jax").origin))
  checkout = os.path.join(os.path.dirname(package_dir), "configs")
  return checkout if os.path.isdir(checkout) else None


def list_configs() -> list[str]:
  """Names of the shipped configs (file names without `.py`), sorted."""
  directory = config_dir()
  if directory is None:
    return []
  return sorted(
      name[: -len(".py")]
      for name in os.listdir(directory)
      if name.endswith(".py") and not name.startswith("_")
  )


def find_config(name: str) -> str | None:
  """Absolute path of the shipped config `name`, or None.

  `name` may be `demo`, `demo.py`, `configs/demo.py` or `./configs/demo.py` (the README's
  spelling, run outside the checkout). Anything else (another directory, a `:arg`) is not a name.
  """
  stem = name[2:] if name.startswith("./") else name
  stem = stem[len("configs/") :] if stem.startswith("configs/") else stem
  stem = stem[: -len(".py")] if stem.endswith(".py") else stem
  if not stem or "/" in stem or os.sep in stem or stem not in list_configs():
    return None
  return os.path.join(config_dir(), stem + ".py")


def _resolve_value(value: str) -> str:
  # ml_collections splits a --config value at its first ':' into the file and get_config's arg.
  path, sep, arg = value.partition(":")
  if os.path.exists(path):  # an existing file (relative to the cwd) always wins
    return value
  found = find_config(path)
  return value if found is None else found + sep + arg


def resolve_config_argv(argv: list[str]) -> list[str]:
  """`argv` with `--config NAME[:arg]` / `--config=NAME[:arg]` pointing at the shipped file.

  Only a NAME that is not an existing path but is a shipped config (`find_config`) is rewritten,
  keeping its `:arg`; an existing path, an unknown name and every other argument are returned
  unchanged (an unknown name is then reported by the flag parser). Arguments after `--` are
  positional and left alone. The list keeps its length and order: ml_collections finds the
  `--config.field=value` overrides by position in sys.argv.
  """
  out = list(argv)
  i = 0
  while i < len(out):
    arg = out[i]
    if arg == "--":
      break
    name, eq, value = arg.partition("=")
    if name in _FLAG_NAMES:
      if eq:
        out[i] = name + "=" + _resolve_value(value)
      elif i + 1 < len(out):
        out[i + 1] = _resolve_value(out[i + 1])
        i += 1
    i += 1
  return out


def load(path: str, arg: str | Mapping[str, Any] | None = None) -> Any:
  """The ConfigDict of config file `path` with its `:arg` (what --config=path:arg loads).

  `arg` is the `:arg` string, or a Mapping of Python values (the Python API's options) handed to
  `get_config` as it is: config_lib.parse_arg reads both.
  """

  spec = importlib.util.spec_from_file_location("linvit_jax_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg or None)
