"""Running the project in a subprocess from the tests: paths, the environment, the output.

Shared by test modules (which import this, never each other).
"""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HELPERS = os.path.join(ROOT, "tests", "helpers")
# The robustness tests' tiny config, relative to ROOT (the CLI subprocesses run there).
ROBUST_CONFIG = "tests/helpers/robust_config.py"


def subprocess_env(num_devices: int = 1, **extra: str) -> dict[str, str]:
  """A subprocess environment: CPU with `num_devices` devices, this checkout first on the path,
  no multi-process settings inherited. Pass XLA_FLAGS=os.environ.get("XLA_FLAGS", "") when its
  numbers are compared bit for bit with this process's (optimization level 0 only saves compile
  time: the same results up to float rounding)."""
  env = dict(os.environ)
  env["XLA_FLAGS"] = (
      f"--xla_force_host_platform_device_count={num_devices} " "--xla_backend_optimization_level=0"
  )
  env["JAX_PLATFORMS"] = "cpu"
  env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
  for k in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
    env.pop(k, None)
  env.update(extra)
  return env


def last_line(text: str) -> str:
  """The last non-blank line of a process's output ('' if none)."""
  lines = [line for line in text.splitlines() if line.strip()]
  return lines[-1] if lines else ""


def run_cli(*args: str, timeout: float = 300, env: dict[str, str] | None = None):
  """`python -m linvit_jax.main *args` from the checkout root, output captured as text; `env`
  None inherits this process's environment."""
  return subprocess.run(
      [sys.executable, "-m", "linvit_jax.main", *args],
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=timeout,
      env=env,
  )
