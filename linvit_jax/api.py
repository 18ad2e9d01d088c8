"""The Python API: `linvit_jax.convert(...)` and `linvit_jax.load_student(dir)`.

  student = linvit_jax.convert("vit.npz" | "hf_folder", images="photos/", workdir="w", res=224)
  student.encode(["cat.jpg"])

`convert` is the command line's run (`python -m linvit_jax.main --config convert_folder:...`)
called from Python: the options are that config's `:arg` names given as Python values (a path
with a comma, `res=(448, 448)`, `tiny=True`), the exported student lands in `workdir` as it does
from the CLI (resumable the same way), and the student comes back loaded. Every problem with an
option (an unknown name, a value of the wrong type or out of range) is a `UserError`.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import os
import re
from typing import Any

from linvit_jax.artifacts.student import Student  # noqa: F401  (re-exported)
from linvit_jax.artifacts.student_loader import load_student  # noqa: F401  (re-exported)
from linvit_jax.configuration import config_files
from linvit_jax.configuration import options
from linvit_jax.configuration.options import OptionError  # noqa: F401  (re-exported)
from linvit_jax.runtime.errors import UserError

# `convert`'s own arguments stand for these options of the config.
_OWN = ("init", "images")


def _config_path(config: str) -> str:
  path = config if os.path.isfile(config) else config_files.find_config(config)
  if path is None:
    raise UserError(
        f"config {config!r}: no such file and no shipped config of that name "
        f"(shipped: {', '.join(config_files.list_configs())})"
    )
  return path


def load_config(config: str, **options: Any) -> Any:
  """A config file's ConfigDict from Python: `config` is a shipped name ('convert_folder', 'demo')
  or a path; `options` are its `:arg` fields as Python values (`max_images=2000,
  feature_map="elu1", images=pathlib.Path("a,b")`), each checked against its default's type.

  Raises a UserError (`OptionError`) for an unknown option (naming the closest one) or a value
  the config rejects.
  """
  path = _config_path(config)
  try:
    # A dict, not a 'k=v,...' string: a value may hold any character and keeps its Python type.
    return config_files.load(path, dict(options))
  except UserError:
    raise
  except ValueError as e:  # a config's get_config rejecting a value: the caller's to fix
    raise OptionError(f"{os.path.basename(path)}: {e}") from e


def option_defaults(config: str) -> dict[str, Any]:
  """The `:arg` options of config `config` (a shipped name or a path) and their defaults."""
  path = _config_path(config)
  spec = importlib.util.spec_from_file_location("linvit_jax_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return options.option_defaults(module.get_config)


# An option's line in a config's docstring: `  name: meaning`, `  name=default: meaning`,
# `  - name (default): meaning`, with the name in backticks or not.
_OPTION_LINE = re.compile(
    r"^(\s*)(?:[-*]\s+)?`?(\w+)`?(?:=[^:\s]*)?`?(?:\s*\([^)]*\))?\s*:\s+(\S.*)$"
)


def option_meanings(config: str) -> dict[str, str]:
  """A one-line meaning of each option the config's module docstring describes on a line of its
  own (`name: meaning` or `name=default: meaning`; continuation lines indented deeper are
  joined). Options it does not describe that way are absent."""
  path = _config_path(config)
  with open(path) as f:
    source = f.read()
  try:
    doc = ast.get_docstring(ast.parse(source)) or ""
  except SyntaxError:
    return {}
  names = set(option_defaults(config))
  out: dict[str, str] = {}
  current, indent = None, 0
  for line in doc.splitlines():
    match = _OPTION_LINE.match(line)
    if match and match.group(2) in names and match.group(2) not in out:
      current, indent = match.group(2), len(match.group(1))
      out[current] = match.group(3).strip()
    elif current and line.strip() and len(line) - len(line.lstrip()) > indent:
      out[current] += " " + line.strip()
    else:
      current = None
  for name, meaning in _args_paragraph(doc).items():  # the older prose form, where still used
    if name in names:
      out.setdefault(name, meaning)
  return out


def _args_paragraph(doc: str) -> dict[str, str]:
  """`name (meaning)` items of an 'Args: a, b (meaning), c / d (meaning)' paragraph."""
  start = doc.find("Args:")
  if start < 0:
    return {}
  text = " ".join(doc[start + len("Args:") :].split("\n\n")[0].split())
  items, depth, item = [], 0, ""
  for char in text:  # split at the commas outside parentheses
    depth += {"(": 1, ")": -1}.get(char, 0)
    if char == "," and depth == 0:
      items.append(item)
      item = ""
    else:
      item += char
  items.append(item)
  out = {}
  for item in items:
    match = re.fullmatch(r"\s*([\w\s/]+?)\s*\((.*)\)\s*\.?\s*", item)
    if match:
      for name in match.group(1).split("/"):
        out[name.strip()] = match.group(2)
  return out


def options_help(config: str = "convert_folder") -> str:
  """The options section of `convert`'s docstring: every option of `config`, its default and,
  where the config's docstring gives one, its meaning."""
  defaults = option_defaults(config)
  meanings = option_meanings(config)
  lines = []
  for name, default in defaults.items():
    if name in _OWN:
      continue
    meaning = meanings.get(name)
    lines.append(f"    {name}={default!r}" + (f": {meaning}" if meaning else ""))
  return "\n".join(lines)


def convert(
    teacher: str | os.PathLike[str],
    *,
    workdir: str | os.PathLike[str],
    images: str | os.PathLike[str] | None = None,
    config: str | None = None,
    **options: Any,
) -> Student:
  """Converts `teacher` to a linear-attention student and returns it, loaded.

    `teacher` is a big_vision .npz or short name, a Hugging Face / timm model folder or
    .safetensors file, or a hub name: `hf:facebook/dinov2-small`, `timm:vit_small_patch14_dinov2`
    (read from huggingface_hub's cache; `pip install 'linvit_jax[hub]'`).

    With `images` (a folder of photos) the run is `configs/convert_folder.py` (label-free); with
    `config` any config that takes `init=` (e.g. 'imagenet_vit' with `data_dir=`). `options` are the
    config's `:arg` names as Python values, each checked against its default's type; an unknown
    name or a value the config rejects raises `linvit_jax.api.OptionError` (a UserError).

    Options of convert_folder (name=default: meaning):
  {options}
  """
  if config is None:
    if images is None:
      raise UserError("convert: pass images=<folder of photos> (or config=<config name>)")
    config = "convert_folder"
  if images is not None:
    options["images"] = images
  cfg = load_config(config, init=teacher, **options)  # option errors before the heavy imports
  from linvit_jax import run as run_lib  # the training stack, imported only when converting

  run_lib.run(cfg, os.fspath(workdir))
  return load_student(os.fspath(workdir))


def _document_convert() -> None:
  """Fills `convert`'s docstring and signature with convert_folder's options (help() shows them)."""
  try:
    text = options_help("convert_folder")
    defaults = option_defaults("convert_folder")
  except Exception as e:  # noqa: BLE001 - a docstring must never break `import linvit_jax`
    text, defaults = f"    (could not read configs/convert_folder.py: {type(e).__name__})", {}
  convert.__doc__ = convert.__doc__.replace("{options}", text)
  signature = inspect.signature(convert)
  params = [p for p in signature.parameters.values() if p.kind != p.VAR_KEYWORD]
  params += [
      inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default)
      for name, default in defaults.items()
      if name not in _OWN
  ]
  params.append(signature.parameters["options"])
  convert.__signature__ = signature.replace(parameters=params)


_document_convert()
