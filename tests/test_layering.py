"""The arrows point down: linvit_jax's subpackages are floors, checked on the import statements
themselves, so a new import that climbs a floor fails here instead of growing a tower.

    studies                                   entry points over whole conversions
    root: main, api, run, build, preflight,   the driver and the entry points
          run_identity, report, compare
    artifacts                                 the exported student, its card, load_student
    conversion  evaluation                    siblings: neither imports the other
    configuration  models  data               the schema; the ViT and its checkpoints; inputs
    runtime                                   errors, files, trees, meshes, writers
"""

import ast
import glob
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "linvit_jax")


def _module(path: str) -> str:
  rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
  return rel[: -len(".__init__")] if rel.endswith(".__init__") else rel


def _graph_of(paths: list[str], known: set[str]) -> dict[str, set[str]]:
  return {_module(p): _imports(p, known) for p in paths}


def _imports(path: str, known: set[str]) -> set[str]:
  """Every linvit_jax module `path` imports, at module level or inside functions: `from P import
  m` counts as P.m when that is a module, else as P (m is a name in it)."""
  with open(path) as f:
    tree = ast.parse(f.read())
  out = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      out.update(a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      for a in node.names:
        sub = f"{node.module}.{a.name}"
        out.add(sub if sub in known else node.module)
  return {m for m in out if m.startswith("linvit_jax")}


_PATHS = glob.glob(os.path.join(PACKAGE, "**", "*.py"), recursive=True)
KNOWN = {_module(p) for p in _PATHS}
LIBRARY = _graph_of(_PATHS, KNOWN)


def _graph(pattern: str) -> dict[str, set[str]]:
  return _graph_of(glob.glob(os.path.join(ROOT, pattern), recursive=True), KNOWN)


def _uses(importer: str, imported: str) -> bool:
  return f"linvit_jax.{imported}" in LIBRARY[f"linvit_jax.{importer}"]


SUBPACKAGES = sorted(
    d for d in os.listdir(PACKAGE) if os.path.isfile(os.path.join(PACKAGE, d, "__init__.py"))
)
# What each subpackage may import besides itself (the root's modules are the driver: above all
# of these but studies).
FLOORS = {
    "runtime": set(),
    "models": {"runtime"},
    "data": {"runtime"},
    "configuration": {"runtime"},
    "conversion": {"runtime", "configuration", "models", "data"},
    "evaluation": {"runtime", "models", "data"},
    "artifacts": {"runtime", "models", "data", "evaluation"},
    "studies": {*SUBPACKAGES, "<root>"},
}


def _floor(module: str) -> str:
  """'linvit_jax.conversion.train' -> 'conversion'; a root module or the package -> '<root>'."""
  parts = module.split(".")
  return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in SUBPACKAGES) else "<root>"


def test_every_subpackage_has_a_floor_and_says_what_it_owns():
  assert set(SUBPACKAGES) == set(FLOORS)
  for name in SUBPACKAGES:
    with open(os.path.join(PACKAGE, name, "__init__.py")) as f:
      doc = ast.get_docstring(ast.parse(f.read()))
    assert doc and len(doc.split()) >= 30, f"linvit_jax/{name}/__init__.py: say what it owns"
    if name != "studies":
      assert "import" in doc, f"linvit_jax/{name}/__init__.py: say what it may import"


def test_subpackages_import_only_the_floors_below():
  bad = []
  for name, imports in LIBRARY.items():
    floor = _floor(name)
    if floor == "<root>":
      continue
    allowed = FLOORS[floor] | {floor}
    bad += [
        f"{name} -> {m}" for m in sorted(imports) if m != "linvit_jax" and _floor(m) not in allowed
    ]
    if floor != "studies":  # `import linvit_jax` is the public API: the entry points' floor
      bad += [f"{name} -> linvit_jax" for m in imports if m == "linvit_jax"]
  assert not bad, "\n".join(bad)


def test_the_driver_imports_no_study():
  for name, imports in LIBRARY.items():
    if _floor(name) == "<root>":
      assert not [m for m in imports if _floor(m) == "studies"], name


