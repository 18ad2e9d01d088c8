"""The Colab notebook: stored with the outputs of its code, installs what each runtime needs, and
runs top to bottom on CPU in its small setting (nbclient, this interpreter) against a non-editable
install of the package in a folder of its own, as on Colab (no tests/ or checkout beside it).

The executed run takes a couple of CPU minutes; the other checks are instant (the install cell's
functions run with a recording stand-in for pip and git, on fake /dev trees and checkouts).
"""

import importlib.util
import json
import os
import re
import sys
import tempfile

import nbformat
import pytest

from tests.helpers import pip_target

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, "notebooks", "linvit_colab.ipynb")
SHIPPED_TEACHER = os.path.join(ROOT, "linvit_jax", "assets", "teacher_fmnist_vit.npz")
CELL_TIMEOUT_S = 600  # the slowest cell takes ~1 min of wall time on a loaded 2-core machine
# The script that runs the notebook and stores it with its outputs (notebooks/ is no package).
_SPEC = importlib.util.spec_from_file_location(
    "run_and_save", os.path.join(ROOT, "notebooks", "run_and_save.py")
)
run_and_save = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(run_and_save)
# Files the notebook writes into its workdir.
WORKDIR_FILES = (
    "student.npz",
    "student_config.json",
    "loss_curve.png",
    "fidelity.png",
    "attention_maps_layer0.png",
    "attention_maps_layer3.png",
    "throughput_vs_resolution.png",
    "distill_attention/metrics.jsonl",
)


def _read():
  return nbformat.read(NOTEBOOK, as_version=4)


def _parameters_cell(nb):
  cells = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
  assert len(cells) == 1, "exactly one cell must be tagged 'parameters'"
  return cells[0]


def test_stored_notebook_has_the_outputs_of_its_code():
  """A reader sees tables and plots without running it: outputs of a run of exactly this code."""
  nb = _read()
  nbformat.validate(nb)
  assert os.path.getsize(NOTEBOOK) < 2 * 2**20, "outputs too large: smaller figures or fewer"
  stored = nb.metadata.get(run_and_save.METADATA_KEY, {})
  assert stored.get("code_sha256") == run_and_save.code_sha256(
      nb
  ), "the code cells changed since the stored run: python notebooks/run_and_save.py"
  code = [c for c in nb.cells if c.cell_type == "code"]
  assert [c.execution_count for c in code] == list(range(1, len(code) + 1)), "run top to bottom"
  parameters = _parameters_cell(nb)
  for cell in code:
    if cell is not parameters:  # plain assignments: the one cell that shows nothing
      assert cell.outputs, f"cell {cell.id} has no stored outputs"
    assert not [o for o in cell.outputs if o.output_type == "error"], cell.id
  assert sum(_images(c) for c in code) >= 5  # loss, fidelity, 2 attention maps, throughput
  # Paths of the machine that ran it would only confuse a reader (run_and_save writes <repo> etc.).
  text = json.dumps(
      [
          o
          for c in code
          for o in c.outputs
          if o.output_type != "display_data" or "image/png" not in o.get("data", {})
      ]
  )
  machine = {
      ROOT,
      os.path.realpath(ROOT),
      sys.prefix,
      tempfile.gettempdir() + "/",
      "pytest-of-",
      "linvit_run_and_save_",
  }
  home = os.path.expanduser("~")
  if home not in ("", "/"):
    machine.add(home + "/")
  assert not [p for p in machine if p in text], [p for p in machine if p in text]


def test_stored_notebook_keeps_colab_settings():
  nb = _read()
  assert nb.metadata.kernelspec.name == "python3"  # not the private kernel the runs use
  assert nb.metadata.get("accelerator") == "TPU"


def _install_cell(nb=None):
  cells = [c for c in (nb or _read()).cells if c.cell_type == "code" and "REPO_URL" in c.source]
  assert len(cells) == 1, "exactly one install cell (the one that reads REPO_URL)"
  return cells[0]


def _install_helpers(monkeypatch, repo_url_env=None):
  """The install cell's functions, defined but not run (its `__main__` block installs)."""
  if repo_url_env is None:
    monkeypatch.delenv("LINVIT_REPO_URL", raising=False)
  else:
    monkeypatch.setenv("LINVIT_REPO_URL", repo_url_env)
  ns = {"__name__": "install_cell"}
  exec(_install_cell().source, ns)
  return ns


