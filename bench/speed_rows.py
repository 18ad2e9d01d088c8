"""Reading bench_speed's JSON rows: the operators' order, a group's rows, one case's row, whether
it was timed, and how many times faster one case ran than another.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

LINEAR = ("elu1", "relu", "hedgehog", "favor")
ORDER = ("softmax", "cudnn", "chunked_softmax") + LINEAR


def load(path: str) -> dict[str, Any] | None:
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def rows(speed: dict, what: str, mode: str | None = None) -> list[dict]:
  rows = [r for r in speed["rows"] if r["what"] == what and (mode is None or r["mode"] == mode)]
  return sorted(
      rows, key=lambda r: (r["size"], r["mode"], ORDER.index(r["op"]) if r["op"] in ORDER else 99)
  )


def find(speed: dict, what: str, mode: str, size: int, op: str) -> dict | None:
  for r in speed["rows"] if speed else ():
    if (r["what"], r["mode"], r["size"], r["op"]) == (what, mode, size, op):
      return r
  return None


def timed(r: dict | None) -> bool:
  return bool(r) and r.get("status") == "ok" and "ms" in r


def speedup(lin: dict, ref: dict) -> float:
  """How many times faster `lin` ran than `ref`: the median over the rounds of their group of
  ref_time / lin_time (both timed in each round)."""
  a, b = np.asarray(ref["times_s"]), np.asarray(lin["times_s"])
  if len(a) != len(b):  # not from one group: fall back to the ratio of medians
    return ref["ms"] / lin["ms"]
  return float(np.median(a / b))
