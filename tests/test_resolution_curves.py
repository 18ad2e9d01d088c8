"""tools/resolution_curves.py: every kept checkpoint of a finished (tiny) run, measured on its
validation photos at several sizes; the last checkpoint's point is the exported student's."""

import json
import os

import numpy as np
import pytest

from tests.helpers import tiny_teacher
from tools import resolution_curves


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
  from linvit_jax import run as run_lib

  tmp = tmp_path_factory.mktemp("curves")
  ckpt = str(tmp / "teacher.npz")
  tiny_teacher.headless_checkpoint(ckpt)
  tiny_teacher.smooth_photos(str(tmp / "photos"), n=12)
  config = tiny_teacher.convert_folder_config(ckpt, str(tmp / "photos"), ",holdout=0.5")
  workdir = str(tmp / "work")
  run_lib.run(config, workdir)
  return workdir


def test_every_kept_checkpoint_at_every_size(tiny_run):
  curves = resolution_curves.measure(tiny_run, factors=(1, 2), views=("whole",))
  stages = [
      s for s in ("distill_attention", "align") if resolution_curves.checkpoint_steps(tiny_run, s)
  ]
  assert stages == ["distill_attention", "align"]
  assert curves["stage_starts"]["distill_attention"] == 0 and curves["stage_starts"]["align"] > 0
  kept = sum(len(resolution_curves.checkpoint_steps(tiny_run, s)) for s in stages)
  assert curves["sizes"] == [32, 64] and curves["n_photos"] >= 1
  assert len(curves["points"]) == kept * 2
  seen = [p["images_seen"] for p in curves["points"] if p["size"] == 32]
  assert seen == sorted(seen) and len(set(seen)) == kept  # align continues after distillation
  for p in curves["points"]:
    assert -1.0 <= p["patch_cosine"] <= 1.0 + 1e-6 and -1.0 <= p["cls_cosine"] <= 1.0 + 1e-6
  # a hybrid run (the default): the distilled checkpoints ran as the all-linear student
  specs = [s.kind for s in resolution_curves.linear_model(student_model(tiny_run)).attention]
  assert set(specs) == {"linear"}


def student_model(workdir):
  import linvit_jax

  return linvit_jax.load_student(workdir).model


def test_the_last_checkpoint_is_the_exported_student(tiny_run):
  import linvit_jax

  student = linvit_jax.load_student(tiny_run)
  last = resolution_curves.checkpoint_steps(tiny_run, "align")[-1]
  params = resolution_curves.restore_params(tiny_run, "align", last)
  flat = lambda tree: {  # noqa: E731
      "/".join(str(getattr(k, "key", k)) for k in path): np.asarray(v)
      for path, v in __import__("jax").tree_util.tree_flatten_with_path(tree)[0]
  }
  restored, exported = flat(params), flat(student.params)
  assert restored.keys() == exported.keys()
  for name, value in exported.items():
    np.testing.assert_allclose(restored[name], value, rtol=1e-6, atol=1e-6, err_msg=name)


def test_cli_writes_the_json_and_the_plot(tiny_run, tmp_path):
  out, png = str(tmp_path / "c.json"), str(tmp_path / "c.png")
  relative = os.path.relpath(tiny_run)  # as a user types it (orbax wants absolute paths)
  assert resolution_curves.main([relative, "--factors", "1", "--out", out, "--plot", png]) == 0
  with open(out) as f:
    assert json.load(f)["sizes"] == [32]
  assert os.path.getsize(png) > 1000


def test_a_folder_that_is_not_a_run_is_named(tmp_path):
  with pytest.raises(SystemExit, match="not a finished run"):
    resolution_curves.measure(str(tmp_path))


def test_token_structure_measures_the_shared_part_and_the_deviations(tiny_run, tmp_path):
  from tools import token_structure

  out = str(tmp_path / "s.json")
  assert token_structure.main([tiny_run, "--factors", "1", "--out", out]) == 0
  with open(out) as f:
    result = json.load(f)
  (row,) = result["rows"]
  assert row["size"] == 32 and result["n_photos"] >= 1
  # The same tokens, measured here another way: the training loss's own definition of the
  # deviation cosine, and resolution_curves' point of the last checkpoint (the exported student).
  from linvit_jax.conversion import distill
  from linvit_jax.data import inference_pp
  from linvit_jax.evaluation import photo_eval
  from linvit_jax.evaluation import photo_tokens

  _, res, student, teacher, teacher_params, paths, values = resolution_curves.validation_setup(
      tiny_run
  )
  pps = {"whole": inference_pp.Preprocess(photo_eval.view_pp("whole", 32, values))}
  tokens, _ = photo_tokens.forward_all(
      photo_tokens.Tokens(teacher, teacher_params, res),
      photo_tokens.Tokens(student.model, student.params, res), paths, pps, 32,
  )  # fmt: skip
  t, s = tokens["whole"]
  prefix = teacher.num_prefix_tokens
  loss, _ = distill.token_structure_loss(s, t, prefix)
  assert row["deviation_cosine"] == pytest.approx(1.0 - float(loss), abs=1e-5)
  assert row["deviation_cosine"] < row["patch_cosine"]  # the shared part was removed
  curves = resolution_curves.measure(tiny_run, factors=(1,))
  last = max(curves["points"], key=lambda p: p["images_seen"])
  assert row["patch_cosine"] == pytest.approx(last["patch_cosine"], abs=1e-5)
  patches = t[:, prefix:].astype(np.float64)
  share = np.linalg.norm(patches.mean(1), axis=-1) / np.linalg.norm(patches, axis=-1).mean(1)
  assert row["mean_token_share"] == pytest.approx(float(share.mean()), rel=1e-5)


def test_runs_whose_checkpoints_are_not_the_student_and_bad_sizes_are_refused(tiny_run, tmp_path):
  config = resolution_curves._config(tiny_run)
  assert resolution_curves.raw_params_differ(config) == []
  config.align.start_weight = 0.5
  reasons = resolution_curves.raw_params_differ(config)
  assert reasons == ["align.start_weight=0.5"]
  # the default is a hybrid: distill_attention's checkpoints are the student before the swap
  assert config.student.softmax_layers == 1
  assert resolution_curves.pre_swap_stages(config) == {"distill_attention"}
  config.student.softmax_layers = 0
  assert resolution_curves.pre_swap_stages(config) == set()
  with pytest.raises(SystemExit, match="not multiples of the patch"):
    resolution_curves.sizes_for(32, (1, 1.1), (8, 8))
  assert resolution_curves.sizes_for(32, (1, 2), (8, 8)) == [32, 64]
  with pytest.raises(SystemExit, match="pass --teacher"):
    resolution_curves.measure(tiny_run, teacher_init=str(tmp_path / "absent.npz"))
