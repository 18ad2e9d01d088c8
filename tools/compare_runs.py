"""Whether two run workdirs hold bitwise-equal results (a refactor's proof).

  python tools/compare_runs.py WORKDIR_A WORKDIR_B [--ignore KEY ...]

Compares results.json (every number except wall-clock timings, images/s and the config's
bookkeeping) and every array of student.npz exactly; prints each difference and exits 1 if any.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

# Measured wall-clock quantities: they differ between any two runs.
# "cached": whether the teacher's k-NN features came from the feature cache (the same numbers).
_NOISY = ("timing_s", "images_per_s", "per_sec", "peak_bytes", "seconds", "time", "cached")


def _noisy(key: str) -> bool:
  return any(word in key for word in _NOISY)


def _diff(a, b, path: str, out: list[str], ignore: tuple[str, ...] = ()) -> None:
  if isinstance(a, dict) and isinstance(b, dict):
    for k in sorted(set(a) | set(b)):
      if not _noisy(k) and f"{path}.{k}" not in ignore:
        _diff(a.get(k), b.get(k), f"{path}.{k}", out, ignore)
  elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
    for i, (x, y) in enumerate(zip(a, b)):
      _diff(x, y, f"{path}[{i}]", out, ignore)
  elif a != b:
    out.append(f"{path}: {a!r} vs {b!r}")


def compare(dir_a: str, dir_b: str, ignore: tuple[str, ...] = ()) -> list[str]:
  """Differences between two workdirs; `ignore`: dotted results keys left out (results.config)."""
  out: list[str] = []
  with open(os.path.join(dir_a, "results.json")) as f:
    a = json.load(f)
  with open(os.path.join(dir_b, "results.json")) as f:
    b = json.load(f)
  _diff(a, b, "results", out, tuple(ignore))
  npz_a, npz_b = np.load(os.path.join(dir_a, "student.npz")), np.load(
      os.path.join(dir_b, "student.npz")
  )
  for k in sorted(set(npz_a.files) | set(npz_b.files)):
    if k not in npz_a.files or k not in npz_b.files:
      out.append(f"student.npz: {k} only in one")
    elif not np.array_equal(npz_a[k], npz_b[k]):
      out.append(f"student.npz: {k} differs (max {np.max(np.abs(npz_a[k] - npz_b[k]))})")
  return out


if __name__ == "__main__":
  args = sys.argv[1:]
  ignore = tuple(f"results.{k}" for i, k in enumerate(args) if i and args[i - 1] == "--ignore")
  positional = [
      a for i, a in enumerate(args) if a != "--ignore" and not (i and args[i - 1] == "--ignore")
  ]
  diffs = compare(positional[0], positional[1], ignore)
  print("\n".join(diffs) if diffs else "bitwise equal")
  sys.exit(1 if diffs else 0)
