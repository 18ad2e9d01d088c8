"""tree.py: '/'-joined paths, flatten / unflatten, and regex masks with re.fullmatch."""

import collections

import flax.struct
import jax
import numpy as np
import pytest

from linvit_jax import tree


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
