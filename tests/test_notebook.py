"""The Colab notebook runs top to bottom on CPU in its small setting (nbclient, this interpreter).

The executed run takes a couple of CPU minutes; the structural checks are instant.
"""

import json
import os
import sys

import nbformat
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, "notebooks", "linvit_colab.ipynb")
SHIPPED_TEACHER = os.path.join(ROOT, "linvit_jax", "assets", "teacher_fmnist_vit.npz")
CELL_TIMEOUT_S = 600      # the slowest cell takes ~1 min of wall time on a loaded 2-core machine
KERNEL_STARTUP_S = 180
# Files the notebook writes into its workdir.
WORKDIR_FILES = ("student.npz", "student_config.json", "loss_curve.png", "fidelity.png",
                 "attention_maps_layer0.png", "attention_maps_layer3.png",
                 "throughput_vs_resolution.png", "distill_attention/metrics.jsonl")


def _read():
  return nbformat.read(NOTEBOOK, as_version=4)


def _parameters_cell(nb):
  cells = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
  assert len(cells) == 1, "exactly one cell must be tagged 'parameters'"
  return cells[0]


def test_notebook_is_stored_without_outputs():
  nb = _read()
  nbformat.validate(nb)
  for cell in nb.cells:
    if cell.cell_type == "code":
      assert cell.outputs == [] and cell.execution_count is None, (
          f"cell {cell.id} has outputs: clear them before committing (small diffs)")


def test_parameters_default_to_the_shipped_teacher(monkeypatch):
  monkeypatch.delenv("LINVIT_NOTEBOOK_TEACHER", raising=False)
  monkeypatch.delenv("LINVIT_NOTEBOOK_SMALL", raising=False)
  monkeypatch.setenv("LINVIT_NOTEBOOK_WORKDIR", "/nonexistent/unused")
  ns = {}
  exec(_parameters_cell(_read()).source, ns)  # plain assignments and imports only
  assert os.path.realpath(ns["TEACHER"]) == os.path.realpath(SHIPPED_TEACHER)
  assert ns["SMALL"] is False
  assert ns["FEATURE_MAP"] == "hedgehog" and ns["DISTILL_STEPS"] >= 100


def _stand_in_teacher(path):
  """A random softmax ViT with the demo teacher's architecture, for when the asset is absent."""
  import jax
  import numpy as np
  from linvit_jax import checkpoints
  from linvit_jax.models import vit
  model = vit.Model(num_classes=10, width=128, depth=4, mlp_dim=256, num_heads=4,
                    patch_size=(4, 4), posemb="learn", pool_type="tok", head_zeroinit=False)
  params = model.init(jax.random.PRNGKey(0), np.zeros((1, 28, 28, 1), np.float32))["params"]
  checkpoints.save_npz(path, jax.device_get(params))


def _kernel_manager(tmp_path):
  """A kernel manager for this interpreter. A private kernelspec with an absolute path: whatever
  'python3' kernelspecs the machine has (a user-level one may name another Python), the notebook
  runs where linvit_jax is installed."""
  from jupyter_client.kernelspec import KernelSpecManager
  from jupyter_client.manager import KernelManager
  kernels = tmp_path / "kernels"
  (kernels / "linvit-test").mkdir(parents=True)
  (kernels / "linvit-test" / "kernel.json").write_text(json.dumps({
      "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
      "display_name": "linvit_jax tests", "language": "python"}))
  return KernelManager(kernel_name="linvit-test",
                       kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(kernels)]))


def _text(cell):
  return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


def _images(cell):
  return sum("image/png" in o.get("data", {}) for o in cell.outputs
             if o.output_type in ("display_data", "execute_result"))


def test_notebook_executes_in_small_mode(tmp_path, monkeypatch):
  from nbclient import NotebookClient
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
  client = NotebookClient(nb, km=_kernel_manager(tmp_path), timeout=CELL_TIMEOUT_S,
                          startup_timeout=KERNEL_STARTUP_S,
                          resources={"metadata": {"path": str(tmp_path)}})
  try:
    client.execute()  # raises CellExecutionError (with the traceback) on the first failing cell
  finally:
    nbformat.write(nb, str(tmp_path / "executed.ipynb"))  # kept for a look after a failure

  code = [c for c in nb.cells if c.cell_type == "code"]
  assert all(c.execution_count for c in code), "every code cell ran"
  text = "\n".join(_text(c) for c in code)
  errors = [o for c in code for o in c.outputs if o.output_type == "error"]
  assert not errors, errors
  assert "jax " in text and "on [" in text                              # devices listed
  assert "copied " in text and " leaves (" in text                      # surgery report table
  assert "per-layer attention fidelity" in text
  for name in ("converted", "distill_attention"):                       # before / after columns
    assert name in text
  assert "tokens: teacher" in text                                      # throughput rows
  assert "reloaded: max |Δ logits|" in text
  assert sum(_images(c) for c in code) >= 5  # loss, fidelity, 2 attention maps, throughput
  for name in WORKDIR_FILES:
    assert (workdir / name).exists(), name

  from linvit_jax import checkpoints
  flat = checkpoints.flatten(checkpoints.load_npz(str(workdir / "student.npz")))
  assert any("feature_map_q" in k for k in flat)  # hedgehog's own params are exported
  with open(workdir / "student_config.json") as f:
    assert json.load(f)["attention"] == "hedgehog"