def _badge_repository():
  """owner/name of the repository the README's "Open in Colab" badge opens the notebook from."""
  with open(os.path.join(ROOT, "README.md")) as f:
    repos = set(
        re.findall(
            r"\(https://colab\.research\.google\.com/github/([^/\s)]+/[^/\s)]+)/blob/[^/\s)]+/"
            r"notebooks/linvit_colab\.ipynb\)",
            f.read(),
        )
    )
  assert len(repos) == 1, f"README: one repository in its 'Open in Colab' links, not {repos}"
  return repos.pop()


def test_repo_url_is_one_setting_without_placeholder(monkeypatch):
  """A fresh Colab session opened from the badge installs with no setting: REPO_URL defaults to
  the badge's repository (a fork changes both), $LINVIT_REPO_URL overrides it."""
  cell = _install_cell()
  settings = [line for line in cell.source.splitlines() if line.startswith("REPO_URL = ")]
  setting = re.fullmatch(r'REPO_URL = "([^"]*)"  # @param \{type:"string"\}', settings[0])
  assert setting, f"Colab's form shows it: {settings[0]}"
  assert cell.source.index(settings[0]) < cell.source.index("\nimport "), "the cell's first line"
  default = setting.group(1)
  github = re.fullmatch(r"https://github\.com/([^/]+/[^/]+?)(?:\.git)?", default)
  assert github, f"REPO_URL {default!r}: a GitHub repository's git URL"
  assert github.group(1) == _badge_repository(), "REPO_URL: the repository the badge opens"
  assert "fork" in cell.source, "the cell says that a fork changes REPO_URL"
  assert _install_helpers(monkeypatch)["REPO_URL"] == default
  url = "https://example.org/me/linvit_jax.git"
  assert _install_helpers(monkeypatch, repo_url_env=url)["REPO_URL"] == url


@pytest.mark.parametrize(
    "devices, env, expected",
    [
        (["vfio/0", "vfio/vfio"], {}, "tpu"),  # TPU VM, v5e and later
        (["accel0", "accel1"], {}, "tpu"),  # TPU VM, v2-v4
        ([], {"TPU_ACCELERATOR_TYPE": "v5litepod-1"}, "tpu"),
        ([], {"COLAB_TPU_ADDR": "10.0.0.2:8470"}, "tpu"),  # the old TPU node
        (["vfio/vfio"], {}, "cpu"),  # the VFIO control device alone is no TPU
        (["nvidia0", "nvidiactl"], {}, "gpu"),
        ([], {}, "cpu"),
    ],
)
def test_detect_accelerator(tmp_path, monkeypatch, devices, env, expected):
  ns = _install_helpers(monkeypatch)
  for name in devices:
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).touch()
  assert ns["detect_accelerator"](environ=env, dev=str(tmp_path)) == expected


def _fake_checkout(path):
  """A directory that looks like a checkout: this repository's setup.py, an empty package."""
  (path / "linvit_jax").mkdir(parents=True)
  (path / "linvit_jax" / "__init__.py").touch()
  (path / "setup.py").write_text(open(os.path.join(ROOT, "setup.py")).read())
  return path


def _install(ns, tmp_path, accelerator, have, repo_url="", start=None, candidates=()):
  """Runs the install cell's install step with a recording `run`: no git, no pip."""
  commands = []

  def run(cmd):
    commands.append(list(cmd))
    if cmd[:2] == ["git", "clone"]:
      _fake_checkout(tmp_path / "clone")

  start = start or tmp_path / "elsewhere"
  os.makedirs(start, exist_ok=True)
  source = ns["install_linvit_jax"](
      repo_url,
      accelerator,
      start=str(start),
      have=have,
      run=run,
      candidates=candidates,
      clone_dir=str(tmp_path / "clone"),
  )
  return source, commands


def _pip_requirements(commands):
  pip = [c for c in commands if c[1:4] == ["-m", "pip", "install"] and "--no-deps" not in c]
  assert len(pip) == 1, commands
  return pip[0][5:]


def _jax_requirement(ns):
  """setup.py's jax requirement, e.g. 'jax>=0.10,<0.11'."""
  return next(r for r in ns["read_requirements"](ROOT) if re.match(r"jax\b(?!-)", r))


