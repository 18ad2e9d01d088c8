"""Runs other than the full recipe: convert only, evaluate (or continue) an exported student, a
student that keeps some params fresh, no npz export, and every sequence field set from the CLI."""

import glob
import os
import sys

import numpy as np
import pytest
from absl import flags
from ml_collections import config_flags

from linvit_jax import preflight
from linvit_jax import run as run_lib
from linvit_jax.configuration import config_lib
from linvit_jax.evaluation import summary
from linvit_jax.models import checkpoints
from linvit_jax.runtime.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = sorted(glob.glob(os.path.join(ROOT, "configs", "*.py")))


def _tiny(**over):
  import configs.demo

  c = configs.demo.get_config("tiny=True")
  c.eval.plots = False
  c.eval.resolution_factors = ()
  for k, v in over.items():
    node = c
    *parents, leaf = k.split(".")
    for p in parents:
      node = node[p]
    node[leaf] = v
  return c


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
  """`stages=()`: surgery + calibration, evaluated and exported, no training."""
  workdir = str(tmp_path_factory.mktemp("convert_only"))
  return workdir, run_lib.run(_tiny(stages=()), workdir)


def test_convert_only_exports_the_converted_student(converted):
  workdir, results = converted
  assert results.histories == {} and results.images_seen == 0 and results.stages == []
  assert results.student_top1 == results.converted.top1
  with open(os.path.join(workdir, "results.json")) as f:  # the record, as results.json
    assert f.read() == results.dumps()
  for name in ("student.npz", "student_config.json", "surgery_report.json", "results.json"):
    assert os.path.exists(os.path.join(workdir, name)), name
  assert not any(os.path.isdir(os.path.join(workdir, d)) for d in ("distill_attention", "finetune"))


def test_evaluate_only_reproduces_the_exported_student(converted, tmp_path):
  workdir, results = converted
  again = run_lib.run(
      _tiny(stages=(), **{"student.init": os.path.join(workdir, "student.npz")}), str(tmp_path)
  )
  assert again.student_top1 == results.student_top1
  np.testing.assert_allclose(again.student_logits_sample, results.student_logits_sample, atol=1e-6)
  assert not os.path.exists(tmp_path / "surgery_report.json")  # loaded, not converted
  assert "student as loaded" in summary.format_summary(again)


def test_student_init_for_another_model_is_refused(converted, tmp_path):
  workdir, _ = converted
  config = _tiny(
      stages=(), **{"student.init": os.path.join(workdir, "student.npz"), "model.mlp_dim": 64}
  )
  with pytest.raises(ConfigError, match=r"exported for another model \(mlp_dim: 256"):
    run_lib.run(config, str(tmp_path))


def test_student_dont_load_keeps_fresh_params_and_no_npz_export(converted, tmp_path):
  workdir, _ = converted
  results = run_lib.run(
      _tiny(stages=(), **{"student.dont_load": ("head/.*",), "export.npz": False}), str(tmp_path)
  )
  assert results.student_kept_fresh == ["head/bias", "head/kernel"]
  assert not os.path.exists(tmp_path / "student.npz")  # export.npz=False
  assert os.path.exists(tmp_path / "student_config.json")
  copied = checkpoints.flatten(checkpoints.load_npz(os.path.join(workdir, "student.npz")))
  # A fresh (zero-init) head predicts one class: top-1 falls to chance while the copy's is high.
  assert results.student_top1 < 0.3 and np.any(copied["head/kernel"])
  with pytest.raises(ConfigError, match="matches no student parameter"):
    run_lib.run(_tiny(stages=(), **{"student.dont_load": ("heads/.*",)}), str(tmp_path / "b"))


def test_a_failed_first_start_does_not_block_the_corrected_rerun(tmp_path):
  bad = _tiny(stages=(), **{"teacher.init": str(tmp_path / "missing.npz")})
  with pytest.raises(checkpoints.CheckpointError):
    run_lib.run(bad, str(tmp_path / "w"))
  assert not os.path.exists(tmp_path / "w" / "config.json")  # no identity recorded
  preflight.check_same_run(str(tmp_path / "w"), _tiny(stages=()))  # the fix is accepted


def _leaves(tree, prefix=""):
  for k, v in tree.items():
    if hasattr(v, "items"):
      yield from _leaves(v, f"{prefix}{k}.")
    else:
      yield f"{prefix}{k}", v


