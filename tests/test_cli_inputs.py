"""What the command lines do with the inputs users type (issue 40 from a fresh clone): `--help`
answers at once and exits 0; a stray positional argument, a `--num_heads` that does not divide the
width, an output path under a file or an unknown photo set is one `error:` line, exit 2, nothing
written; and the CLI's own output: log lines never break a progress bar, each INFO text once per
run, the run ends by saying where the student is and how to load it.

Part of the robustness matrix (ROBUSTNESS.md, "Command lines"). Cheap: in-process calls of each
module's main, and subprocesses only where a fresh interpreter is the point (what `--help`
imports).
"""

import io
import logging
import os
import subprocess
import sys

import ml_collections as mlc
import pytest
import tqdm

from linvit_jax import main as main_lib
from linvit_jax.data import sample_photos
from linvit_jax.evaluation import summary
from linvit_jax.models import foreign
from linvit_jax.models import import_weights
from tests.helpers.subprocs import ROOT

FOREIGN = os.path.join(ROOT, "tests", "data", "foreign")
HEAVY = ("jax", "tensorflow", "flax", "orbax", "optax", "ml_dtypes")


def _one_error_line(err: str, *fragments: str) -> None:
  assert err.startswith("error: ") and err.count("\n") == 1, err
  for fragment in fragments:
    assert fragment in err, (fragment, err)


# ------------------------------------------------------------------------------------------------
# python -m linvit_jax.main


@pytest.mark.parametrize(
    "module,flag",
    [
        ("linvit_jax.main", "--help"),
        ("linvit_jax.main", "-h"),
        ("linvit_jax.main", "--helpshort"),
        ("linvit_jax.models.import_weights", "--help"),
        ("linvit_jax.data.sample_photos", "--help"),
    ],
    ids=["main--help", "main-h", "main--helpshort", "import_weights", "sample_photos"],
)
def test_help_prints_the_usage_exits_0_and_imports_nothing_heavy(module, flag):
  """main --help used to import TensorFlow first (4-8 s) and exit 1; import_weights --help took
  1 s (ml_dtypes). Now each answers at once: what a fresh interpreter imports is checked."""
  code = (
      "import atexit, runpy, sys\n"
      f"heavy = {HEAVY!r}\n"
      "atexit.register(lambda: print('HEAVY', [m for m in heavy if m in sys.modules]))\n"
      f"sys.argv = [{module!r}, {flag!r}]\n"
      f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)\n"
  )
  r = subprocess.run(
      [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
  )
  assert r.returncode == 0, r.stderr[-2000:]
  assert "usage" in r.stdout.lower() or "--workdir" in r.stdout, r.stdout
  assert r.stdout.rstrip().splitlines()[-1] == "HEAVY []", r.stdout[-500:]


@pytest.fixture
def cli_in_process(monkeypatch):
  """main.cli(command) on an argv, in this process: absl's app.run replaced by what it does here
  (parse the flags, call main) without its process-wide set-up; TensorFlow not imported. The
  parsed flags and absl's handler (main adds a filter and a stream) are restored afterwards."""
  monkeypatch.setattr(main_lib.quiet_tf, "import_quietly", lambda name: None)
  monkeypatch.setattr(
      main_lib.app, "run", lambda main, flags_parser: sys.exit(main(flags_parser(sys.argv)))
  )
  handler = main_lib.logging.get_absl_handler().python_handler
  filters, stream = list(handler.filters), handler.stream

  def cli(argv, command):
    monkeypatch.setattr(sys, "argv", ["linvit_jax.main", *argv])
    with pytest.raises(SystemExit) as exit_info:
      main_lib.cli(command=command)
    return exit_info.value.code

  yield cli
  handler.filters[:], handler.stream = filters, stream
  main_lib.FLAGS.unparse_flags()


@pytest.mark.parametrize(
    "extra", [["purple"], ["workdirs/other", "x.npz"]], ids=["one_word", "two_paths"]
)
def test_extra_positional_arguments_are_an_error_naming_them(
    extra, cli_in_process, capsys, tmp_path
):
  """absl leaves non-flags in argv; main used to drop them and start a whole run."""
  ran, workdir = [], tmp_path / "w"
  argv = ["--config", "configs/demo.py", "--workdir", str(workdir), *extra]
  assert cli_in_process(argv, lambda config, w: ran.append(w)) == 2
  _one_error_line(capsys.readouterr().err, "unexpected argument", *(repr(a) for a in extra))
  assert not ran and not workdir.exists()


def test_without_extra_arguments_the_command_runs(cli_in_process, tmp_path):
  """The control: the same command line without the stray words reaches the command."""
  ran, workdir = [], str(tmp_path / "w")
  argv = ["--config", "configs/demo.py", "--workdir", workdir]
  assert cli_in_process(argv, lambda config, w: ran.append(w)) is None
  assert ran == [workdir]


def _bar_and_log(route: bool) -> str:
  """stderr of a tqdm bar with a log line emitted in the middle of it."""
  err = io.StringIO()
  saved = sys.stderr
  sys.stderr = err  # tqdm and the routed stream both resolve sys.stderr when they write
  try:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("I %(message)s"))
    if route:
      main_lib.route_logs_around_bars(handler)
    logger = logging.getLogger("linvit_jax.test_bars")
    logger.propagate, logger.level = False, logging.INFO
    logger.addHandler(handler)
    try:
      bar = tqdm.tqdm(total=4, desc="distill", file=sys.stderr, mininterval=0)
      bar.update(2)
      logger.info("stage 'finetune': resuming from step 2 of 4")
      bar.update(2)
      bar.close()
    finally:
      logger.removeHandler(handler)
  finally:
    sys.stderr = saved
  return err.getvalue()