def test_the_package_root_is_small():
  root = [p for p in os.listdir(PACKAGE) if p.endswith(".py")]
  assert len(root) <= 10, sorted(root)


@pytest.mark.parametrize(
    "importer, imported",
    [
        ("conversion.stages", "evaluation.evaluate"),  # losses and evaluation are siblings ...
        ("evaluation.evaluate", "conversion.distill"),
        ("conversion.distill", "evaluation.evaluate"),
        ("models.probe", "conversion.distill"),  # ... over the probe both read layers through
        ("models.probe", "evaluation.evaluate"),
        ("evaluation.evaluate", "conversion.stages"),
        ("conversion.train", "run"),
        ("evaluation.feature_cache", "evaluation.evaluate"),  # it keys arrays; knows no model
        ("evaluation.feature_cache", "report"),
        ("evaluation.photo_eval", "report"),  # the test-photo evaluation: a report reads it
        ("evaluation.photo_eval", "conversion.train"),
        ("evaluation.evaluate", "evaluation.results"),  # evaluators return values; the driver
        ("evaluation.photo_eval", "evaluation.results"),  # files them in the record
        ("conversion.calibrate", "conversion.distill"),  # an initialisation: reads the probe,
        ("conversion.calibrate", "conversion.stages"),  # and the driver calls it, not a stage
        ("conversion.calibrate", "conversion.train"),
        ("conversion.distill", "conversion.calibrate"),  # the losses know no initialisation
    ],
)
def test_siblings_do_not_import_each_other(importer, imported):
  assert not _uses(importer, imported)


def test_models_know_no_trainer_and_no_data():
  upper = ("conversion", "evaluation", "artifacts", "data", "configuration")
  for name, imports in LIBRARY.items():
    if name.startswith("linvit_jax.models."):
      bad = sorted(m for m in imports if _floor(m) in upper or _floor(m) == "<root>")
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
  above = ("configuration", "build", "artifacts", "run", "report")
  for name, imports in LIBRARY.items():
    if name.startswith(("linvit_jax.models.", "linvit_jax.data.")):
      bad = _names(imports, above)
      assert not bad, f"{name} imports {bad}"


def test_the_build_layer_imports_no_driver():
  """The driver, the report, the export and the entry points build through build.py, not back."""
  drivers = ("run", "report", "main", "api", "studies", "preflight", "compare")
  # of the export, build.py may import export_format only (an exported student's attention)
  artifacts = [m for m in LIBRARY["linvit_jax.build"] if _floor(m) == "artifacts"]
  assert artifacts == ["linvit_jax.artifacts.export_format"], artifacts
  assert not _names(LIBRARY["linvit_jax.build"], drivers)


def test_only_the_entry_points_import_the_driver():
  entry = {"linvit_jax.run", "linvit_jax.main", "linvit_jax.api", "linvit_jax.studies.ablation"}
  for name, imports in {**LIBRARY, **_graph("bench/*.py")}.items():
    if name not in entry:
      assert "linvit_jax.run" not in imports, f"{name} imports the driver"


def test_config_files_are_data():
  for name, imports in _graph("configs/*.py").items():
    # config helpers only; no checkpoint, model or driver code
    assert all(m.startswith("linvit_jax.configuration.") for m in imports), name


def test_the_results_record_is_a_floor_below_its_readers():
  """results.py (the run's record and its JSON layout) imports no library module but the file
  helper; the driver fills it and the summary, the export and the ablation read it."""
  assert LIBRARY["linvit_jax.evaluation.results"] <= {"linvit_jax.runtime.gfile"}
  for reader in ("run", "report", "artifacts.export_folder", "studies.ablation"):
    assert _uses(reader, "evaluation.results"), reader


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
    if rel == "linvit_jax/evaluation/results.py":
      continue
    with open(path) as f:
      tree = ast.parse(f.read())
    for node in ast.walk(tree):  # string constants, f-strings' literal parts included
      if isinstance(node, ast.Constant) and isinstance(node.value, str):
        if node.value.startswith(RESULTS_KEYS):
          bad.append(f"{rel}:{node.lineno}: {node.value[:40]!r}")
  assert not bad, "read these through linvit_jax.evaluation.results:\n" + "\n".join(bad)


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