@pytest.mark.parametrize("path", CONFIGS, ids=os.path.basename)
def test_no_config_field_is_a_list(path):
  """ml_collections cannot override lists from the command line; tuples it can."""
  ns = {}
  with open(path) as f:
    exec(compile(f.read(), path, "exec"), ns)
  arg = "tiny=True" if "tiny=" in open(path).read() else None
  if os.path.basename(path) == "convert_folder.py":  # its checkpoint and folder must exist
    arg = (
        f"init={os.path.join(ROOT, 'linvit_jax', 'assets', 'teacher_fmnist_vit.npz')},"
        f"images={os.path.join(ROOT, 'tests', 'data')},tiny=True"
    )
  for config in (config_lib.base_config(), ns["get_config"](arg)):
    lists = [k for k, v in _leaves(config) if isinstance(v, list)]
    assert not lists, f"{os.path.basename(path)}: list fields {lists}"


@pytest.mark.parametrize(
    "override,field,expected",
    [
        ("--config.stages=finetune", "stages", ("finetune",)),
        ("--config.stages=()", "stages", ()),
        (
            "--config.stages=('distill_attention', 'finetune')",
            "stages",
            ("distill_attention", "finetune"),
        ),
        ("--config.teacher.dont_load=head/.*", "teacher.dont_load", ("head/.*",)),
        (
            "--config.student.dont_load=('head/.*', 'pre_logits/.*')",
            "student.dont_load",
            ("head/.*", "pre_logits/.*"),
        ),
        ("--config.param_rules=(('.*/kernel', 'fsdp'),)", "param_rules", ((".*/kernel", "fsdp"),)),
        ("--config.eval.resolution_factors=(1, 2, 4)", "eval.resolution_factors", (1, 2, 4)),
        ("--config.mesh=(('data', 2), ('fsdp', 4))", "mesh", (("data", 2), ("fsdp", 4))),
    ],
)
def test_sequence_fields_are_settable_from_the_command_line(override, field, expected, monkeypatch):
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "", flag_values=fv, lock_config=True)
  argv = ["prog", "--config", os.path.join(ROOT, "configs", "demo.py"), override]
  monkeypatch.setattr(sys, "argv", argv)  # ml_collections finds the overrides in sys.argv
  fv(argv)
  value = fv.config
  for part in field.split("."):
    value = value[part]
  assert value == expected


def test_architecture_read_from_the_teacher_checkpoint(converted, tmp_path):
  """teacher.architecture='init': the model block comes from the checkpoint (here the demo's own
  teacher, so the run is the same as with the config's model block)."""
  workdir, results = converted
  config = _tiny(stages=(), **{"teacher.architecture": "init", "model.width": 999})
  again = run_lib.run(config, str(tmp_path))
  assert again.config["model"]["width"] == 128  # read from the file, not the config's 999
  assert again.config["teacher"]["architecture"] == "config"  # resolved, as config.json says
  np.testing.assert_allclose(again.student_logits_sample, results.student_logits_sample, atol=1e-6)
  with pytest.raises(ConfigError, match="architecture='bogus'"):
    run_lib.run(_tiny(**{"teacher.architecture": "bogus"}), str(tmp_path / "b"))


def test_teacher_without_its_head_needs_no_logit_distillation(tmp_path):
  config = _tiny(**{"teacher.dont_load": ("head/.*",)})
  with pytest.raises(ConfigError, match=r"config.finetune.w_logit_kd=.*teacher's head out"):
    run_lib.run(config, str(tmp_path))


def test_i21k_route_new_head_end_to_end_from_the_cli(tmp_path):
  """A teacher whose head is skipped (an i21k checkpoint's), run by the CLI: the teacher's head
  gets a concrete init (calibration used to crash on its abstract shape), no teacher top-1 is
  reported, the student's new head trains on labels only."""
  import json
  import subprocess

  workdir = tmp_path / "w"
  r = subprocess.run(
      [
          sys.executable,
          "-m",
          "linvit_jax.main",
          "--config",
          "configs/demo.py:tiny=True",
          "--workdir",
          str(workdir),
          "--config.teacher.dont_load=head/.*",
          "--config.student.dont_load=head/.*",
          "--config.finetune.w_logit_kd=0",
          "--config.eval.plots=False",
          "--config.eval.resolution_factors=()",
      ],
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=600,
  )
  assert r.returncode == 0, r.stderr[-3000:]
  results = json.loads((workdir / "results.json").read_text())
  assert results.get("teacher_top1") is None and results["student_kept_fresh"] == [
      "head/bias",
      "head/kernel",
  ]
  # The new head starts at zero (head_zeroinit) and the fine-tune moved it: it trained on labels.
  head = checkpoints.flatten(checkpoints.load_npz(str(workdir / "student.npz")))["head/kernel"]
  assert np.abs(head).max() > 0 and results["student_top1"] is not None
