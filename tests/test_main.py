"""The CLI and the end-to-end conversion path on the embedded demo at a tiny size."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from linvit_jax.models import checkpoints
from tests.helpers.subprocs import run_cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BV = os.path.join(ROOT, "tests", "data", "vit_w192_d4_p16_i64_tok_learn.npz")


def _cli(*args, timeout=300):
  return run_cli(*args, timeout=timeout)


def test_cli_rejects_unknown_config_field(tmp_path):
  r = _cli(
      "--config",
      "configs/demo.py:tiny=True",
      "--workdir",
      str(tmp_path),
      "--config.finetune.stpes=3",
  )
  assert r.returncode != 0
  assert "stpes" in r.stderr
  assert not os.listdir(tmp_path)  # rejected before anything ran


def test_cli_rejects_unknown_config_arg(tmp_path):
  r = _cli("--config", "configs/demo.py:feature_mapp=elu1", "--workdir", str(tmp_path))
  assert r.returncode != 0
  assert "feature_mapp" in r.stderr


@pytest.mark.parametrize(
    "case", ["missing_config_file", "missing_workdir", "unprepared_tfds", "unknown_field"]
)
def test_cli_user_errors_are_one_line_with_exit_2(case, tmp_path):
  """The whole stderr is the `error:` line: no traceback, usage text or TF/absl start-up lines."""
  workdir = str(tmp_path / "w")
  args, fragment = {
      "missing_config_file": (
          ["--config", "configs/nope.py", "--workdir", workdir],
          "no config file 'configs/nope.py'",
      ),
      "missing_workdir": (["--config", "configs/demo.py:tiny=True"], "--workdir is required"),
      "unprepared_tfds": (
          # a local teacher: the architecture is read from it before the data is opened
          [
              "--config",
              f"configs/imagenet_vit.py:data_dir={tmp_path},init={BV}",
              "--workdir",
              workdir,
          ],
          "is not prepared in",
      ),
      "unknown_field": (
          ["--config", "configs/demo.py", "--workdir", workdir, "--config.finetune.stpes=3"],
          "no such config field 'stpes'",
      ),
  }[case]
  r = _cli(*args)
  assert r.returncode == 2, r.stderr[-2000:]
  assert r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.stderr[-2000:]
  assert fragment in r.stderr
  # Nothing that would make the corrected rerun refuse this workdir ("another config").
  assert not os.path.exists(os.path.join(workdir, "config.json"))


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
  import configs.demo
  from linvit_jax import run as run_lib

  workdir = str(tmp_path_factory.mktemp("demo"))
  config = configs.demo.get_config("tiny=True")
  results = run_lib.run(config, workdir)
  return config, workdir, results


def test_demo_tiny_runs_end_to_end(demo_run):
  config, workdir, results = demo_run
  for name in (
      "student.npz",
      "student_config.json",
      "surgery_report.json",
      "surgery_report.txt",
      "results.json",
      "config.json",
      "fidelity.png",
      "attention_maps.png",
  ):
    assert os.path.exists(os.path.join(workdir, name)), name
  with open(os.path.join(workdir, "results.json")) as f:
    saved = json.load(f)
  for key in (
      "teacher_top1",
      "student_top1_converted",
      "student_top1_after_distill_attention",
      "student_top1",
      "fidelity_converted",
      "fidelity_after_finetune",
      "student_images_per_s",
      "resolution",
  ):
    assert key in saved, key
  assert 0.0 <= saved["student_top1"] <= 1.0
  assert saved["teacher_top1"] > 0.5  # the shipped teacher is a trained model
  assert len(saved["fidelity_converted"]) == config.model.depth
  assert [r["factor"] for r in saved["resolution"]] == [1, 2]
  # its fidelity sample is the eval view itself (no eval.sample_pp): no second, identical measure
  assert not config.eval.sample_pp and "eval_view_fidelity" not in saved
  with open(os.path.join(workdir, "surgery_report.json")) as f:
    report = json.load(f)
  assert report  # every leaf listed; contents are tested in test_surgery.py


def test_exported_student_loads_back_with_same_logits(demo_run):
  config, workdir, results = demo_run
  from linvit_jax import build
  from linvit_jax.artifacts import export_format
  from linvit_jax.models import vit

  with open(os.path.join(workdir, "student_config.json")) as f:
    student_cfg = export_format.model_fields(json.load(f))
  model = vit.Model(**student_cfg)
  sample = build.sample_images(config, 4)
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), sample[:1])["params"]
  params = vit.load(shapes, os.path.join(workdir, "student.npz"), student_cfg)
  logits, _ = model.apply({"params": params}, sample)
  np.testing.assert_allclose(
      np.asarray(logits), np.asarray(results["student_logits_sample"]), atol=1e-5, rtol=1e-5
  )
  flat = checkpoints.flatten(checkpoints.load_npz(os.path.join(workdir, "student.npz")))
  assert any("feature_map_q" in k for k in flat)  # hedgehog's own params are exported too


def test_rerun_in_same_workdir_resumes(demo_run):
  """A second run finds every stage finished and ends with the same student."""
  from linvit_jax import run as run_lib

  config, workdir, results = demo_run
  again = run_lib.run(config, workdir)
  np.testing.assert_allclose(
      again["student_logits_sample"], results["student_logits_sample"], atol=1e-6
  )


def test_tensorflow_startup_lines_are_dropped_on_any_cpu(tmp_path):
  """What TensorFlow's C++ code writes to fd 2 while loading (oneDNN on some CPUs) is dropped,
  other stderr lines pass: simulated by a module that writes both, so no CPU is needed for it."""
  (tmp_path / "noisy_tf.py").write_text(
      "import os\n"
      "os.write(2, b'WARNING: All log messages before absl::InitializeLog() is called are "
      "written to STDERR\\n')\n"
      "os.write(2, b'I0000 00:00:1796121495.514117    4644 port.cc:153] oneDNN custom operations "
      "are on. You may see slightly different numerical results\\n')\n"
      "os.write(2, b'a real warning\\n')\n"
  )
  code = (
      f"import sys; sys.path.insert(0, {str(tmp_path)!r}); from linvit_jax.runtime import quiet_tf; "
      "quiet_tf.import_quietly('noisy_tf'); print('after', file=sys.stderr)"
  )
  r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
  assert r.returncode == 0, r.stderr
  assert r.stderr == "a real warning\nafter\n", r.stderr


def test_error_inside_a_config_file_is_not_called_a_missing_field(tmp_path):
  """Only a missing --config.<field> is a config field error; an AttributeError raised by a
  config file's own code says what it is."""
  cfg = tmp_path / "broken.py"
  cfg.write_text("def get_config(arg=None):\n  return b'x'.dtype\n")
  r = _cli("--config", str(cfg), "--workdir", str(tmp_path / "w"))
  assert r.returncode == 2, r.stderr
  assert r.stderr.count("\n") == 1 and "no such config field" not in r.stderr, r.stderr
  assert "while loading the config: AttributeError" in r.stderr and "dtype" in r.stderr


