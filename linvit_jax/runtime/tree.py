"""Parameter trees as '/'-joined paths: flatten / unflatten, key-path names and regex rules.

Every path-regex field of the project (surgery policies, `dont_load`, sharding `param_rules`,
trainable masks, `wd_pattern`) names leaves the same way, big_vision's:

    Transformer/encoderblock_0/MultiHeadDotProductAttention_0/query/kernel

and matches a regex against the whole path (`re.fullmatch`), so one pattern means the same thing
in every field: "kernel" matches nothing, ".*/kernel" every kernel. Fields that are a list of
(regex, value) rules take the first rule whose regex matches (`first_match`); fields that are a
set of regexes ask whether any matches (`matches`).

Also the one conversion of a config block (dict, ConfigDict or None) to a dict: `as_dict`.

No jax import at module level: checkpoints.py (numpy-only) uses flatten/unflatten.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

Patterns = str | re.Pattern | Iterable[str | re.Pattern]


def flatten(tree: Mapping[str, Any], *, error: type[Exception] = ValueError) -> dict[str, Any]:
  """Nested dict -> {'a/b/c': leaf}, names sorted (the order big_vision writes them in).

  Empty sub-dicts vanish, as in big_vision's tree_flatten_with_names. A key that is not a
  non-empty string without '/' (it could not round-trip) raises `error`.
  """
  flat: dict[str, Any] = {}

  def visit(node: Mapping[str, Any], prefix: str) -> None:
    for key in sorted(node):
      if not isinstance(key, str) or not key or "/" in key:
        raise error(
            f"param name {key!r} under '{prefix or '<root>'}' must be a non-empty string "
            "without '/' (a '/'-joined path names each leaf, e.g. as an npz key)"
        )
      value = node[key]
      if isinstance(value, Mapping):
        visit(value, prefix + key + "/")
      else:
        flat[prefix + key] = value

  if not isinstance(tree, Mapping):
    raise error(f"expected a nested dict of params, got {type(tree).__name__}")
  visit(tree, "")
  return flat


def unflatten(flat: Mapping[str, Any], *, error: type[Exception] = ValueError) -> dict[str, Any]:
  """{'a/b/c': leaf} -> nested dict. A name that is both a leaf and a prefix raises `error`."""
  tree: dict[str, Any] = {}
  for name in sorted(flat):
    parts = name.split("/")
    node = tree
    for depth, part in enumerate(parts[:-1]):
      child = node.setdefault(part, {})
      if not isinstance(child, dict):
        raise error(
            f"key {name!r} nests under '{'/'.join(parts[:depth + 1])}', which is itself " "an array"
        )
      node = child
    if parts[-1] in node:
      raise error(f"key {name!r} is both an array and a prefix of other keys")
    node[parts[-1]] = flat[name]
  return tree


def path_str(path: Sequence[Any]) -> str:
  """A jax key path as a '/'-joined name: (DictKey('a'), GetAttrKey('b'), SequenceKey(0)) → 'a/b/0'.

  Duck-typed on the key classes' fields (DictKey/FlattenedIndexKey .key, GetAttrKey .name,
  SequenceKey .idx), so that this module needs no jax import.
  """
  parts = []
  for k in path:
    for field in ("key", "name", "idx"):
      if hasattr(k, field):
        parts.append(str(getattr(k, field)))
        break
    else:
      parts.append(str(k))
  return "/".join(parts)


def compile_patterns(
    patterns: Patterns, *, error: type[Exception] | None = None, what: str = "pattern"
) -> list[re.Pattern]:
  """One regex or several (str or compiled) as a list of compiled patterns, in order.

  A lone string is one pattern (not one per character). A bad regex raises re.error, or, with
  `error`, `error("<what> '<regex>' is not a valid regex: ...")`, so that a config field names
  itself when it is read rather than at the first path.
  """
  if isinstance(patterns, (str, re.Pattern)):
    patterns = [patterns]
  compiled = []
  for p in patterns:
    if isinstance(p, re.Pattern):
      compiled.append(p)
      continue
    try:
      compiled.append(re.compile(p))
    except re.error as e:
      if error is None:
        raise
      raise error(f"{what} {p!r} is not a valid regex: {e}") from e
  return compiled


def first_match(name: str, patterns: Sequence[re.Pattern]) -> int | None:
  """The index of the first compiled pattern that matches the whole of `name` (re.fullmatch), or
  None: the rule of every "(regex, value) pairs, first match wins" field."""
  for i, p in enumerate(patterns):
    if p.fullmatch(name):
      return i
  return None


def matches(name: str, patterns: Sequence[re.Pattern]) -> bool:
  """Whether any compiled pattern matches the whole of `name` (re.fullmatch)."""
  return first_match(name, patterns) is not None


def regex_mask(tree: Any, patterns: Patterns) -> Any:
  """A pytree of Python bools like `tree`: True where the leaf's path fullmatches a pattern."""
  import jax  # (see the module docstring)

  compiled = compile_patterns(patterns)
  return jax.tree_util.tree_map_with_path(lambda p, _: matches(path_str(p), compiled), tree)


def as_dict(cfg: Any) -> dict[str, Any]:
  """A config block given as a dict, an ml_collections ConfigDict or None, as a new dict.

  A ConfigDict (or FrozenConfigDict) becomes plain dicts all the way down (its `to_dict()`);
  a mapping is copied one level deep; None is {}.
  """
  if hasattr(cfg, "to_dict"):
    return cfg.to_dict()
  return dict(cfg or {})