def test_tpu_runtime_gets_jax_tpu_and_keeps_colab_tensorflow(tmp_path, monkeypatch):
  ns = _install_helpers(monkeypatch)
  jax_requirement = _jax_requirement(ns)
  colab = lambda name: name == "tensorflow"  # Colab: tensorflow preinstalled, no linvit_jax
  source, commands = _install(ns, tmp_path, "tpu", colab, repo_url="https://example.org/x.git")
  assert commands[0] == [
      "git",
      "clone",
      "--depth",
      "1",
      "https://example.org/x.git",
      str(tmp_path / "clone"),
  ]
  requirements = _pip_requirements(commands)
  assert "jax[tpu]" + jax_requirement[len("jax") :] in requirements  # setup.py's range
  assert jax_requirement not in requirements
  assert not [r for r in requirements if r.startswith("tensorflow-cpu")]
  assert "tensorflow-datasets" in " ".join(requirements)
  assert commands[-1][-2:] == ["--no-deps", str(tmp_path / "clone")]
  assert source == str(tmp_path / "clone")


def test_cpu_runtime_without_tensorflow_gets_setup_requirements(tmp_path, monkeypatch):
  ns = _install_helpers(monkeypatch)
  _, commands = _install(ns, tmp_path, "cpu", lambda name: False, repo_url="https://e.org/x")
  assert _pip_requirements(commands) == ns["read_requirements"](ROOT)  # tensorflow-cpu included


def test_gpu_runtime_gets_jax_cuda(tmp_path, monkeypatch):
  ns = _install_helpers(monkeypatch)
  checkout = _fake_checkout(tmp_path / "checkout")
  _, commands = _install(ns, tmp_path, "gpu", lambda name: False, start=checkout)
  assert "jax[cuda12]" + _jax_requirement(ns)[len("jax") :] in _pip_requirements(commands)


def test_local_checkout_is_installed_from(tmp_path, monkeypatch):
  ns = _install_helpers(monkeypatch)
  checkout = _fake_checkout(tmp_path / "linvit_jax")
  (checkout / "notebooks").mkdir()
  source, commands = _install(
      ns, tmp_path, "cpu", lambda name: False, start=checkout / "notebooks"
  )  # Jupyter started in notebooks/
  assert source == str(checkout) and commands[-1][-2:] == ["--no-deps", str(checkout)]
  assert not [c for c in commands if c[0] == "git"]
  drive = _fake_checkout(tmp_path / "drive" / "MyDrive" / "linvit_jax")  # a Colab location
  source, commands = _install(
      ns, tmp_path, "cpu", lambda name: False, repo_url="https://e.org/x", candidates=(str(drive),)
  )
  assert source == str(drive) and not [c for c in commands if c[0] == "git"]


def test_installed_package_installs_nothing(tmp_path, monkeypatch):
  ns = _install_helpers(monkeypatch)
  source, commands = _install(ns, tmp_path, "tpu", lambda name: True, repo_url="https://e.org/x")
  assert source is None and commands == []


def test_nothing_to_install_from_is_one_clear_line(tmp_path, monkeypatch):
  ns = _install_helpers(monkeypatch)
  with pytest.raises(ns["InstallError"]) as error:
    _install(ns, tmp_path, "cpu", lambda name: False)
  assert "set REPO_URL" in str(error.value)
  lines = error.value._render_traceback_()  # what IPython shows instead of a traceback
  assert len(lines) == 1 and "\n" not in lines[0]


def test_checkout_root_seen_from_its_parent_is_not_an_installed_package(tmp_path, monkeypatch):
  """Seen from /content on Colab, the checkout /content/linvit_jax is an empty namespace package."""
  importable = _install_helpers(monkeypatch)["importable"]
  (tmp_path / "linvit_nb_probe").mkdir()
  monkeypatch.syspath_prepend(str(tmp_path))
  assert not importable("linvit_nb_probe")
  (tmp_path / "linvit_nb_probe" / "__init__.py").touch()
  import importlib

  importlib.invalidate_caches()
  assert importable("linvit_nb_probe")


def test_after_install_checks(monkeypatch):
  ns = _install_helpers(monkeypatch)
  assert "Restart session" in ns["platform_warning"]("tpu", "cpu")
  assert ns["platform_warning"]("tpu", "tpu") is None
  assert ns["platform_warning"]("cpu", "cpu") is None
  assert ns["stale_modules"](
      {"jax": "0.5.0"}, {"jax": "0.10.2", "numpy": "2.1.0"}, loaded=["jax", "os"]
  ) == ["jax"]


