"""JAX's persistent compilation cache, on by default.

Small models on CPU spend more time compiling than running: the ablation's runs, the tests and a
rerun of the demo compile the same programs again and again. XLA executables are keyed by the
program and the compiler, so reusing them changes no result.
"""

from __future__ import annotations

import os

import jax

DEFAULT_DIR = os.path.join(os.path.expanduser("~"), ".cache", "linvit_jax", "xla")


def enable(directory: str | None = None) -> str | None:
  """Turns the cache on in `directory` ($LINVIT_COMPILE_CACHE, else DEFAULT_DIR); "none" turns
  it off. Returns the directory used, or None."""
  directory = directory or os.environ.get("LINVIT_COMPILE_CACHE") or DEFAULT_DIR
  if directory.lower() == "none":
    return None
  os.makedirs(directory, exist_ok=True)
  jax.config.update("jax_compilation_cache_dir", directory)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  return directory
