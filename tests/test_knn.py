"""The downstream measure: DINO's weighted k-NN (evaluate.knn_top1) and its place in a run."""

import json
import os

import numpy as np
import pytest
from PIL import Image

from linvit_jax import report
from linvit_jax import run as run_lib
from linvit_jax.evaluation import evaluate
from linvit_jax.evaluation import feature_cache
from linvit_jax.evaluation import summary
from linvit_jax.runtime.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_knn_separable_clusters_and_chance():
  rs = np.random.RandomState(0)
  centers = rs.randn(4, 16) * 5
  train_y, test_y = rs.randint(0, 4, 400), rs.randint(0, 4, 200)
  train_x = centers[train_y] + rs.randn(400, 16)
  test_x = centers[test_y] + rs.randn(200, 16)
  assert evaluate.knn_top1(train_x, train_y, test_x, test_y) == 1.0
  shuffled = evaluate.knn_top1(train_x, rs.permutation(train_y), test_x, test_y)
  assert 0.1 < shuffled < 0.45  # chance is 0.25


def test_knn_votes_are_weighted_by_similarity():
  """One very close neighbour of class 1 outvotes two distant ones of class 0 (a majority vote
  would not): the exp(sim / T) weights of DINO's protocol."""
  train = np.array([[1.0, 0.0], [0.6, 0.8], [0.6, -0.8]])
  labels = np.array([1, 0, 0])
  test = np.array([[1.0, 0.01]])
  assert evaluate.knn_top1(train, labels, test, np.array([1]), k=3, temperature=0.07) == 1.0
  assert evaluate.knn_top1(train, labels, test, np.array([1]), k=3, temperature=100.0) == 0.0
  with pytest.raises(ValueError, match="at least k"):
    evaluate.knn_top1(train, labels, test, np.array([1]), k=4)


def _labelled_folder(root, classes=("a", "b"), per_class=12):
  rs = np.random.RandomState(1)
  for c, name in enumerate(classes):
    os.makedirs(os.path.join(root, name), exist_ok=True)
    for i in range(per_class):
      pixels = np.zeros((40, 40, 3), np.uint8)
      pixels[..., c % 3] = 200  # each class its own colour, plus noise
      pixels = np.clip(pixels + rs.randint(0, 40, pixels.shape), 0, 255).astype(np.uint8)
      Image.fromarray(pixels).save(os.path.join(root, name, f"{i}.png"))


def _config(tmp_path, knn_folder, **knn):
  import configs.convert_folder as cf

  photos = tmp_path / "photos"
  _labelled_folder(str(photos), per_class=4)
  folder = os.path.join(ROOT, "tests", "data", "foreign", "hf_dinov2")
  c = cf.get_config(
      f"init={folder},images={photos},res=28,tiny=True,batch=4,max_images=8,"
      f"knn=image_folder:{knn_folder},holdout=0.5,softmax_layers=0"
  )
  c.stages = ()  # evaluation only: no distillation to pick a softmax layer after
  c.eval.plots, c.eval.resolution_factors = False, ()
  c.eval.knn.update({"k": 5, **knn})
  return c


def _cache_entries(directory, what: str) -> int:
  """How many entries under `directory` hold features of kind `what` (their stored key parts)."""
  count = 0
  for name in os.listdir(directory):
    with np.load(os.path.join(directory, name), allow_pickle=False) as data:
      count += json.loads(str(data[feature_cache._PARTS]))["what"] == what
  return count