def test_log_lines_do_not_break_the_progress_bar():
  """A log line in the middle of a bar gets a line of its own (the bar is cleared and redrawn);
  without the routing it is glued onto the bar's line, which is the bug the control shows."""

  def log_segments(text):  # what each physical line shows last (after its last '\r')
    return [line.split("\r")[-1] for line in text.split("\n") if "resuming from step" in line]

  routed = _bar_and_log(route=True)
  assert log_segments(routed) == ["I stage 'finetune': resuming from step 2 of 4"], routed
  assert "4/4" in routed  # the bar was redrawn and finished
  glued = _bar_and_log(route=False)
  assert log_segments(glued) and "distill" in log_segments(glued)[0], glued


def test_own_info_lines_are_said_once_per_run():
  """Each stage opens its data again: the image-folder summary was logged once per stage."""
  own = os.path.join(ROOT, "linvit_jax", "data", "input_pipeline.py")
  other = os.path.join(ROOT, "site-packages", "orbax", "x.py")

  def record(level, path, msg, *args):
    return logging.LogRecord("absl", level, path, 1, msg, args, None)

  f = main_lib._OwnInfoOnly()
  summary = ("image_folder %s: %s; split %r: %d images", "/p", "21 images", "train", 17)
  assert f.filter(record(logging.INFO, own, *summary))
  assert not f.filter(record(logging.INFO, own, *summary))  # the second stage: not again
  assert f.filter(record(logging.INFO, own, "image_folder %s: split %r", "/p", "holdout"))
  assert not f.filter(record(logging.INFO, other, "orbax says"))  # libraries: WARNING up only
  warning = record(logging.WARNING, own, "image_folder /p: skipped 1 unreadable file(s)")
  assert f.filter(warning) and f.filter(warning)  # warnings are never held back


def test_run_ends_with_where_the_student_is_and_how_to_load_it(monkeypatch, capsys, tmp_path):
  from linvit_jax import run as run_lib

  results = {"config": {"student": {}}, "timing_s": {"total": 3.0}, "student_top1": 0.5}
  monkeypatch.setattr(run_lib, "run", lambda config, workdir: results)
  monkeypatch.chdir(tmp_path)
  main_lib.convert(mlc.ConfigDict({"seed": 0}), "w")
  out = capsys.readouterr().out.rstrip().splitlines()
  folder = str(tmp_path / "w")
  assert out[-3:] == [
      f"student exported to {folder}; load it in Python with:",
      "  import linvit_jax",
      f'  student = linvit_jax.load_student("{folder}")',
  ]
  assert summary.format_where_exported("gs://b/w").endswith('load_student("gs://b/w")')