def test_print_config_lists_every_field_with_its_meaning():
  r = _cli("--config", "configs/demo.py:feature_map=elu1", "--print_config")
  assert r.returncode == 0, r.stderr
  lines = r.stdout.splitlines()
  import configs.demo
  from linvit_jax.configuration import reference

  expected = reference.describe(configs.demo.get_config("feature_map=elu1")).splitlines()
  assert lines[-len(expected) :] == expected  # every field, as the file resolves it
  by_field = {line.split(" = ")[0]: line for line in lines if " = " in line}
  assert "student.attention = 'elu1'" in by_field["student.attention"]
  assert "# the student's operator" in by_field["student.attention"]
  assert "# the peak of the schedule" in by_field["finetune.optimizer.lr"]  # stage blocks too
  assert "# regexes" in by_field["teacher.dont_load"]


def test_print_config_resolves_the_architecture_from_init():
  r = _cli("--config", "configs/imagenet_vit.py:init=tests/data/foreign/timm_vit", "--print_config")
  assert r.returncode == 0, r.stderr
  assert "model.width = 32" in r.stdout and "model.num_heads = 2" in r.stdout


def test_demo_align_steps_adds_the_label_free_stage():
  import configs.demo
  from linvit_jax import preflight

  config = configs.demo.get_config("align_steps=40")
  assert config.stages == ("distill_attention", "align", "finetune")
  a = config.align
  assert (a.steps, a.optimizer.warmup_steps, a.optimizer.lr, a.trainable) == (40, 10, 2e-4, "all")
  assert a.optimizer.update_scale == "param_rms" and a.w_feature == a.w_blocks == 1.0
  preflight.validate(config)
  assert (a.optimizer.lora_rank, a.optimizer.ema_decay, a.optimizer.average_last) == (0, 0.0, 0.0)
  assert configs.demo.get_config("align_steps=40,align_lora=4").align.optimizer.lora_rank == 4
  with pytest.raises(ValueError, match="align_lora=4 needs the align stage"):
    configs.demo.get_config("align_lora=4")
  assert configs.demo.get_config("").stages == ("distill_attention", "finetune")
