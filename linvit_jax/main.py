r"""`python -m linvit_jax.main --config configs/X.py[:arg] --workdir DIR`.

A run: load the teacher (or none, to train a model from scratch) → build the linear student →
surgery with the config's policy → calibrate fresh attention → the config's stages → evaluation →
export (student.npz in big_vision's format, student_config.json, surgery_report.json,
results.json, plots) into the workdir. Rerunning in the same workdir resumes: finished stages are
skipped, an interrupted stage continues from its last checkpoint.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Config file, optionally with ':arg'.",
                                lock_config=True)
flags.DEFINE_string("workdir", None, "Where checkpoints, metrics and exports go (local or gs://).")


def main(argv: list[str]) -> None:
  del argv
  if FLAGS.config is None:
    raise app.UsageError("--config is required, e.g. --config configs/demo.py")
  if not FLAGS.workdir:
    raise app.UsageError("--workdir is required, e.g. --workdir workdirs/demo")
  from linvit_jax import run as run_lib  # heavy imports after flag parsing: fast --help
  if "ablation" in FLAGS.config:
    from linvit_jax import ablation
    ablation.run_ablation(FLAGS.config, FLAGS.workdir)
    return
  results = run_lib.run(FLAGS.config, FLAGS.workdir)
  print(run_lib.format_summary(results))


def _entry() -> None:
  # A config field that does not exist is a flags error; make it one clear line, not a traceback.
  try:
    app.run(main)
  except KeyError as e:
    sys.exit(f"error: {e}")


if __name__ == "__main__":
  _entry()
