"""Crop retrieval (evaluation/crop_retrieval.py, photo_eval's "crop_retrieval" block): seeded
crop boxes, top-1 by cosine within each model's features, retention, the absent cases and the
teacher's crop features from the cache; the tiny 16-px ViT of test_photo_eval, or stand-in
feature functions where a known answer is wanted."""

import os
import types

import jax
import numpy as np
import pytest
from PIL import Image

from linvit_jax.data import inference_pp
from linvit_jax.evaluation import crop_retrieval
from linvit_jax.evaluation import feature_cache
from linvit_jax.evaluation import photo_eval
from linvit_jax.models import vit
from tests.helpers.student_export import FIELDS
from tests.helpers.student_export import PP
from tests.helpers.tiny_teacher import smooth_photos


@pytest.fixture(scope="module")
def teacher():
  model = vit.Model(**FIELDS, attention="softmax")
  params = model.init(jax.random.PRNGKey(0), np.zeros((1, 16, 16, 3), np.float32))["params"]
  return model, jax.tree.map(np.asarray, params)


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
  folder = str(tmp_path_factory.mktemp("photos"))
  smooth_photos(folder, 6)
  return sorted(os.path.join(folder, f) for f in os.listdir(folder))


def _spec(**kw) -> photo_eval.PhotoEvalSpec:
  base = {"factors": (1,), "views": ("whole",), "bootstrap": 100, "dense_k": 0, "min_photos": 2}
  return photo_eval.PhotoEvalSpec(pp=PP, res=16, **{**base, **kw})


def test_the_teacher_as_its_own_student_retains_every_retrieval(teacher, photos):
  out = photo_eval.evaluate_photos(*teacher, *teacher, photos, [], _spec())
  r = out["crop_retrieval"]
  assert out["retrieval_crops"] == 8
  assert (r["n_photos"], r["crops_per_photo"], r["n_queries"], r["size"]) == (6, 8, 48, 16)
  assert r["feature"] == "cls token" and r["chance"] == pytest.approx(1 / 6)
  assert r["student_top1"] == r["teacher_top1"] and r["retention"] == 1.0
  t = r["teacher_top1"]
  assert t["mean"] > 1 / 6 and t["lo"] <= t["mean"] <= t["hi"] and t["n"] == 6
  line = photo_eval.format_table(out).splitlines()[-1]
  assert line.startswith("  crop retrieval (8 random crops of each of 6 photos at 16 px")
  assert "retention 1.000" in line


def test_the_same_seed_gives_the_same_crops(photos):
  draws = crop_retrieval.crop_draws(5, 8, seed=3)
  np.testing.assert_array_equal(draws, crop_retrieval.crop_draws(5, 8, seed=3))
  assert not np.array_equal(draws, crop_retrieval.crop_draws(5, 8, seed=4))
  for height, width in ((60, 80), (300, 290), (200, 20)):  # the last: too tall for some boxes
    for draw in draws.reshape(-1, 4):
      top, left, h, w = crop_retrieval.crop_box(height, width, draw)
      assert 0 <= top <= height - h and 0 <= left <= width - w
      assert 0.08 <= h * w / (height * width) <= 0.52  # 10-50 %, less the rounding to pixels
      if (height, width) != (200, 20):
        assert 3 / 4 - 0.05 <= w / h <= 4 / 3 + 0.05
  # The crops a run makes: the same photo and seed, the same pixels.
  pp = inference_pp.Preprocess(photo_eval.view_pp("whole", 16, photo_eval.value_ops(PP)))
  original = inference_pp.decode(photos[0])
  whole, crops = crop_retrieval.photo_images(original, draws[0], pp)
  again = crop_retrieval.photo_images(original, crop_retrieval.crop_draws(5, 8, seed=3)[0], pp)
  assert whole.shape == (16, 16, 3) and crops.shape == (8, 16, 16, 3)
  np.testing.assert_array_equal(crops, again[1])


