r"""`python -m linvit_jax.main --config configs/X.py[:arg] --workdir DIR`.

A run: load the teacher (or none, to train a model from scratch) → build the linear student →
surgery with the config's policy → calibrate fresh attention → the config's stages → evaluation →
export (student.npz in big_vision's format, student_config.json, surgery_report.json and .txt,
results.json, plots) into the workdir. Rerunning in the same workdir resumes: finished stages are
skipped, an interrupted stage continues from its last checkpoint.

`cli(command)` is this command line (flags, logging, one-line user errors and exit codes) around
another `command(config, workdir)`: `python -m linvit_jax.studies.ablation` is the same CLI around the
ablation driver.
"""

from __future__ import annotations

import dataclasses
import functools
import logging as std_logging
import os
import sys
from collections.abc import Callable
from typing import Any, NoReturn

# TensorFlow's C++ start-up lines (CPU features, oneDNN, CUDA probes) say nothing to a user; set
# before anything imports TensorFlow. An explicit TF_CPP_MIN_LOG_LEVEL wins.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from linvit_jax.configuration import config_files
from linvit_jax.runtime import errors
from linvit_jax.runtime import quiet_tf
from linvit_jax.runtime.errors import UserError

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file(
    "config",
    None,
    "Config file (a path, or a shipped config's name " "such as 'demo'), optionally with ':arg'.",
    lock_config=True,
)
flags.DEFINE_string("workdir", None, "Where checkpoints, metrics and exports go (local or gs://).")
flags.DEFINE_bool(
    "print_config",
    False,
    "Print the resolved config (every field, with its meaning where the base config gives one) "
    "and exit; no --workdir needed.",
)

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


class _OwnInfoOnly(std_logging.Filter):
  """INFO lines from linvit_jax itself (resuming, hybrid layers, data folders), each text once
  per run; libraries (jax's backend probe, TFDS, orbax) only from WARNING up. `--verbosity=1`
  shows everything.

  Once: every stage opens its data again, and the image-folder summary it logs is the same line
  each time (a run of three stages said it three times)."""

  def __init__(self):
    super().__init__()
    self._said: set[str] = set()

  def filter(self, record: std_logging.LogRecord) -> bool:
    if record.levelno >= std_logging.WARNING:
      return True
    if not record.pathname.startswith(_PACKAGE_DIR):
      return False
    text = record.getMessage()
    if text in self._said:
      return False
    self._said.add(text)
    return True


class _BarSafeStream:
  """stderr for log lines while tqdm bars may be drawn there (conversion/stage_log.py's bars).

  A bar's line has no newline until it closes, so a log line written straight to stderr lands in
  the middle of it. `tqdm.write` clears the bars, writes the line and redraws them; with no bar
  open it is a plain write."""

  def write(self, text: str) -> None:
    import tqdm  # a light import, and only once a line is logged (not for --help)

    tqdm.tqdm.write(text, file=sys.stderr, end="")

  def flush(self) -> None:
    sys.stderr.flush()

  def close(self) -> None:
    pass  # stderr is not ours to close (absl's handler closes a stream that is not stderr)

  def __eq__(self, other: object) -> bool:
    # absl writes a record a second time to sys.stderr when its stream "is not stderr" and the
    # level reaches --stderrthreshold: this stream is stderr.
    return other is self or other is sys.stderr

  __hash__ = object.__hash__


def route_logs_around_bars(handler: std_logging.Handler) -> None:
  """Makes `handler` (absl's stderr handler, a StreamHandler) write through `_BarSafeStream`."""
  handler.stream = _BarSafeStream()


# What a command line runs once its flags are parsed: command(config, workdir).
Command = Callable[[Any, str], Any]


def convert(config: Any, workdir: str) -> None:
  """One conversion run (run.py) and its summary table: what `python -m linvit_jax.main` does."""
  if "ablation" in config:  # its arms are runs of their own: a plain run would be another thing
    raise UserError(
        "this is an ablation config (it has an `ablation` block): run it with "
        "`python -m linvit_jax.studies.ablation --config ... --workdir ...`"
    )
  from linvit_jax import run as run_lib  # heavy imports after flag parsing: fast --help
  from linvit_jax.evaluation import summary

  results = run_lib.run(config, workdir)
  print(summary.format_summary(results))
  print(summary.format_where_exported(workdir))


