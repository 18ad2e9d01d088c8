"""TensorFlow imported without its C++ start-up lines on stderr (one owner for that idea).

TF_CPP_MIN_LOG_LEVEL (set by main.py) silences TensorFlow's logging, but not what its C++
libraries write straight to fd 2 while they load, before absl logging is initialised: on CPUs
where TensorFlow turns its oneDNN ops on, four such lines precede every CLI error.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
import tempfile

_TF_STARTUP_NOISE = re.compile(
    r"All log messages before absl::InitializeLog\(\) is called"
    r"|^[IW]\d{4} [\d:. ]+\d+ \w+\.cc:\d+\] "
    r"|oneDNN custom operations are on"
    r"|This TensorFlow binary is optimized"
    r"|Unable to register cu(DNN|FFT|BLAS) factory"
    r"|TF-TRT Warning"
)


def import_quietly(module: str) -> None:
  """Imports `module` with TensorFlow's start-up lines dropped from stderr (fd 2, where its C++
  code writes them), so that a CLI error stays one line on every CPU; other lines pass through."""
  saved = os.dup(2)
  with tempfile.TemporaryFile() as captured:
    sys.stderr.flush()
    os.dup2(captured.fileno(), 2)
    try:
      importlib.import_module(module)
    except ImportError:
      pass  # not installed: whoever needs it says so
    finally:
      sys.stderr.flush()
      os.dup2(saved, 2)
      os.close(saved)
    captured.seek(0)
    text = captured.read().decode(errors="replace")
  for line in text.splitlines():
    if line.strip() and not _TF_STARTUP_NOISE.search(line):
      sys.stderr.write(line + "\n")
