"""studies/compounding: the fix-one / break-one interventions on a tiny 2-layer ViT (a student
equal to its teacher has no gap; a student that differs in layer 0 only owes it all of its gap)
and the CLI on an exported tiny student."""

import json
import os

import jax
import numpy as np
import pytest

from linvit_jax.evaluation import layer_swap
from linvit_jax.models import layout
from linvit_jax.models import vit
from linvit_jax.runtime import errors
from linvit_jax.studies import compounding
from tests.helpers import student_export
from tests.helpers import tiny_teacher

IMAGES = np.random.RandomState(0).randn(3, 16, 16, 3).astype(np.float32)


@pytest.fixture(scope="module")
def teacher():
  model = vit.Model(**student_export.FIELDS, attention="softmax")
  params = model.init(jax.random.PRNGKey(0), IMAGES[:1])["params"]
  params = jax.tree.map(np.asarray, params)
  params["cls"] = np.full_like(params["cls"], 0.5)  # a cls token that is not all zeros
  return model, params


def _student_differing_in_layer_0(teacher):
  """The teacher with layer 0's attention linear (make_export's hedgehog, centred keys, conv of
  v): the teacher's projections, the student's own feature maps and levers."""
  model, params = teacher
  student = vit.Model(**student_export.FIELDS, attention=(student_export.ATTENTION, "softmax"))
  fresh = student.init(jax.random.PRNGKey(1), IMAGES[:1])["params"]
  name = layout.block_name(0)
  attn = dict(params["Transformer"][name][layout.ATTN])
  attn.update({k: v for k, v in fresh["Transformer"][name][layout.ATTN].items() if k not in attn})
  out = {**params, "Transformer": dict(params["Transformer"])}
  out["Transformer"][name] = {**params["Transformer"][name], layout.ATTN: attn}
  return student, out


def test_a_student_equal_to_its_teacher_has_no_gap_to_share(teacher):
  model, params = teacher
  cosines = compounding.intervention_cosines(model, params, model, params, IMAGES)
  assert cosines["fix"]["cls"].shape == (2, 3) and cosines["break"]["patch"].shape == (2, 3)
  for values in jax.tree.leaves(cosines):
    np.testing.assert_allclose(values, 1, atol=1e-5)
  summary = compounding.summarize(cosines)
  assert summary["n_photos"] == 3 and summary["sum_recovered_share"] == {"cls": None, "patch": None}
  assert all(r["recovered_share"]["cls"] is None for r in summary["layers"])


def test_a_student_that_differs_in_layer_0_owes_it_its_whole_gap(teacher):
  student, student_params = _student_differing_in_layer_0(teacher)
  model, params = teacher
  names = ["a.jpg", "b.jpg", "c.jpg"]
  # batch 2: the per-photo rows come back in photo order across a padded last batch
  out = compounding.measure(model, params, student, student_params, IMAGES, 2, names)
  l0, l1 = out["layers"]
  rows = out["per_photo"]
  cls = [r["student"]["cls"] for r in rows]
  assert sorted(r["photo"] for r in rows) == names and cls == sorted(cls)  # worst first
  for r in rows:  # each photo's whole gap is layer 0's, none is layer 1's
    for m in ("cls", "patch"):
      assert r["fix_gain"][m][0] == pytest.approx(1 - r["student"][m], abs=1e-5)
      assert r["fix_gain"][m][1] == pytest.approx(0, abs=1e-5)
  assert np.mean(cls) == pytest.approx(out["baseline"]["cls"], abs=1e-6)
  with pytest.raises(compounding.CompoundingError, match="2 photo names for 3"):
    compounding.measure(model, params, student, student_params, IMAGES, 3, names[:2])
  for m in ("cls", "patch"):
    base = out["baseline"][m]
    assert base < 0.999  # the linear layer 0 makes a gap
    assert l0[f"fix_{m}"] == pytest.approx(1, abs=1e-5)  # its softmax back: the teacher again
    assert l1[f"break_{m}"] == pytest.approx(1, abs=1e-5)  # layer 1 is the teacher's own
    # the teacher with the student's layer 0 is the student; fixing layer 1 changes nothing
    assert l0[f"break_{m}"] == pytest.approx(base, abs=1e-5)
    assert l1[f"fix_{m}"] == pytest.approx(base, abs=1e-5)
    assert l0["recovered_share"][m] == pytest.approx(1, abs=1e-3)
    assert l1["recovered_share"][m] == pytest.approx(0, abs=1e-3)
    assert l0["gap_alone"][m] == pytest.approx(1 - base, abs=1e-5)
    assert out["sum_recovered_share"][m] == pytest.approx(1, abs=1e-3)
  assert l0["attention_tf_cosine"] < 0.999 and l1["attention_tf_cosine"] == pytest.approx(1)


def test_swap_attention_moves_one_subtree_and_needs_a_per_block_model(teacher):
  model, params = teacher
  student, student_params = _student_differing_in_layer_0(teacher)
  broken, broken_params = layer_swap.swap_attention(model, params, student, student_params, 0)
  assert vit.layer_specs(broken) == vit.layer_specs(student)
  block = broken_params["Transformer"][layout.block_name(0)]
  assert block[layout.ATTN] is student_params["Transformer"][layout.block_name(0)][layout.ATTN]
  assert block["MlpBlock_0"] is params["Transformer"][layout.block_name(0)]["MlpBlock_0"]
  assert "feature_map_q" not in params["Transformer"][layout.block_name(0)][layout.ATTN]
  scanned = model.clone(scan=True)
  with pytest.raises(errors.ConfigError, match="scan=False"):
    layer_swap.swap_attention(scanned, params, model, params, 0)