def main(argv: list[str], command: Command = convert) -> None:
  # absl leaves what is not a flag in argv: a typo such as `--workdir w extra` or a flag's value
  # given without its name would otherwise be dropped silently and a whole run started.
  if argv[1:]:
    raise UserError(
        f"unexpected argument(s) {' '.join(repr(a) for a in argv[1:])}: this command takes "
        "only flags, e.g. --config configs/demo.py --workdir workdirs/demo (--helpshort lists "
        "them)"
    )
  if FLAGS.config is None:
    raise UserError("--config is required, e.g. --config configs/demo.py")
  if FLAGS.print_config:
    from linvit_jax import build
    from linvit_jax.configuration import reference

    config = FLAGS.config
    if "ablation" not in config:  # an ablation's arms resolve their own teachers
      config = build.resolve_from_init(config)
    print(reference.describe(config))
    return
  if not FLAGS.workdir:
    raise UserError("--workdir is required, e.g. --workdir workdirs/demo")
  handler = logging.get_absl_handler().python_handler
  if not FLAGS["verbosity"].present:  # -v / --verbosity given: every library's INFO lines
    handler.addFilter(_OwnInfoOnly())
  route_logs_around_bars(handler)
  command(FLAGS.config, FLAGS.workdir)


_INTERRUPTED = (
    "interrupted outside a training stage; finished stages are checkpointed, rerun "
    "the same command to resume"
)


def _user_error_message(e: BaseException) -> str | None:
  if isinstance(e, UserError):
    return str(e)
  if isinstance(e, OSError) and e.errno in errors.DISK_ERRORS:
    where = f" {e.filename!r}" if e.filename else f" under --workdir {FLAGS['workdir'].value!r}"
    return f"cannot write{where}: {e.strerror or e}"
  return None


def _fail(text: str) -> NoReturn:
  sys.stderr.write(f"error: {errors.one_line(text)}\n")
  sys.exit(2)


# `-h` is what most users type first; absl knows --help, --helpshort, --helpfull and -?.
_HELP_ALIASES = {"-h": "--help"}


def _with_help_aliases(argv: list[str]) -> list[str]:
  """argv with `-h` as `--help` among the flags (not among the arguments after `--`)."""
  end = argv.index("--") if "--" in argv else len(argv)
  return [_HELP_ALIASES.get(a, a) for a in argv[:end]] + argv[end:]


@dataclasses.dataclass(frozen=True)
class _Request:
  """What the command line asks, read by absl from argv before main's flags are parsed (a
  FlagValues of its own that knows only these flags): the --config value, whether help is
  asked, and the --config.<field> overrides (the flags it does not know, as absl returns them)."""

  config: str | None
  help: bool
  overrides: tuple[str, ...]


def _request(argv: list[str]) -> _Request:
  pre = flags.FlagValues()
  flags.DEFINE_string("config", None, "", flag_values=pre)
  for name in ("help", "helpshort", "helpfull"):
    flags.DEFINE_bool(name, False, "", flag_values=pre, short_name="?" if name == "help" else None)
  try:
    rest = pre(argv, known_only=True)
  except flags.Error as e:  # e.g. --config without a value: absl's own sentence
    _fail(f"{e} (--helpshort lists the flags)")
  asks_help = pre.help or pre.helpshort or pre.helpfull
  overrides = tuple(a for a in rest[1:] if a.lstrip("-").startswith("config."))
  return _Request(config=pre.config, help=asks_help, overrides=overrides)


