r"""`python -m linvit_jax.main`, with fault points that kill the process (SIGKILL, like kill -9).

  LINVIT_FAULT_LOG=F LINVIT_FAULT_ROOT=W LINVIT_FAULT_KILL='before student.npz#1' \
    python -m tests.helpers.fault_run --config ... --workdir W

Every file rename in the process (os.rename, os.replace: how gfile.atomic_open commits a file,
orbax commits a checkpoint and the export commits student.npz / .safetensors / the config) is two
fault points, one just before the rename (the new file fully written, not yet in place) and one
just after. A point's name is `<before|after> <destination relative to W>#<k>`, k counting that
name's points in this process from 1; each point appends its name to F. With LINVIT_FAULT_KILL
set, the process kills itself at the point of that name, before logging it.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

_LOCK = threading.Lock()
_SEEN: dict[str, int] = {}


def _point(when: str, dst: object) -> None:
  log, kill = os.environ.get("LINVIT_FAULT_LOG"), os.environ.get("LINVIT_FAULT_KILL")
  root = os.path.realpath(os.environ.get("LINVIT_FAULT_ROOT", "."))
  rel = os.path.relpath(os.path.realpath(os.fspath(dst)), root)
  with _LOCK:  # orbax renames from its own threads
    key = f"{when} {rel}"
    _SEEN[key] = _SEEN.get(key, 0) + 1
    name = f"{key}#{_SEEN[key]}"
    if kill == name:
      os.kill(os.getpid(), signal.SIGKILL)
    if log:
      with open(log, "a") as f:
        f.write(name + "\n")


def _wrap(fn):
  def wrapped(src, dst, *args, **kwargs):
    _point("before", dst)
    out = fn(src, dst, *args, **kwargs)
    _point("after", dst)
    return out

  return wrapped


def install() -> None:
  os.rename = _wrap(os.rename)
  os.replace = _wrap(os.replace)


if __name__ == "__main__":
  install()
  from linvit_jax import main

  sys.argv[0] = "linvit_jax.main"
  main.cli()
