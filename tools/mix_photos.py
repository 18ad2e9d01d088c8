"""A photo folder mixed from others by a fixed rule, for the data study (docs/data_study.md).

  python tools/mix_photos.py OUT DIR:N [DIR:N ...] [--prefix PREFIX]

From each DIR, the N files (of those whose name starts with PREFIX, when given as DIR:N:PREFIX)
with the smallest sha1 of "mix:" + their file name are copied into OUT: the same files on every
machine, whatever order a folder lists them in. The salt matters: the held-out rule ranks files by
the unsalted sha1 of their path (image_folder.path_hash), so picking the smallest unsalted hashes
would pick the files a run holds out.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys


def pick(folder: str, count: int, prefix: str = "") -> list[str]:
  """The `count` file names of `folder` (starting with `prefix`) with the smallest salted sha1."""
  names = sorted(n for n in os.listdir(folder) if n.startswith(prefix))
  if len(names) < count:
    raise ValueError(f"{folder}: {len(names)} file(s) start with {prefix!r}, {count} asked for")
  return sorted(names, key=lambda n: hashlib.sha1(f"mix:{n}".encode()).hexdigest())[:count]


def main(argv: list[str]) -> int:
  if len(argv) < 2 or any(a.count(":") not in (1, 2) for a in argv[1:]):
    print(__doc__, file=sys.stderr)
    return 2
  out = argv[0]
  os.makedirs(out, exist_ok=True)
  copied = []
  for spec in argv[1:]:
    folder, count, *prefix = spec.split(":")
    for name in pick(folder, int(count), *prefix):
      shutil.copy(os.path.join(folder, name), os.path.join(out, name))
      copied.append(name)
  print(f"wrote {len(copied)} photos to {out}")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