def _load_config(spec: str) -> Any:
  """The config `spec` (`path[:arg]`, a shipped name already resolved) names, loaded by our code
  before absl and ml_collections load it again with the overrides: an error raised here is the
  config file's own (a missing file, its get_config failing), so one raised by the flag parser
  afterwards is an override's."""
  path, _, arg = spec.partition(":")  # ml_collections splits at the first ':' the same way
  if "://" in path:  # a remote config file: ml_collections reads it
    return None
  if not os.path.isfile(path):
    names = ", ".join(config_files.list_configs())
    _fail(
        f"--config: no config file {path!r} (a path to a config .py file, or one of the "
        f"shipped configs: {names})"
    )
  try:
    return config_files.load(path, arg or None)
  except Exception as e:  # noqa: BLE001 - any error of the config's own code, said in one line
    message = _user_error_message(e)
    if message is None:
      message = f"{type(e).__name__}: {e}"
    _fail(f"while loading the config: {message}")


def _stage_field_hint(config: Any, override: str) -> str:
  """'; a <kind> stage does not read <field> ...' when the missing field's block is a stage."""
  *blocks, field = override.lstrip("-")[len("config.") :].split("=", 1)[0].split(".")
  node = config
  for b in blocks:
    node = node.get(b) if hasattr(node, "get") else None
  if not (hasattr(node, "get") and node.get("kind")) or field in node:
    return ""
  from linvit_jax.configuration import config_lib

  fields = sorted(config_lib.stage_fields(node.kind))
  where = "; its loss weights are config.distill's" if node.kind == "distill_attention" else ""
  return f"; a {node.kind} stage does not read {field!r}{where} (its fields: {fields})"


def _missing_field(e: KeyError | AttributeError, config: Any, overrides: tuple[str, ...]) -> str:
  """ml_collections' error for a --config.<field> override of a field the config lacks: an
  AttributeError around a KeyError whose argument names the field (its text adds 'Did you
  mean ...' when a field is close)."""
  detail: Any = e
  while isinstance(detail, BaseException) and detail.args:  # KeyError inside AttributeError
    detail = detail.args[0]
  text = f"no such config field {' '.join(str(detail).split())} (in {' '.join(overrides)})"
  hints = (_stage_field_hint(config, o) for o in overrides) if config is not None else ()
  return text + next((h for h in hints if h), "")


def _parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, with one-line errors: the config is loaded by our code first (a missing
  file or a failing get_config is said as such), then absl and ml_collections parse the flags
  and apply the overrides; what they raise then is an override's error (a field the config
  lacks, a value of the wrong type) or an unknown flag."""
  argv = _with_help_aliases(config_files.resolve_config_argv(argv))
  request = _request(argv)
  config = None
  if request.config is not None and not request.help:  # --help works whatever --config says
    config = _load_config(request.config)
  try:
    return FLAGS(argv)
  except SystemExit as e:
    # absl prints the help, then exits 1; asking for help is no failure.
    if e.code == 1 and request.help:
      sys.exit(0)
    raise
  except (KeyError, AttributeError) as e:
    _fail(f"{_missing_field(e, config, request.overrides)} (--helpshort lists the flags)")
  except flags.Error as e:  # a value absl or ml_collections could not parse, an unknown flag
    _fail(f"{e} (--helpshort lists the flags)")


def cli(command: Command = convert) -> None:
  """Parses --config/--workdir and runs `command(config, workdir)`; known user errors end in
  `error: <message>` on stderr and exit code 2 (128 + signal after Ctrl-C or SIGTERM)."""
  # Before a config or the data pipeline imports TensorFlow loudly; not for --help, which must
  # answer at once (importing TensorFlow takes seconds).
  if not _request(_with_help_aliases(sys.argv)).help:
    quiet_tf.import_quietly("tensorflow")
  try:
    app.run(functools.partial(main, command=command), flags_parser=_parse_flags)
  except KeyError as e:  # a config field that does not exist
    _fail(str(e))
  except KeyboardInterrupt as e:  # preemption.StageInterrupted says which step it saved
    print(f"error: {str(e) or _INTERRUPTED}", file=sys.stderr)
    sys.exit(128 + int(getattr(e, "signum", 2)))  # 130 after Ctrl-C, 143 after SIGTERM
  except Exception as e:
    message = _user_error_message(e)
    if message is None:
      raise
    print(f"error: {errors.one_line(message)}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
  cli()
