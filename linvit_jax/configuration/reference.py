"""The config reference: every field of a config with its meaning (`--print_config`), read from
the comments where config_lib.base_config and its blocks define the fields."""

from __future__ import annotations

from typing import Any

import ml_collections as mlc

from linvit_jax.configuration import config_lib


def field_docs() -> dict[str, str]:
  """One line per field, read from config_lib's comments where base_config defines the field.

  Keys are dotted paths; '*' stands for any stage block ("*.steps", "*.optimizer.lr"). A trailing
  `# comment` documents the keyword on its line; a `# name: meaning` comment block above
  `c.<block> = dict(` documents `<block>.name`. Its small readers are nested: they share the
  parsed source and the table they fill.
  """
  import ast
  import inspect
  import re

  source = inspect.getsource(config_lib)
  lines = source.splitlines()
  tree = ast.parse(source)
  docs: dict[str, str] = {}

  def trailing(lineno: int) -> str:
    line = lines[lineno - 1]
    return line.split("  # ", 1)[1].strip() if "  # " in line else ""

  def named(text: str, names: set[str], prefix: str) -> bool:
    """'a: meaning. b: meaning' comments, split at the names of the block's own fields."""
    alternatives = "|".join(sorted(names))
    found = re.findall(rf"\b({alternatives}): (.*?)(?=\s(?:{alternatives}): |$)", text)
    for name, meaning in found:
      docs.setdefault(prefix + name, meaning.strip())
    return bool(found)

  def keywords(call: ast.Call, prefix: str) -> None:
    names = {kw.arg for kw in call.keywords if kw.arg}
    for kw in call.keywords:
      text = trailing(kw.value.end_lineno)
      if kw.arg and text and not named(text, names, prefix):
        docs.setdefault(prefix + kw.arg, text)

  def block_comment(lineno: int, call: ast.Call, prefix: str) -> None:
    i, text = lineno - 2, []
    while i >= 0 and lines[i].strip().startswith("#"):
      text.insert(0, lines[i].strip()[1:].strip())
      i -= 1
    named(" ".join(text), {kw.arg for kw in call.keywords if kw.arg}, prefix)

  scopes = {
      "base_config": "",
      "distill": "distill.",
      "stage": "*.",
      "stage_bookkeeping": "*.",
      "stage_losses": "*.",
  }
  for node in tree.body:
    if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "OPTIMIZER_DEFAULTS":
      keywords(node.value, "*.optimizer.")
    if isinstance(node, ast.FunctionDef) and node.name in scopes:
      for sub in ast.walk(node):
        if isinstance(sub, ast.Assign) and isinstance(sub.targets[0], ast.Attribute):
          name = sub.targets[0].attr
          if isinstance(sub.value, ast.Call) and getattr(sub.value.func, "id", "") == "dict":
            block_comment(sub.lineno, sub.value, f"{name}.")
            keywords(sub.value, f"{name}.")
          elif text := trailing(sub.lineno):
            docs.setdefault(name, text)
        elif isinstance(sub, ast.Call) and getattr(sub.func, "id", "") == "dict":
          keywords(sub, scopes[node.name])
  return docs


def describe(config: mlc.ConfigDict) -> str:
  """Every field of `config`, one per line: `path = value  # meaning` (the meaning where the base
  config documents the field)."""
  docs = field_docs()
  flat: list[tuple[str, Any]] = []

  def walk(node: Any, prefix: str) -> None:
    for key in sorted(node.keys()) if hasattr(node, "keys") else ():
      value = node[key]
      if isinstance(value, mlc.ConfigDict):
        walk(value, f"{prefix}{key}.")
      else:
        flat.append((prefix + key, value))

  walk(config, "")
  stages = set(config_lib.stage_blocks(config))
  out = []
  for path, value in flat:
    head, _, rest = path.partition(".")
    doc = docs.get(path) or (docs.get(f"*.{rest}") if head in stages else None)
    line = f"{path} = {value!r}"
    out.append(f"{line:<60s}  # {doc}" if doc else line)
  return "\n".join(out)