def test_readme_links_the_notebook_on_colab():
  with open(os.path.join(ROOT, "README.md")) as f:
    links = re.findall(r"\((https://colab\.research\.google\.com/[^)\s]*)\)", f.read())
  links = [u for u in links if u.endswith("/notebooks/linvit_colab.ipynb")]
  assert links, "README: an 'Open in Colab' link to notebooks/linvit_colab.ipynb"
  assert not [u for u in links if re.search(r"[<>]|OWNER", u)], f"placeholder in {links}"


def test_parameters_default_to_the_shipped_teacher(monkeypatch):
  monkeypatch.delenv("LINVIT_NOTEBOOK_TEACHER", raising=False)
  monkeypatch.delenv("LINVIT_NOTEBOOK_SMALL", raising=False)
  monkeypatch.setenv("LINVIT_NOTEBOOK_WORKDIR", "/nonexistent/unused")
  ns = {}
  exec(_parameters_cell(_read()).source, ns)  # plain assignments and imports only
  assert os.path.realpath(ns["TEACHER"]) == os.path.realpath(SHIPPED_TEACHER)
  assert ns["SMALL"] is False
  assert ns["FEATURE_MAP"] == "hedgehog" and ns["DISTILL_STEPS"] >= 100


def test_workdir_is_a_parameter(tmp_path, monkeypatch):
  """WORKDIR is a field of Colab's form: a Google Drive folder there survives a disconnect. Empty,
  it is a new temporary folder; $LINVIT_NOTEBOOK_WORKDIR overrides it (the tests' hook)."""
  monkeypatch.delenv("LINVIT_NOTEBOOK_WORKDIR", raising=False)
  monkeypatch.delenv("LINVIT_NOTEBOOK_TEACHER", raising=False)
  monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where mkdtemp makes the default
  nb = _read()
  parameters = _parameters_cell(nb)
  settings = [line for line in parameters.source.splitlines() if line.startswith("WORKDIR = ")]
  assert settings[0] == 'WORKDIR = ""  # @param {type:"string"}', "Colab's form shows it"

  def workdir(source):
    ns = {}
    exec(source, ns)  # plain assignments and imports only
    return ns["WORKDIR"]

  default = workdir(parameters.source)
  assert os.path.dirname(default) == str(tmp_path) and os.path.isdir(default), default
  drive = "/content/drive/MyDrive/linvit_jax/workdir"
  assert workdir(parameters.source.replace('WORKDIR = ""', f'WORKDIR = "{drive}"', 1)) == drive
  monkeypatch.setenv("LINVIT_NOTEBOOK_WORKDIR", str(tmp_path / "env"))
  assert workdir(parameters.source) == str(tmp_path / "env")
  # The markdown before the parameters says how a Drive folder is mounted, and that a rerun resumes.
  markdown = nb.cells[nb.cells.index(parameters) - 1]
  assert markdown.cell_type == "markdown" and "`WORKDIR`" in markdown.source
  assert "drive.mount('/content/drive')" in markdown.source and drive in markdown.source
  assert "resumes" in markdown.source


def _stand_in_teacher(path):
  """A random softmax ViT with the demo teacher's architecture (configs/demo.py's model block; a
  random head, not zeros), for when the asset is absent."""
  import jax
  import numpy as np

  import configs.demo as demo
  from linvit_jax import build
  from linvit_jax.models import checkpoints
  from linvit_jax.models import vit

  model = vit.Model(**{**build.model_kwargs(demo.get_config().model), "head_zeroinit": False})
  params = model.init(jax.random.PRNGKey(0), np.zeros((1, 28, 28, 1), np.float32))["params"]
  checkpoints.save_npz(path, jax.device_get(params))


def _text(cell):
  return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


def _images(cell):
  return sum(
      "image/png" in o.get("data", {})
      for o in cell.outputs
      if o.output_type in ("display_data", "execute_result")
  )


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
  """linvit_jax installed from a copy of the checkout as the notebook's install cell installs it
  (`pip install --no-deps <checkout>`, not editable), into a folder of its own: the site a Colab
  user gets, with no tests/ beside it. Returns that folder (put first on PYTHONPATH)."""
  site = pip_target.install(tmp_path_factory.mktemp("installed"))
  assert not (site / "linvit_jax" / "__init__.py").is_symlink()
  return site