class _Features:
  """photo_tokens.Tokens' features() from a function of the images (a stand-in model)."""

  model = types.SimpleNamespace(patch_size=(4, 4), pool_type="tok", num_prefix_tokens=1)

  def __init__(self, fn):
    self.fn = fn

  def features(self, images, batch):
    assert len(images) <= batch
    return self.fn(images)


def test_a_student_with_random_features_retrieves_worse_than_the_teacher(tmp_path):
  # Six distinct photos: each its own colour under a texture; any crop keeps its photo's colour.
  rs = np.random.RandomState(0)
  paths = []
  for i, colour in enumerate(np.eye(3).tolist() + (1 - np.eye(3)).tolist()):
    texture = 0.6 + 0.4 * rs.rand(50 + 7 * i, 70, 1)
    paths.append(str(tmp_path / f"p{i}.png"))
    Image.fromarray((255 * texture * np.asarray(colour)).astype(np.uint8)).save(paths[-1])
  mean_colour = _Features(lambda images: images.mean(axis=(1, 2)))
  noise = np.random.RandomState(1)
  random = _Features(lambda images: noise.randn(len(images), 3))
  pp = inference_pp.Preprocess(photo_eval.view_pp("whole", 16, "decode"))
  names = [f"p{i}" for i in range(6)]
  stat = lambda v: photo_eval.stat(v, names, 100, 0)  # noqa: E731
  out = crop_retrieval.evaluate(mean_colour, random, paths, pp, 16, 8, 0, stat)
  assert out["teacher_top1"]["mean"] == 1.0 and out["teacher_top1"]["worst"] == 1.0
  assert out["student_top1"]["mean"] < 0.6 and out["retention"] < 0.6
  assert out["student_top1"]["lo"] <= out["student_top1"]["mean"] <= out["student_top1"]["hi"]
  # top1_shares itself: photo 1's second crop points at photo 0.
  gallery = np.eye(3)
  queries = np.stack([gallery, gallery, gallery], 1) + 0.01
  queries[1, 1] = gallery[0]
  np.testing.assert_allclose(crop_retrieval.top1_shares(gallery, queries), [1, 2 / 3, 1])


def test_fewer_than_two_photos_is_reported_absent(teacher, photos):
  one = photo_eval.evaluate_photos(*teacher, *teacher, photos[:1], [], _spec())
  assert one["crop_retrieval"] == {"absent": "1 test photo: retrieval needs at least 2"}
  assert photo_eval.format_table(one).endswith(
      "crop retrieval: not measured (1 test photo: retrieval needs at least 2)"
  )
  none = photo_eval.evaluate_photos(*teacher, *teacher, [], photos, _spec())
  assert none["crop_retrieval"] == {"absent": "0 test photos: retrieval needs at least 2"}
  off = photo_eval.evaluate_photos(*teacher, *teacher, photos[:3], [], _spec(retrieval_crops=0))
  assert off["crop_retrieval"] == {"absent": "off (retrieval_crops = 0)"}
  with pytest.raises(photo_eval.PhotoEvalError, match="retrieval_crops -1"):
    _spec(retrieval_crops=-1)


def test_the_teachers_crop_features_come_from_the_cache_the_second_time(teacher, photos, tmp_path):
  cache = feature_cache.FeatureCache(str(tmp_path / "cache"))
  student = jax.tree.map(lambda x: x * 1.01, teacher[1])
  run = lambda: photo_eval.evaluate_photos(  # noqa: E731
      teacher[0], teacher[1], teacher[0], student, photos[:4], [], _spec(), cache=cache
  )
  first, second = run(), run()
  # The rows' one test batch runs every time (timed); crops: the gallery and 32 crops, 5 batches.
  assert (first["teacher_cache"]["hits"], first["teacher_cache"]["computed"]) == (0, 6)
  assert (second["teacher_cache"]["hits"], second["teacher_cache"]["computed"]) == (5, 1)
  assert first["crop_retrieval"] == second["crop_retrieval"]  # the same crops, the same answers