def test_knn_on_a_labelled_folder_in_the_report(tmp_path, monkeypatch, capsys):
  monkeypatch.setenv(feature_cache.ENV_VAR, str(tmp_path / "cache"))
  _labelled_folder(str(tmp_path / "labelled"))
  config = _config(tmp_path, tmp_path / "labelled")
  results = run_lib.run(config, str(tmp_path / "work"))
  knn = results["knn"]
  # Each model's features on each split show a bar (the report is silent for minutes otherwise).
  err = capsys.readouterr().err
  for bar in ("k-NN, student, train", "k-NN, student, eval", "k-NN, teacher, train"):
    assert bar in err, bar
  assert knn["teacher_features_cached"] is False
  # The teacher's k-NN features, one entry per split (photo evaluation keeps its own entries).
  assert _cache_entries(tmp_path / "cache", "pooled_features(head_input)") == 2
  assert knn["dataset"].endswith("labelled") and knn["k"] == 5
  assert knn["train_examples"] + knn["eval_examples"] == 24
  assert knn["teacher_top1"] == 1.0  # two colours: trivially separable for any feature
  assert 0 <= knn["retention"] <= 1.0 + 1e-9
  assert "k-NN top-1 (k=5" in summary.format_summary(results)
  # The converted (untrained) linear student is not the teacher: its cosine is below 1.
  assert -1.0 <= knn["cls_cosine_min"] <= knn["cls_cosine"] < 0.9999
  assert "pooled-feature cosine to the teacher on those 24 images" in summary.format_summary(
      results
  )
  card = json.loads((tmp_path / "work" / "student_config.json").read_text())
  assert card["fidelity"]["knn"]["teacher_top1"] == 1.0
  assert card["fidelity"]["knn"]["cls_cosine"] == pytest.approx(knn["cls_cosine"])
  # A second run of the same teacher on the same photos reads the teacher's features back (the
  # real pipeline gives the same batches twice, and the real params hash the same).
  again = run_lib.run(config, str(tmp_path / "work2"))["knn"]
  assert again["teacher_features_cached"] is True and "teacher_features_saved_seconds" in again
  for key in ("teacher_top1", "student_top1", "cls_cosine", "cls_cosine_min"):
    assert again[key] == pytest.approx(knn[key], abs=1e-6), key


def test_knn_set_doubles_as_a_fidelity_sample(monkeypatch):
  """knn_retention's cls cosine pairs each image's teacher and student features (reference and
  classified images alike); when the labels show another order it is left out, not mis-paired."""
  rs = np.random.RandomState(0)
  teacher = {"train": rs.randn(30, 8), "test": rs.randn(10, 8)}
  angles = {"train": rs.uniform(0, 1.2, 30), "test": rs.uniform(0, 1.2, 10)}
  labels = {"train": np.arange(30) % 3, "test": np.arange(10) % 3}

  def rotated(x, angle):  # the same norm, at a known angle to x in the plane of dims 0 and 1
    x = x.copy()
    x[:, 2:] = 0.0
    c, s = np.cos(angle), np.sin(angle)
    return np.stack([c * x[:, 0] - s * x[:, 1], s * x[:, 0] + c * x[:, 1]], 1)

  swap_labels = {"on": False}

  def fake_features(model, params, batches, label_key):
    split = batches
    if model == "teacher":
      feats = teacher[split].copy()
      feats[:, 2:] = 0.0
      return feats[:, :2], labels[split]
    y = labels[split][::-1] if swap_labels["on"] else labels[split]
    return rotated(teacher[split], angles[split]), y

  monkeypatch.setenv(feature_cache.ENV_VAR, "")  # batches here are split names, not arrays
  monkeypatch.setattr(report.evaluate, "pooled_features", fake_features)
  monkeypatch.setattr(report, "_knn_batches", lambda config, split, n, desc: split)
  monkeypatch.setattr(report.evaluate, "knn_top1", lambda *a, **k: 0.5)
  knn = type("K", (), {})()
  knn.dataset, knn.k, knn.temperature, knn.label_key = "fake", 5, 0.07, "labels"
  knn.train_split, knn.eval_split, knn.train_examples, knn.eval_examples = "train", "test", 30, 10
  config = type("C", (), {"eval": type("E", (), {"knn": knn})()})()
  out = report.knn_retention(config, "teacher", None, "student", None)
  expected = np.cos(np.concatenate([angles["train"], angles["test"]]))
  assert out["cls_cosine"] == pytest.approx(expected.mean(), abs=1e-9)
  assert out["cls_cosine_min"] == pytest.approx(expected.min(), abs=1e-9)
  swap_labels["on"] = True
  assert "cls_cosine" not in report.knn_retention(config, "teacher", None, "student", None)


def test_knn_set_with_one_class_fails_before_compute(tmp_path, monkeypatch):
  _labelled_folder(str(tmp_path / "one"), classes=("only",))
  config = _config(tmp_path, tmp_path / "one")
  monkeypatch.setattr(run_lib.surgery, "transplant", lambda *a, **k: pytest.fail("computed"))
  with pytest.raises(ConfigError, match=r"eval.knn.dataset=.*1 class\(es\)"):
    run_lib.run(config, str(tmp_path / "work"))


