"""linvit_jax installed by pip from a copy of this checkout into a folder of its own, and the
environment of a subprocess that imports it from there: what a user gets from `pip install`.

The install the notebook's test makes too (`tests/test_notebook.py`'s `installed`): non-editable,
`--no-deps --no-build-isolation --no-index` (the dependencies are the venv's, nothing is fetched),
~4 s. A copy, not the checkout itself, so that pip's build leaves no `build/` behind in it.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def install(tmp: pathlib.Path) -> pathlib.Path:
  """Installs linvit_jax into `tmp / "site"` and returns that folder (to put first on
  PYTHONPATH)."""
  src, site = tmp / "linvit_jax_checkout", tmp / "site"
  src.mkdir(parents=True)
  for name in ("setup.py", "README.md"):
    shutil.copy(os.path.join(ROOT, name), src / name)
  ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
  for name in ("linvit_jax", "configs"):
    shutil.copytree(os.path.join(ROOT, name), src / name, ignore=ignore)
  pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation"]
  result = subprocess.run(
      pip + ["--no-index", "--target", str(site), str(src)],
      capture_output=True,
      text=True,
      timeout=300,
      check=False,
  )
  if result.returncode:
    raise RuntimeError(f"pip install failed: {result.stderr[-3000:]}")
  shutil.rmtree(src)  # only the install is left to import from
  return site


def env(site: pathlib.Path, **extra: str) -> dict[str, str]:
  """This process's environment with `site` alone on PYTHONPATH (the checkout dropped from it),
  on one CPU device."""
  out = dict(os.environ)
  out["PYTHONPATH"] = str(site)
  out["JAX_PLATFORMS"] = "cpu"
  out["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
  for k in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
    out.pop(k, None)
  out.update(extra)
  return out