# ------------------------------------------------------------------------------------------------
# summary.format_summary: the k-NN line of a run that did not measure it


def test_summary_says_why_knn_was_not_measured():
  why = "no labelled reference set; pass --config.eval.knn.dataset=... to measure it"
  results = {"config": {"student": {}}, "timing_s": {"total": 1.0}, "knn_skipped": why}
  lines = summary.format_summary(results).splitlines()
  assert f"k-NN: not measured — {why}" in lines
  assert not any("k-NN" in line for line in summary.format_summary(results | {"knn_skipped": ""}))


# ------------------------------------------------------------------------------------------------
# python -m linvit_jax.models.import_weights SRC OUT.npz


def _import(capsys, *argv):
  code = import_weights.main(list(argv))
  return code, capsys.readouterr()


@pytest.mark.parametrize("out", ["existing_file.txt/x.npz", "existing_file.txt/a/b/x.npz"])
def test_import_weights_output_under_a_file(out, capsys, tmp_path):
  (tmp_path / "existing_file.txt").write_text("not a folder")
  code, cap = _import(capsys, os.path.join(FOREIGN, "hf_dinov2"), str(tmp_path / out))
  assert code == 2
  _one_error_line(cap.err, "existing_file.txt' is a file, not a folder")
  assert sorted(os.listdir(tmp_path)) == ["existing_file.txt"]


def test_import_weights_output_that_is_a_folder(capsys, tmp_path):
  (tmp_path / "x.npz").mkdir()
  code, cap = _import(capsys, os.path.join(FOREIGN, "hf_dinov2"), str(tmp_path / "x.npz"))
  assert code == 2
  _one_error_line(cap.err, "is a folder")
  assert os.listdir(tmp_path / "x.npz") == []


@pytest.mark.parametrize(
    "heads,fragments",
    [("5", ["--num_heads 5 does not fit", "not a multiple of 5"]), ("0", ["positive integer"])],
    ids=["not_a_divisor", "zero"],
)
def test_import_weights_num_heads_that_cannot_split_the_width(heads, fragments, capsys, tmp_path):
  src = os.path.join(FOREIGN, "timm_vit", "model.safetensors")  # width 32
  out = tmp_path / "out" / "x.npz"
  code, cap = _import(capsys, src, str(out), "--num_heads", heads)
  assert code == 2
  _one_error_line(cap.err, *fragments)
  assert not (tmp_path / "out").exists() and not os.path.exists(foreign.sidecar_path(str(out)))


@pytest.mark.parametrize(
    "argv,fragment",
    [([], "required: src, out"), (["a", "b.npz", "--num_heads", "x"], "invalid int value: 'x'")],
    ids=["no_arguments", "num_heads_not_a_number"],
)
def test_import_weights_usage_errors_are_one_line(argv, fragment, capsys):
  with pytest.raises(SystemExit) as exit_info:
    import_weights.main(argv)
  assert exit_info.value.code == 2
  _one_error_line(capsys.readouterr().err, fragment)


# ------------------------------------------------------------------------------------------------
# python -m linvit_jax.data.sample_photos OUT_DIR [all|color|gray]


@pytest.mark.parametrize(
    "args,fragments",
    [
        (["photos", "purple"], ["'purple'", "all, color, gray"]),
        (["photos", "color", "extra"], ["unexpected argument(s) 'extra'"]),
        ([], ["expected OUT_DIR"]),
        (["existing_file.txt"], ["'existing_file.txt' is a file, not a folder"]),
        (["existing_file.txt/photos"], ["cannot write", "Not a directory"]),
    ],
    ids=["unknown_set", "extra_argument", "no_folder", "folder_is_a_file", "folder_under_a_file"],
)
def test_sample_photos_bad_arguments(args, fragments, capsys, monkeypatch, tmp_path):
  monkeypatch.chdir(tmp_path)
  (tmp_path / "existing_file.txt").write_text("not a folder")
  assert sample_photos.main(args) == 2
  cap = capsys.readouterr()
  _one_error_line(cap.err, *fragments)
  assert not cap.out and sorted(os.listdir(tmp_path)) == ["existing_file.txt"]
