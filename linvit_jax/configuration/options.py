"""The options of a config file: its `:arg` string (or the Python API's keywords), typed after
the defaults its `get_config` declares with `parse_arg`.

    def get_config(arg=None):
      arg = options.parse_arg(arg, res=224, images="")   # --config file.py:res=448,images=DIR

An unknown option names the nearest known ones; a value of the wrong type names the option
(OptionError, a UserError). `option_defaults(get_config)` reads a config's options without
building it. Imports nothing of linvit_jax but the errors.
"""

from __future__ import annotations

import difflib
import numbers
import os
from collections.abc import Mapping
from typing import Any

import ml_collections as mlc

from linvit_jax.runtime.errors import UserError


class OptionError(UserError, ValueError):
  """A config option (`:arg` name or a keyword of `linvit_jax.convert`) that is unknown or whose
  value does not fit its default's type; the message names the option."""


def _unknown(key: str, defaults: Mapping[str, Any]) -> OptionError:
  close = difflib.get_close_matches(key, list(defaults), n=3)
  hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
  if len(defaults) <= 12:
    known = f"known: {', '.join(sorted(defaults))}"
  else:  # a list of dozens of names hides the one line that matters
    known = f"the config file's docstring lists its {len(defaults)} options"
  return OptionError(f"unknown config arg {key!r}{hint} ({known})")


def _parse_text(key: str, value: str, default: Any) -> Any:
  """`value` as the `:arg` text spells it, typed after `default`."""
  if isinstance(default, bool):
    if value.lower() not in ("true", "false", "1", "0"):
      raise OptionError(f"config arg {key}={value!r} is not a boolean")
    return value.lower() in ("true", "1")
  if isinstance(default, (int, float)):
    try:
      return type(default)(value)
    except ValueError:
      what = "an integer" if isinstance(default, int) else "a number"
      raise OptionError(f"config arg {key}={value!r} is not {what}") from None
  return value


class NumberOrText(str):
  """A text option's default whose option also takes a whole number from Python (as its digits):
  softmax_key_grid=32 or softmax_key_grid='2x'. The parsed option is plain text."""


def _check_value(key: str, value: Any, default: Any) -> Any:
  """A Python `value` for option `key`, checked against (and converted to) its default's type.

  Text is read as the `:arg` string would spell it (what a CLI wrapper forwards); a path object is
  its string; a square pair (448, 448) is one int where the option is an int (a resolution); a
  whole number is its digits where the default is a NumberOrText (softmax_key_grid: 32 or '2x').
  """
  if isinstance(value, str) and not isinstance(default, str) and default is not None:
    return _parse_text(key, value, default)
  if isinstance(default, bool):
    if type(value).__name__ in ("bool", "bool_"):  # numpy's bool too, never 0 / 1
      return bool(value)
    raise OptionError(f"config arg {key}={value!r} is not a boolean (True or False)")
  if isinstance(default, int):
    if isinstance(value, (list, tuple)) and value and len(set(value)) == 1:
      # Why: a caller may write res=(448, 448); the configs take a square side.
      value = value[0]
    elif isinstance(value, (list, tuple)):
      raise OptionError(
          f"config arg {key}={value!r}: this option is one integer (a square resolution takes "
          "one side)"
      )
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
      return int(value)
    raise OptionError(f"config arg {key}={value!r} is not an integer")
  if isinstance(default, float):
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
      return float(value)
    raise OptionError(f"config arg {key}={value!r} is not a number")
  if isinstance(default, str):
    if isinstance(value, os.PathLike):
      return os.fspath(value)
    if isinstance(default, NumberOrText) and isinstance(value, numbers.Integral):
      if not isinstance(value, bool):
        return str(value)  # what the command line's digits give
    if isinstance(value, str):
      return value
    raise OptionError(f"config arg {key}={value!r} is not a string")
  if isinstance(default, tuple):
    if isinstance(value, (list, tuple)):
      return tuple(value)
    raise OptionError(f"config arg {key}={value!r} is not a tuple")
  return value


class _Defaults(Exception):
  """Carries a config's option defaults out of its get_config (option_defaults)."""

  def __init__(self, defaults: dict[str, Any]):
    super().__init__("option defaults")
    self.defaults = defaults


# The arg with which get_config's parse_arg hands back its defaults instead of a config.
_ASK_DEFAULTS = ("linvit_jax: ask the option defaults",)


def option_defaults(get_config: Any) -> dict[str, Any]:
  """The `:arg` options of a config file's `get_config` and their defaults, in its order.

  Read from its parse_arg call, before any of its checks run: a config whose options need a
  real file (init=, images=) still answers.
  """
  try:
    get_config(_ASK_DEFAULTS)
  except _Defaults as e:
    return e.defaults
  raise ValueError(f"{get_config.__module__}.get_config does not read its arg with parse_arg")


def parse_arg(arg: str | Mapping[str, Any] | None, **defaults: Any) -> mlc.ConfigDict:
  """The options of a config file's `get_config(arg)`, typed after `defaults`.

  `arg` is the `:arg` text 'k=v,k2=v2' of `--config file.py:arg` (a value may contain '/' or
  ':', a variant 'S/16' or a path 'gs://b/x.npz', not ','), or a Mapping of Python values (the
  Python API: any string, a bool, a number; each checked against its default's type). An unknown
  name or a value of the wrong type is an OptionError (a UserError and a ValueError).
  """
  if arg is _ASK_DEFAULTS:
    raise _Defaults(dict(defaults))
  out = mlc.ConfigDict(
      {k: str(v) if isinstance(v, NumberOrText) else v for k, v in defaults.items()}
  )
  if not arg:
    return out
  if isinstance(arg, Mapping):
    for key, value in arg.items():
      if key not in defaults:
        raise _unknown(key, defaults)
      out[key] = _check_value(key, value, defaults[key])
    return out
  for item in arg.split(","):
    if not item:
      continue
    if "=" not in item:
      raise OptionError(f"config arg {item!r} is not of the form key=value (in {arg!r})")
    key, value = item.split("=", 1)
    if key not in defaults:
      raise _unknown(key, defaults)
    out[key] = _parse_text(key, value, defaults[key])
  return out