def test_fix_gains_rank_the_layer_that_differs_first(teacher):
  """Softmax back in layer 0 (the only linear one) makes the student its teacher: all the gap;
  layer 1 is the teacher's already: no gain. The pick is layer 0, and both, in layer order."""
  model, params = teacher
  student, student_params = _student_differing_in_layer_0(teacher)
  gains = layer_swap.fix_gains(model, params, student, student_params, IMAGES)
  baseline = layer_swap.cosines_to(
      student, student_params, IMAGES, layer_swap.final_tokens(model, params, IMAGES)
  )
  gap = 1 - float(np.mean([np.mean(v) for v in baseline.values()]))
  assert gap > 1e-3 and gains[0] == pytest.approx(gap, abs=1e-5)
  assert gains[1] == pytest.approx(0, abs=1e-6)
  assert layer_swap.most_sensitive(gains, 1) == [0]
  assert layer_swap.most_sensitive(gains, 2) == [0, 1]


def test_fix_gains_over_the_worst_images_average_only_those(teacher):
  """worst_share keeps the images of lowest baseline: with 3 images and a quarter, the one the
  student is furthest on; 1.0 is the mean over all; a share outside (0, 1] is refused."""
  model, params = teacher
  student, student_params = _student_differing_in_layer_0(teacher)
  baseline, per_image = layer_swap.per_image_fix_gains(
      model, params, student, student_params, IMAGES
  )
  assert baseline.shape == (3,) and per_image.shape == (2, 3)
  assert len(set(np.round(baseline, 6))) == 3  # the images differ, so the pick means something
  every = layer_swap.fix_gains(model, params, student, student_params, IMAGES)
  np.testing.assert_allclose(every, per_image.mean(axis=1), atol=1e-6)
  worst = layer_swap.fix_gains(model, params, student, student_params, IMAGES, worst_share=0.25)
  np.testing.assert_allclose(worst, per_image[:, int(np.argmin(baseline))], atol=1e-6)
  # the worst image has the largest gap, and layer 0 closes all of it
  assert worst[0] == pytest.approx(1 - baseline.min(), abs=1e-5) and worst[0] > every[0]
  with pytest.raises(errors.ConfigError, match="worst_share"):
    layer_swap.fix_gains(model, params, student, student_params, IMAGES, worst_share=0)


def test_cli_writes_json_and_plot_and_a_bad_folder_is_one_line(tmp_path, capsys):
  student = student_export.make_export(tmp_path / "student")
  teacher = str(tmp_path / "teacher.npz")
  tiny_teacher.headless_checkpoint(teacher, patch_size=(4, 4), reg_tokens=1)
  photos = str(tmp_path / "photos")
  tiny_teacher.smooth_photos(photos, n=3)
  out, png = str(tmp_path / "c.json"), str(tmp_path / "c.png")
  args = ["--student", student, "--teacher", teacher, "--photos", photos]
  # 24 px: both position tables resampled from the 16-px training grid
  assert (
      compounding.main([*args, "--res", "24", "--views", "crop", "--out", out, "--plot", png]) == 0
  )
  printed = capsys.readouterr().out
  with open(out) as f:
    results = json.load(f)
  assert results["n_photos"] == 3 and results["res"] == 24 and results["view"] == "crop"
  assert [r["layer"] for r in results["layers"]] == [0, 1]
  row = results["layers"][0]
  assert {"fix_cls", "fix_patch", "break_cls", "break_patch", "recovered_share"} <= set(row)
  assert -1 <= row["fix_cls"] <= 1 and 0 < results["baseline"]["patch"] < 1
  assert os.path.getsize(png) > 1000 and "wrote" in printed and "recov" in printed
  assert len(results["per_photo"]) == 3 and "worst photos by cls" in printed
  assert results["per_photo"][0]["photo"] in os.listdir(photos)

  assert compounding.main([*args[:4], "--photos", str(tmp_path / "nowhere")]) == 2
  err = capsys.readouterr().err
  assert err.startswith("error: --photos") and err.count("\n") == 1
  assert compounding.main([*args, "--res", "18"]) == 2
  err = capsys.readouterr().err
  assert err.startswith("error: --res 18") and err.count("\n") == 1


def test_pick_gains_rules_pick_on_all_images_or_the_worst_quarter():
  """tools/pick_gains: "sensitivity" averages every image's gains, "sensitivity_worst" those of
  the quarter of lowest baseline (here the one image at 0.5, where layer 2 alone gains)."""
  from tools import pick_gains

  baseline = np.array([0.9, 0.5, 0.95, 0.92])
  gains = np.array([[0.03, 0.0, 0.03, 0.03], [0.0, 0.0, 0.0, 0.0], [0.0, 0.2, 0.0, 0.0]])
  out = pick_gains.rules(baseline, gains, 0.25)
  assert out["sensitivity"]["pick"] == 2 and out["sensitivity"]["gains"][0] == pytest.approx(0.0225)
  assert out["sensitivity_worst"]["pick"] == 2 and out["sensitivity_worst"]["gains"] == [0, 0, 0.2]
  out = pick_gains.rules(baseline, gains[:, [0, 2, 3, 1]] * [[1], [1], [0]], 0.25)
  assert out["sensitivity"]["pick"] == 0 and out["sensitivity_worst"]["pick"] == 0
