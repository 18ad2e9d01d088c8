r"""`python -m linvit_jax.main --config configs/X.py[:arg] --workdir DIR`.

A run: load the teacher (or none, to train a model from scratch) → build the linear student →
surgery with the config's policy → calibrate fresh attention → the config's stages → evaluation →
export (student.npz in big_vision's format, student_config.json, surgery_report.json,
results.json, plots) into the workdir. Rerunning in the same workdir resumes: finished stages are
skipped, an interrupted stage continues from its last checkpoint.
"""

from __future__ import annotations

import errno
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


# Errors that are the user's to fix (config, checkpoint, data, disk), by module and class name:
# the CLI prints their message, not a traceback. Anything else is a bug and keeps its traceback.
_USER_ERRORS = (("linvit_jax.run", "ConfigError"), ("linvit_jax.checkpoints", "CheckpointError"),
                ("linvit_jax.surgery", "SurgeryError"), ("linvit_jax.train", "NonFiniteLossError"))
_DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES)
_INTERRUPTED = ("interrupted outside a training stage; finished stages are checkpointed, rerun "
                "the same command to resume")


def _user_error_message(e: BaseException) -> str | None:
  kinds = tuple(getattr(sys.modules[m], n) for m, n in _USER_ERRORS if m in sys.modules)
  if kinds and isinstance(e, kinds):
    return str(e)
  if isinstance(e, OSError) and e.errno in _DISK_ERRNOS:
    if type(e).__name__ == "WorkdirWriteError":  # train.py's message already says where
      return str(e)
    where = f" {e.filename!r}" if e.filename else f" under --workdir {FLAGS['workdir'].value!r}"
    return f"cannot write{where}: {e.strerror or e}"
  return None


def _parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, with one-line errors where ml_collections gives tracebacks: a config
  field that does not exist, and a ValueError/TypeError from a config file's get_config (e.g. a
  bad `:arg`; its traceback is embedded in the message, the last line says what is wrong)."""
  try:
    return FLAGS(argv)
  except (KeyError, AttributeError) as e:  # --config.<field> that the config does not have
    detail: Any = e
    while isinstance(detail, BaseException) and detail.args:  # KeyError inside AttributeError
      detail = detail.args[0]
    overrides = " ".join(a for a in argv[1:] if a.startswith("--config."))
    text = f"no such config field {' '.join(str(detail).split())} (in {overrides})"
  except flags.Error as e:
    text = str(e)
    if "Traceback (most recent call last)" in text:
      lines = [line.strip() for line in text.splitlines() if line.strip()]
      text = f"{lines[0].split(' Error whilst parsing config file')[0]} {lines[-1]}"
  sys.stderr.write(f"FATAL Flags parsing error: {text}\n"
                   "Pass --helpshort or --helpfull to see help on flags.\n")
  sys.exit(1)


def _entry() -> None:
  # Known user errors end in `error: <message>` on stderr and exit code 2 (130 for Ctrl-C).
  try:
    app.run(main, flags_parser=_parse_flags)
  except KeyError as e:  # a config field that does not exist
    sys.exit(f"error: {e}")
  except KeyboardInterrupt as e:  # train.StageInterrupted says which step it saved
    print(f"error: {str(e) or _INTERRUPTED}", file=sys.stderr)
    sys.exit(130)
  except Exception as e:  # pylint: disable=broad-except
    message = _user_error_message(e)
    if message is None:
      raise
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
  _entry()
