"""photo_eval: views from the original photo, bootstrap intervals, the dense measure, the too-few
line and the CLI, on tiny models (a 16-px ViT; the tiny Hugging Face DINOv2 for the CLI)."""

import json
import os

import jax
import numpy as np
import pytest
from PIL import Image

from linvit_jax import build
from linvit_jax import compare
from linvit_jax.artifacts import export_folder
from linvit_jax.configuration import config_lib
from linvit_jax.data import image_folder
from linvit_jax.data import inference_pp
from linvit_jax.evaluation import dense
from linvit_jax.evaluation import photo_eval
from linvit_jax.models import vit
from linvit_jax.models import vit_checkpoint
from linvit_jax.runtime import progress
from tests.helpers.student_export import FIELDS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HF = os.path.join(ROOT, "tests", "data", "foreign", "hf_dinov2_registers")
PP = 'decode|resize_small(18)|central_crop(16)|vgg_value_range|keep("image")'


def write_photos(folder, n, seed=0):
  """n photos of 40-90 px: smooth colour fields with a pattern, some PNG, some JPEG."""
  rs = np.random.RandomState(seed)
  os.makedirs(folder, exist_ok=True)
  paths = []
  for i in range(n):
    h, w = rs.randint(40, 90, size=2)
    smooth = rs.rand(h // 8 + 2, w // 8 + 2, 3)
    img = np.asarray(Image.fromarray((smooth * 255).astype(np.uint8)).resize((w, h)), np.float32)
    img[::6] *= 0.5  # stripes: something small for the higher sizes to see
    paths.append(os.path.join(folder, f"photo_{i}.{'png' if i % 2 else 'jpg'}"))
    Image.fromarray(img.astype(np.uint8)).save(paths[-1])
  return paths


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
  return write_photos(str(tmp_path_factory.mktemp("photos")), 10)


@pytest.fixture(scope="module")
def teacher():
  model = vit.Model(**FIELDS, attention="softmax")
  params = model.init(jax.random.PRNGKey(0), np.zeros((1, 16, 16, 3), np.float32))["params"]
  return model, jax.tree.map(np.asarray, params)


def _perturbed(params, scale):
  leaves, tree = jax.tree.flatten(params)
  rs = np.random.RandomState(1)
  return jax.tree.unflatten(tree, [x + scale * np.std(x) * rs.randn(*x.shape) for x in leaves])


def _spec(**kw) -> photo_eval.PhotoEvalSpec:
  return photo_eval.PhotoEvalSpec(pp=PP, res=16, **kw)


def _evaluate(teacher, student_params, photos, **kw):
  model, params = teacher
  spec = _spec(**{"factors": (1, 2), "bootstrap": 200, "dense_k": 4, "min_photos": 4, **kw})
  return photo_eval.evaluate_photos(
      model, params, model, student_params, photos[:6], photos[6:], spec
  )


def test_views_come_from_the_original_not_an_upsampled_crop(tmp_path):
  # A fine checkerboard (8-px squares) in a 128-px photo: at 32 px its squares are 2 px and
  # visible; a 16-px view (1-px squares, blurred) upsampled to 32 px has lost them.
  i, j = np.indices((128, 128))
  board = ((i // 8 + j // 8) % 2 * 255).astype(np.uint8)
  path = str(tmp_path / "board.png")
  Image.fromarray(np.stack([board] * 3, -1)).save(path)
  values = photo_eval.value_ops(PP)
  assert values == "decode|vgg_value_range"  # the geometry is the views', the rest the run's
  native = inference_pp.Preprocess(photo_eval.view_pp("whole", 32, values))(path)
  small = inference_pp.Preprocess(photo_eval.view_pp("whole", 16, values))(path)
  up = np.asarray(jax.image.resize(small, (32, 32, 3), "bilinear"))
  assert native.shape == up.shape == (32, 32, 3)
  assert native.std() > 3 * up.std()  # the pattern's contrast survives only at native size
  assert np.abs(native - up).mean() > 0.8
  # The crop view: the shorter side to s, then the centre (a wide photo keeps its middle).
  wide = np.zeros((40, 80, 3), np.uint8)
  wide[:, 20:60] = 255
  crop = inference_pp.Preprocess(photo_eval.view_pp("crop", 16, "decode"))(wide)
  whole = inference_pp.Preprocess(photo_eval.view_pp("whole", 16, "decode"))(wide)
  assert crop.shape == whole.shape == (16, 16, 3)
  assert crop.min() > 200 and whole[:, 0].max() < 50  # the crop is all middle, whole is not


def test_bootstrap_contains_the_mean_and_shrinks_with_more_photos():
  rs = np.random.RandomState(0)
  many = rs.rand(400)
  few = many[:10]  # the same photos' values, fewer of them: width ~ 1/sqrt(n)
  for values in (few, many):
    lo, hi = photo_eval.bootstrap_interval(values, 1000, seed=0)
    assert lo <= values.mean() <= hi
  assert np.ptp(photo_eval.bootstrap_interval(many)) < 0.5 * np.ptp(
      photo_eval.bootstrap_interval(few)
  )
  assert photo_eval.bootstrap_interval(few, seed=3) == photo_eval.bootstrap_interval(few, seed=3)
  s = photo_eval.stat([0.9, 0.5, 0.8], ["a", "b", "c"])
  assert (s["worst"], s["worst_photo"], s["n"]) == (0.5, "b", 3)
  assert s["per_photo"] == {"a": 0.9, "b": 0.5, "c": 0.8}  # kept, for paired comparisons


def test_the_teacher_as_its_own_student_keeps_every_part(teacher, photos):
  out = _evaluate(teacher, teacher[1], photos)
  assert (out["n_test"], out["n_val"]) == (6, 4) and "too_few" not in out
  assert [(r["size"], r["view"]) for r in out["rows"]] == [
      (16, "whole"),
      (16, "crop"),
      (32, "whole"),
      (32, "crop"),
  ]
  for r in out["rows"]:
    assert r["n"] == 6 and r["upsampled"] == 0
    assert r["teacher_images_per_s"] > 0 and r["student_images_per_s"] > 0
    assert r["cls_cosine"]["mean"] == pytest.approx(1, abs=1e-5)
    assert r["patch_cosine"]["lo"] == pytest.approx(1, abs=1e-5)
    d = r["dense"]
    assert d["drop_in"]["mean"] == 1.0 and d["drop_in"]["worst"] == 1.0
    assert d["probe_student"] == d["probe_teacher"] and d["probe_ratio"] == 1.0
    assert d["probe_teacher"]["mean"] >= 0.5  # far above chance (1/8); below 1 by design
  json.dumps(out)  # plain JSON types
  table = photo_eval.format_table(out)
  assert "drop-in" in table and "photo_" in table and "   32 crop" in table


def test_a_perturbed_student_loses_parts_and_fidelity(teacher, photos):
  out = _evaluate(teacher, _perturbed(teacher[1], 0.5), photos)
  for r in out["rows"]:
    assert r["patch_cosine"]["mean"] < 0.99
    assert r["patch_cosine"]["lo"] <= r["patch_cosine"]["mean"] <= r["patch_cosine"]["hi"]
    assert r["patch_cosine"]["worst"] <= r["patch_cosine"]["mean"]
    assert r["dense"]["drop_in"]["mean"] < 1.0
    assert 0 <= r["dense"]["probe_student"]["mean"] <= 1


def _parts(n_photos, seed, k=8, dim=48, patches=64, noise=0.08):
  """Tokens [photos, patches, dim] of k well-separated parts (random unit centres plus noise),
  unequal shares (the largest part ~6x the smallest), each photo showing a few parts."""
  centres = np.random.RandomState(0).randn(k, dim)
  centres /= np.linalg.norm(centres, axis=1, keepdims=True)
  rs = np.random.RandomState(seed)
  share = np.arange(1, k + 1, dtype=np.float64) ** 0.9
  photos = []
  for _ in range(n_photos):
    shown = rs.choice(k, size=4, replace=False, p=share / share.sum())
    labels = rs.choice(shown, size=patches)
    photos.append(3 * (centres[labels] + noise * rs.randn(patches, dim)))  # any length: unit-scaled
  return np.stack(photos).astype(np.float32)


def _dense(val_t, val_s, test_t, test_s, k=8):
  """The dense measure as a run reports it: per-photo shares as STATs, and the probe ratio."""
  fit = dense.fit(val_t, val_s, k, 0, photo_eval.FIT_PATCHES)
  names = [f"p{i}" for i in range(len(test_t))]
  out = {
      name: photo_eval.stat(values, names, 200, 0)
      for name, values in dense.score(fit, test_t, test_s).items()
  }
  out["probe_ratio"] = out["probe_student"]["mean"] / out["probe_teacher"]["mean"]
  return out


def test_kmeans_finds_well_separated_blobs_and_is_seeded():
  """scipy's kmeans2 as the dense measure calls it: k blobs far apart, of unequal sizes, come
  back as k centroids at their centres, every point labelled by its blob; the same seed gives the
  same centroids."""
  rs = np.random.RandomState(0)
  centres = 10 * np.eye(5, 16)  # 5 centres, pairwise sqrt(200) apart
  truth = np.repeat(np.arange(5), [10, 20, 40, 80, 160])
  x = centres[truth] + 0.1 * rs.randn(len(truth), 16)
  centroids = dense.kmeans(x, 5, seed=1)
  labels = dense.assign(x, centroids)
  assert np.abs(np.sort(centroids, axis=0) - np.sort(centres, axis=0)).max() < 0.1
  for blob in range(5):  # one label per blob, a different one for each
    assert len(set(labels[truth == blob])) == 1
  assert len(set(labels)) == 5
  np.testing.assert_array_equal(centroids, dense.kmeans(x, 5, seed=1))


def test_the_probe_reproduces_well_separated_parts_and_reads_the_students_own_tokens():
  val, test = _parts(12, seed=1), _parts(8, seed=2)
  same = _dense(val, val, test, test)
  assert same["probe_teacher"]["mean"] >= 0.95 and same["probe_teacher"]["worst"] >= 0.9
  assert same["drop_in"]["mean"] == 1.0 and same["probe_ratio"] == 1.0
  assert same["probe_student"] == same["probe_teacher"]
  # Noisier parts and 6 fitting photos (measured 0.93; a ridge probe 0.91).
  val_noisy, test_noisy = _parts(6, seed=1, noise=0.15), _parts(8, seed=2, noise=0.15)
  noisy = _dense(val_noisy, val_noisy, test_noisy, test_noisy)
  assert noisy["probe_teacher"]["mean"] >= 0.9
  # A student whose tokens are a rotation of the teacher's keeps every part: its own probe sees
  # them (ratio 1), the teacher's centroids do not (drop-in low).
  q, _ = np.linalg.qr(np.random.RandomState(3).randn(val.shape[-1], val.shape[-1]))
  rot = _dense(val, val @ q.astype(np.float32), test, test @ q.astype(np.float32))
  assert rot["probe_ratio"] == pytest.approx(1.0, abs=0.01) and rot["drop_in"]["mean"] < 0.5
  # A student whose tokens carry nothing of the parts: near chance on its own probe.
  rs = np.random.RandomState(4)
  noise = _dense(val, rs.randn(*val.shape).astype(np.float32), test, rs.randn(*test.shape))
  assert noise["probe_ratio"] < 0.5


def test_each_size_shows_a_bar_of_its_photos_unless_switched_off(teacher, photos, capsys):
  _evaluate(teacher, teacher[1], photos, factors=(1,))
  err = capsys.readouterr().err
  # 4 validation photos (the dense fits) and 6 test photos.
  assert "photos at 16 px: 100%" in err and "10/10" in err
  with pytest.MonkeyPatch.context() as mp:
    mp.setenv(progress.ENV, "0")
    _evaluate(teacher, teacher[1], photos, factors=(1,))
  assert "photos at" not in capsys.readouterr().err


def test_too_few_photos_are_said_not_hidden(teacher, photos, caplog):
  out = _evaluate(teacher, teacher[1], photos[:8], factors=(1,), min_photos=8)
  assert out["too_few"] == (
      "test set: 6 photos (< 8): intervals are wide; validation set: 2 photos (< 8): the dense "
      "measure's parts and probes rest on them"
  )
  assert "test set: 6 photos" in caplog.text
  assert "note: test set: 6 photos" in photo_eval.format_table(out)
  none = photo_eval.evaluate_photos(
      *teacher, *teacher, photos[:2], [], _spec(factors=(1,), min_photos=8)
  )
  assert "dense" not in none["rows"][0] and "validation set: 0 photos" in none["too_few"]
  empty = photo_eval.evaluate_photos(*teacher, *teacher, [], photos[:8], _spec())
  assert empty["rows"] == [] and empty["too_few"].startswith("test set: 0 photos (< 8)")
  assert photo_eval.format_table(empty).endswith("nothing measured")
  with pytest.raises(photo_eval.PhotoEvalError, match="factor 1.1: 1.1 × 16 px = 17.6 px"):
    photo_eval.evaluate_photos(*teacher, *teacher, photos, [], _spec(factors=(1.1,)))
  with pytest.raises(photo_eval.PhotoEvalError, match="view 'tiles'"):
    _spec(views=("whole", "tiles"))  # before any compute


def _hf_export(folder):
  """A linear student of the tiny HF DINOv2 (its teacher's weights, elu1 attention), 28 px."""
  model_cfg = vit_checkpoint.model_config_from_init(config_lib.base_config().model.to_dict(), HF)
  kw = build.model_kwargs(model_cfg)
  teacher = vit.Model(**kw, attention="softmax")
  shapes = jax.eval_shape(teacher.init, jax.random.PRNGKey(0), np.zeros((1, 28, 28, 3)))
  params = vit.load(shapes["params"], HF, kw)
  c = config_lib.base_config()
  with c.unlocked():
    c.data.image_size = 28
    c.data.pp_eval = 'decode|resize_small(32)|central_crop(28)|vgg_value_range|keep("image")'
    c.teacher.init, c.stages = HF, ()
  cfg = export_folder.student_config(kw, "elu1", c, {})
  export_folder.save(str(folder), params, cfg)
  return str(folder)


def test_cli_writes_json_and_bad_photos_is_one_line(tmp_path, capsys):
  student = _hf_export(tmp_path / "student")
  folder = str(tmp_path / "photos")
  write_photos(folder, 6, seed=2)
  out = str(tmp_path / "r.json")
  args = ["--student", student, "--teacher", HF, "--photos", folder, "--factors", "1,2"]
  assert compare.main([*args, "--out", out]) == 0
  printed = capsys.readouterr().out
  with open(out) as f:
    results = json.load(f)
  assert results["n_test"] + results["n_val"] == 6 and results["res"] == 28
  assert [r["size"] for r in results["rows"]] == [28, 28, 56, 56]
  assert 0 < results["rows"][0]["patch_cosine"]["mean"] < 1
  assert "too_few" in results and "cls cosine" in printed and "wrote" in printed
  assert "crop_retrieval" in results and "  crop retrieval" in printed
  test, val, names = photo_eval.split_folder(folder)
  assert sorted(names) == sorted(os.path.basename(p) for p in test) and not set(test) & set(val)

  bad = str(tmp_path / "nowhere")
  assert compare.main(["--student", student, "--teacher", HF, "--photos", bad]) == 2
  err = capsys.readouterr().err
  assert err.startswith("error: --photos") and err.count("\n") == 1
  (tmp_path / "empty").mkdir()
  assert (
      compare.main(["--student", student, "--teacher", HF, "--photos", str(tmp_path / "empty")])
      == 2
  )
  err = capsys.readouterr().err
  assert err.startswith("error: ") and "no image files" in err and err.count("\n") == 1
  assert compare.main([*args[:6], "--factors", "1,x"]) == 2
  assert "--factors" in capsys.readouterr().err
  # --holdout F: the photos are a training folder; only its test@F / val@F halves are used.
  write_photos(folder, 24, seed=4)
  assert compare.main([*args, "--holdout", "0.3", "--out", out]) == 0
  with open(out) as f:
    held = json.load(f)
  files = sorted(os.listdir(folder))
  expect = [len(image_folder.split_files(files, f"{s}@0.3")) for s in ("test", "val")]
  assert [held["n_test"], held["n_val"]] == expect and sum(expect) < len(files)
  assert compare.main([*args, "--holdout", "1.5"]) == 2
  assert "--holdout" in capsys.readouterr().err
  # --seen: the run's training share (train@F) is the test set; refused without a training folder.
  seen, seen_val, _ = photo_eval.split_folder(folder, 0.3, "train")
  trained = [files[i] for i in image_folder.split_files(files, "train@0.3")]
  assert sorted(os.path.basename(p) for p in seen) == sorted(trained) and not set(seen) & set(
      seen_val
  )
  for extra in (["--seen"], ["--seen", "--holdout", "0.3", "--val_photos", folder]):
    assert compare.main([*args, *extra]) == 2
    assert "error: --seen" in capsys.readouterr().err


def test_the_teachers_tokens_come_from_the_cache_the_second_time(teacher, photos, tmp_path):
  from linvit_jax.evaluation import feature_cache

  cache = feature_cache.FeatureCache(str(tmp_path / "cache"))
  student = _perturbed(teacher[1], 0.3)
  # batch 8 at these sizes: 14 test and 12 validation photos are two batches each, one past
  # the three that always run (the compile and two timed batches).
  many = photos + write_photos(str(tmp_path / "more"), 16, seed=3)
  # (crop retrieval's teacher features and the cache: test_crop_retrieval)
  spec = _spec(
      factors=(1,), views=("whole",), bootstrap=50, dense_k=4, min_photos=2, retrieval_crops=0
  )
  run = lambda params, c: photo_eval.evaluate_photos(  # noqa: E731
      teacher[0], params, teacher[0], student, many[:14], many[14:], spec, cache=c
  )
  plain = run(teacher[1], None)
  first, second = run(teacher[1], cache), run(teacher[1], cache)
  assert "teacher_cache" not in plain
  assert first["teacher_cache"]["hits"] == 0 and first["teacher_cache"]["computed"] == 4
  assert (second["teacher_cache"]["hits"], second["teacher_cache"]["computed"]) == (1, 3)
  assert second["teacher_cache"]["saved_seconds"] > 0  # the stored batch's own forward time
  for a, b in ((plain, second), (first, second)):
    ra, rb = a["rows"][0], b["rows"][0]
    assert ra["cls_cosine"] == rb["cls_cosine"] and ra["patch_cosine"] == rb["patch_cosine"]
    assert ra["dense"] == rb["dense"]
  assert second["rows"][0]["teacher_images_per_s"] > 0  # still measured on the timed batches
  assert second["rows"][0]["teacher_timed_images"] == 16  # two batches of 8, compile excluded
  changed = run(_perturbed(teacher[1], 1e-3), cache)  # one changed weight: every batch misses
  assert changed["teacher_cache"]["hits"] == 0
