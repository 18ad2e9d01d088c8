"""The arrows point down (shared/DESIGN.md): checked on the import statements themselves, so a new
import that climbs a floor fails here instead of growing a tower."""

import ast
import glob
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _module(path: str) -> str:
  rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
  return rel[: -len(".__init__")] if rel.endswith(".__init__") else rel


def _imports(path: str) -> set[str]:
  """Every linvit_jax module `path` imports, at module level or inside functions."""
  with open(path) as f:
    tree = ast.parse(f.read())
  out = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      out.update(a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      out.add(node.module)
      out.update(f"{node.module}.{a.name}" for a in node.names)
  return {m for m in out if m.startswith("linvit_jax")}


def _graph(pattern: str) -> dict[str, set[str]]:
  paths = glob.glob(os.path.join(ROOT, pattern), recursive=True)
  return {_module(p): _imports(p) for p in paths}


LIBRARY = _graph("linvit_jax/**/*.py")
KNOWN = set(LIBRARY)


def _uses(importer: str, imported: str) -> bool:
  return f"linvit_jax.{imported}" in LIBRARY[f"linvit_jax.{importer}"]


@pytest.mark.parametrize(
    "importer, imported",
    [
        ("stages", "evaluate"),  # losses and evaluation are siblings ...
        ("evaluate", "distill"),
        ("distill", "evaluate"),
        ("probe", "distill"),  # ... over the probe both read layers through
        ("probe", "evaluate"),
        ("evaluate", "stages"),
        ("train", "run"),
        ("feature_cache", "evaluate"),  # the cache keys arrays; it knows no model and no reader
        ("feature_cache", "report"),
        ("photo_eval", "report"),  # the test-photo evaluation: a report reads it, not back
        ("photo_eval", "train"),
        ("evaluate", "results"),  # evaluators return values; the driver files them in the record
        ("photo_eval", "results"),
        ("calibrate", "distill"),  # an initialisation: it reads layers through the probe, ...
        ("calibrate", "evaluate"),
        ("calibrate", "stages"),  # ... and the driver calls it, not a stage or the runner
        ("calibrate", "train"),
        ("distill", "calibrate"),  # the losses know no initialisation
    ],
)
def test_siblings_do_not_import_each_other(importer, imported):
  assert not _uses(importer, imported)


def test_models_know_no_trainer_and_no_data():
  upper = ("train", "stages", "run", "distill", "evaluate", "report", "preflight", "data", "probe")
  for name, imports in LIBRARY.items():
    if name.startswith("linvit_jax.models."):
      bad = sorted(m for m in imports if any(m.startswith(f"linvit_jax.{u}") for u in upper))
      assert not bad, f"{name} imports {bad}"


def _names(imports: set[str], modules: tuple[str, ...]) -> list[str]:
  """The imports that are one of `modules` (`linvit_jax.` names) or inside one."""
  return sorted(
      m
      for m in imports
      if any(m == f"linvit_jax.{u}" or m.startswith(f"linvit_jax.{u}.") for u in modules)
  )


def test_models_and_data_take_plain_arguments():
  """The build layer reads the config into models/ and data/ (big_vision: `Model(**config.model)`
  and the input pipeline handed `config.input`): below it nothing knows the config's schema, the
  build layer, the export or the driver."""
  above = ("config_lib", "build", "export", "run", "report")
  for name, imports in LIBRARY.items():
    if name.startswith(("linvit_jax.models.", "linvit_jax.data.")):
      bad = _names(imports, above)
      assert not bad, f"{name} imports {bad}"


def test_the_build_layer_imports_no_driver():
  """The driver, the report, the export and the entry points build through build.py, not back."""
  drivers = ("run", "report", "export", "main", "api", "ablation", "preflight")
  assert not _names(LIBRARY["linvit_jax.build"], drivers)


def test_only_the_entry_points_import_the_driver():
  entry = {"linvit_jax.run", "linvit_jax.main", "linvit_jax.api", "linvit_jax.ablation"}
  for name, imports in {**LIBRARY, **_graph("bench/*.py")}.items():
    if name not in entry:
      assert "linvit_jax.run" not in imports, f"{name} imports the driver"


def test_config_files_are_data():
  for name, imports in _graph("configs/*.py").items():
    # config helpers only; no checkpoint, model or driver code
    assert imports <= {"linvit_jax", "linvit_jax.config_lib"}, name


def test_the_results_record_is_a_floor_below_its_readers():
  """results.py (the run's record and its JSON layout) imports no library module but the file
  helper; the driver fills it and the summary, the export and the ablation read it."""
  assert LIBRARY["linvit_jax.results"] <= {"linvit_jax", "linvit_jax.gfile"}
  for reader in ("run", "report", "export", "ablation"):
    assert _uses(reader, "results"), reader


# The per-stage keys of results.json, spelled in results.py only: readers use the record's
# accessors (after(stage), fidelity(stage), final(), top1_before_finetune).
RESULTS_KEYS = (
    "fidelity_after_",
    "fidelity_hybrid_after_",
    "fidelity_converted",
    "end_to_end_after_",
    "end_to_end_hybrid_after_",
    "end_to_end_converted",
    "student_top1_after_",
    "student_top1_converted",
    "student_top1_before_finetune",
)


def test_no_reader_builds_a_results_key():
  paths = [os.path.join(ROOT, "linvit_jax", "**", "*.py")] + [
      os.path.join(ROOT, d, "*.py") for d in ("bench", "tools")
  ]
  bad = []
  for path in sorted(p for pattern in paths for p in glob.glob(pattern, recursive=True)):
    rel = os.path.relpath(path, ROOT).replace(os.sep, "/")
    if rel == "linvit_jax/results.py":
      continue
    with open(path) as f:
      tree = ast.parse(f.read())
    for node in ast.walk(tree):  # string constants, f-strings' literal parts included
      if isinstance(node, ast.Constant) and isinstance(node.value, str):
        if node.value.startswith(RESULTS_KEYS):
          bad.append(f"{rel}:{node.lineno}: {node.value[:40]!r}")
  assert not bad, "read these through linvit_jax.results:\n" + "\n".join(bad)


def test_bench_times_the_library_and_runs_no_whole_conversion():
  """A whole conversion (linvit_jax.convert, the driver) is a tool (tools/), not a benchmark."""
  for name, imports in _graph("bench/*.py").items():
    assert not imports & {"linvit_jax.api", "linvit_jax.run", "linvit_jax.main"}, name
  for path in glob.glob(os.path.join(ROOT, "bench", "*.py")):
    with open(path) as f:
      tree = ast.parse(f.read())
    for node in ast.walk(tree):
      if isinstance(node, ast.Attribute) and node.attr == "convert":
        value = node.value
        assert not (isinstance(value, ast.Name) and value.id == "linvit_jax"), path