def _files_the_notebook_reads_from_the_package(nb):
  """Every `os.path.join(os.path.dirname(linvit_jax.__file__), ...)` of the code cells, as the
  path relative to the package."""
  pattern = (
      r"os\.path\.join\(\s*os\.path\.dirname\(linvit_jax\.__file__\),\s*((?:\"[^\"]+\",?\s*)+)\)"
  )
  found = []
  for cell in nb.cells:
    if cell.cell_type == "code":
      for parts in re.findall(pattern, cell.source):
        found.append(os.path.join(*re.findall(r'"([^"]+)"', parts)))
  return found


def test_notebook_reads_only_what_a_pip_install_ships(installed):
  """Colab runs the notebook from a pip install: no path into the checkout (tests/, the repo
  root), and every file it reads beside the package is package data."""
  nb = _read()
  for cell in nb.cells:
    if cell.cell_type == "code":
      assert '"tests"' not in cell.source and "dirname(os.path.dirname(linvit_jax" not in (
          cell.source
      ), cell.id
  files = _files_the_notebook_reads_from_the_package(nb)
  assert os.path.join("assets", "teacher_fmnist_vit.npz") in files
  assert os.path.join("assets", "tiny_dinov2_registers") in files
  for relative in files:
    assert (installed / "linvit_jax" / relative).exists(), relative
  for name in ("config.json", "model.safetensors", "preprocessor_config.json"):
    assert (installed / "linvit_jax" / "assets" / "tiny_dinov2_registers" / name).is_file()
  shipped = sum(f.stat().st_size for f in (installed / "linvit_jax" / "assets").rglob("*"))
  assert shipped < 6 * 2**20, f"package data {shipped / 2**20:.1f} MiB: keep the wheel small"


def test_notebook_executes_in_small_mode(tmp_path, monkeypatch, installed):
  """Top to bottom against the installed package (not this checkout), as on Colab."""
  paths = [str(installed)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
  monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))  # the kernel inherits it
  workdir = tmp_path / "workdir"
  monkeypatch.setenv("LINVIT_NOTEBOOK_SMALL", "1")
  monkeypatch.setenv("LINVIT_NOTEBOOK_WORKDIR", str(workdir))
  if os.path.exists(SHIPPED_TEACHER):
    monkeypatch.delenv("LINVIT_NOTEBOOK_TEACHER", raising=False)
  else:
    teacher = str(tmp_path / "stand_in_teacher.npz")
    _stand_in_teacher(teacher)
    monkeypatch.setenv("LINVIT_NOTEBOOK_TEACHER", teacher)

  nb = _read()
  try:  # raises CellExecutionError (with the traceback) on the first failing cell
    run_and_save.execute(
        nb, cwd=str(tmp_path), kernel_dir=str(tmp_path / "kernels"), timeout=CELL_TIMEOUT_S
    )
  finally:
    nbformat.write(nb, str(tmp_path / "executed.ipynb"))  # kept for a look after a failure

  code = [c for c in nb.cells if c.cell_type == "code"]
  assert all(c.execution_count for c in code), "every code cell ran"
  text = "\n".join(_text(c) for c in code)
  errors = [o for c in code for o in c.outputs if o.output_type == "error"]
  assert not errors, errors
  assert "jax " in text and "on [" in text  # devices listed
  install = _text(_install_cell(nb))
  assert "linvit_jax at " in install and "$ " not in install  # installed nothing
  assert f"linvit_jax at {installed / 'linvit_jax'}" in install  # the pip install, not the checkout
  assert "copied " in text and " leaves (" in text  # surgery report table
  assert "per-layer attention fidelity" in text
  for name in ("converted", "distill_attention"):  # before / after columns
    assert name in text
  assert "tokens: teacher" in text  # throughput rows
  assert "reloaded: max |Δ logits|" in text
  assert sum(_images(c) for c in code) >= 5  # loss, fidelity, 2 attention maps, throughput
  for name in WORKDIR_FILES:
    assert (workdir / name).exists(), name

  from linvit_jax.models import checkpoints

  flat = checkpoints.flatten(checkpoints.load_npz(str(workdir / "student.npz")))
  assert any("feature_map_q" in k for k in flat)  # hedgehog's own params are exported
  with open(workdir / "student_config.json") as f:
    assert json.load(f)["model"]["attention"] == "hedgehog"
