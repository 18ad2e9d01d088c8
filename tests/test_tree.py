"""tree.py: '/'-joined paths, flatten / unflatten, regex masks and first-match rules with
re.fullmatch, and config blocks as dicts."""

import collections
import re

import flax.struct
import jax
import ml_collections
import numpy as np
import pytest

from linvit_jax.runtime import tree


class TreeError(ValueError):
  pass


def test_flatten_unflatten_round_trip_sorted_and_empty_dicts_vanish():
  nested = {"b": {"y": 2, "x": 1}, "a": 0, "empty": {}}
  flat = tree.flatten(nested)
  assert list(flat) == ["a", "b/x", "b/y"]
  assert tree.unflatten(flat) == {"a": 0, "b": {"x": 1, "y": 2}}


@pytest.mark.parametrize(
    "bad, words",
    [
        ({"a/b": 1}, "without '/'"),
        ({"a": {3: 1}}, "3"),
        ({"": 1}, "non-empty"),
        ([1, 2], "expected a nested dict"),
    ],
)
def test_flatten_errors_are_the_callers_type(bad, words):
  with pytest.raises(TreeError, match=words):
    tree.flatten(bad, error=TreeError)


def test_unflatten_errors_are_the_callers_type():
  with pytest.raises(TreeError, match="nests under .a., which is itself an array"):
    tree.unflatten({"a": 1, "a/b": 2}, error=TreeError)
  with pytest.raises(ValueError, match="nests under .a/b."):  # ValueError by default
    tree.unflatten({"a/b": 1, "a/b/c": 2})


@flax.struct.dataclass
class _State:
  step: int
  params: dict


def test_path_str_of_every_key_kind():
  Pair = collections.namedtuple("Pair", "mu nu")
  t = {"opt": [Pair(mu={"k": 1}, nu=2)], "state": _State(step=3, params={"w": 4})}
  paths = [tree.path_str(p) for p, _ in jax.tree_util.tree_flatten_with_path(t)[0]]
  assert paths == ["opt/0/mu/k", "opt/0/nu", "state/step", "state/params/w"]


def test_regex_mask_fullmatches_one_or_several_patterns():
  params = {
      "Dense_0": {"kernel": np.zeros((2, 2)), "bias": np.zeros(2)},
      "head": {"kernel": np.zeros((2, 3))},
  }
  assert tree.regex_mask(params, "kernel") == {
      "Dense_0": {"kernel": False, "bias": False},
      "head": {"kernel": False},
  }
  assert tree.regex_mask(params, ".*/kernel") == {
      "Dense_0": {"kernel": True, "bias": False},
      "head": {"kernel": True},
  }
  assert tree.regex_mask(params, ["head/.*", r"Dense_\d/bias"]) == {
      "Dense_0": {"kernel": False, "bias": True},
      "head": {"kernel": True},
  }
  assert tree.matches("head/kernel", tree.compile_patterns("head/.*"))
  assert not tree.matches("xhead/kernel", tree.compile_patterns("head/.*"))


def test_first_match_is_the_first_rule_that_fullmatches():
  rules = tree.compile_patterns([r".*/kernel", r"head/.*", r".*"])
  assert tree.first_match("head/kernel", rules) == 0  # the first, although all three match
  assert tree.first_match("head/bias", rules) == 1
  assert tree.first_match("cls", rules) == 2
  assert tree.first_match("cls", rules[:2]) is None
  assert tree.first_match("xkernel", tree.compile_patterns("kernel")) is None  # whole name only


def test_compile_patterns_names_a_bad_regex_in_the_callers_error():
  assert [p.pattern for p in tree.compile_patterns("a|b")] == ["a|b"]  # one pattern, not 3
  with pytest.raises(TreeError, match=r"dont_load pattern 'head/\(' is not a valid regex"):
    tree.compile_patterns(["ok", "head/("], error=TreeError, what="dont_load pattern")
  with pytest.raises(re.error):  # re.error by default
    tree.compile_patterns("head/(")


def test_as_dict_of_a_dict_a_config_dict_and_none():
  cfg = ml_collections.ConfigDict({"lr": 0.1, "sub": {"wd": 0.0}})
  plain = tree.as_dict(cfg)
  assert plain == {"lr": 0.1, "sub": {"wd": 0.0}} and type(plain["sub"]) is dict
  given = {"lr": 0.1}
  assert tree.as_dict(given) == given and tree.as_dict(given) is not given  # a copy
  assert tree.as_dict(None) == {}