def test_knn_bad_values_are_named(tmp_path):
  _labelled_folder(str(tmp_path / "labelled"))
  with pytest.raises(ConfigError, match=r"eval.knn: k=0"):
    run_lib.run(_config(tmp_path, tmp_path / "labelled", k=0), str(tmp_path / "w"))
  with pytest.raises(ConfigError, match=r"eval.knn.k=50: more neighbours"):
    run_lib.run(_config(tmp_path, tmp_path / "labelled", k=50), str(tmp_path / "w2"))


def test_knn_paired_counts_each_query_as_knn_top1_does():
  # tools/knn_paired's per-query rule is evaluate.knn_top1's: their means agree.
  from tools import knn_paired

  rs = np.random.RandomState(0)
  train, test = rs.randn(60, 8), rs.randn(25, 8)
  train_labels, test_labels = rs.randint(0, 3, 60), rs.randint(0, 3, 25)
  hits = knn_paired.query_hits(train, train_labels, test, test_labels, k=5, temperature=0.07)
  assert set(np.unique(hits)) <= {0.0, 1.0} and len(hits) == 25
  expected = evaluate.knn_top1(train, train_labels, test, test_labels, k=5, temperature=0.07)
  assert hits.mean() == pytest.approx(expected)


def test_knn_paired_main_with_the_teacher_on_a_labelled_folder(tmp_path):
  """tools/knn_paired end to end: two exported students and the teacher on an image_folder k-NN
  set of --knn_train / --knn_eval images, query by query; each student's retention with its
  interval, and the pair's difference."""
  from tests.test_photo_eval import HF
  from tests.test_photo_eval import _hf_export
  from tools import knn_paired

  _labelled_folder(str(tmp_path / "labelled"), per_class=20)
  _labelled_folder(str(tmp_path / "photos"), per_class=4)
  student = _hf_export(tmp_path / "student")
  out = tmp_path / "knn.json"
  argv = ["--teacher", HF, "--photos", str(tmp_path / "photos"), "--out", str(out)]
  argv += ["--knn", f"image_folder:{tmp_path / 'labelled'}", "--knn_train", "24"]
  argv += ["--knn_eval", "8", "--with_teacher", student, student]
  assert knn_paired.main(argv) == 0
  result = json.loads(out.read_text())
  assert result["train_examples"] == 24 and result["eval_examples"] == 8
  n = result["teacher"]["n"]
  assert 0 < n <= 16  # at most --knn_eval, batched; this folder's eval split holds fewer
  row = result["students"][student]
  assert row["n"] == n and 0 <= row["top1"] <= 1
  assert row["retention"] == pytest.approx(row["top1"] / result["teacher"]["top1"])
  assert row["retention_ci"][0] <= row["retention"] <= row["retention_ci"][1]
  pair = result["paired"][0]
  assert pair["delta_top1"] == 0 and pair["only_ref_right"] == pair["only_arm_right"] == 0
  # The run's own checks on the set: fewer references than k (a folder of 8 here), --knn none.
  _labelled_folder(str(tmp_path / "small"), per_class=4)
  small = [*argv[:4], "--out", str(out), "--knn", f"image_folder:{tmp_path / 'small'}"]
  with pytest.raises(SystemExit, match=r"k=20: more neighbours than the \d+ reference"):
    knn_paired.main([*small, student, student])
  with pytest.raises(SystemExit, match="--knn none"):
    knn_paired.main([*argv[:4], "--out", str(out), "--knn", "none", student, student])


def test_ratio_interval_holds_the_ratio_and_narrows_with_more_queries():
  from tools import knn_paired

  rs = np.random.RandomState(0)
  teacher = (rs.rand(4000) < 0.7).astype(float)
  student = teacher * (rs.rand(4000) < 0.95)  # loses 5 % of the teacher's right answers
  wide = knn_paired.ratio_interval(student[:400], teacher[:400])
  narrow = knn_paired.ratio_interval(student, teacher)
  assert wide[0] < 0.95 < wide[1] and narrow[0] < 0.95 < narrow[1]
  assert narrow[1] - narrow[0] < 0.6 * (wide[1] - wide[0])
  # Paired: the queries resampled together. Resampling each model's queries apart (what a
  # comparison of two unpaired top-1s does) gives a wider interval for the same data.
  rs = np.random.RandomState(1)
  apart = [
      student[rs.randint(0, 4000, 4000)].mean() / teacher[rs.randint(0, 4000, 4000)].mean()
      for _ in range(1000)
  ]
  assert narrow[1] - narrow[0] < 0.5 * (np.percentile(apart, 97.5) - np.percentile(apart, 2.5))
