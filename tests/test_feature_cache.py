"""feature_cache: the teacher's k-NN features computed once per (params, model, batches) and read
back by later runs; a changed number, count or photo misses; a bad entry is computed again."""

import os

import numpy as np
import pytest

from linvit_jax import report
from linvit_jax.evaluation import feature_cache


def _params(scale=1.0):
  rs = np.random.RandomState(0)
  return {"b": {"w": scale * rs.randn(6, 4).astype(np.float32)}, "a": np.arange(3.0)}


def test_params_digest_is_by_content():
  d = feature_cache.params_digest(_params())
  reordered = {"a": np.arange(3.0), "b": {"w": _params()["b"]["w"]}}
  assert feature_cache.params_digest(reordered) == d
  changed = _params()
  changed["b"]["w"][2, 1] += 1e-6
  assert feature_cache.params_digest(changed) != d
  as_f16 = {"a": np.arange(3.0), "b": {"w": _params()["b"]["w"].astype(np.float16)}}
  assert feature_cache.params_digest(as_f16) != d
  renamed = {"a": np.arange(3.0), "c": {"w": _params()["b"]["w"]}}
  assert feature_cache.params_digest(renamed) != d


def test_digest_of_object_and_bfloat16_arrays():
  import ml_dtypes

  names = {"a": np.array(["x", None], object)}
  assert feature_cache.params_digest(names) == feature_cache.params_digest(
      {"a": np.array(["x", None], object)}
  )
  w = np.ones((2, 3), ml_dtypes.bfloat16)
  assert feature_cache.params_digest({"w": w}) != feature_cache.params_digest({"w": w * 2})


def test_batch_digest_passes_batches_through():
  batches = [{"image": np.ones((2, 3)), "label": np.array([0, 1])} for _ in range(3)]
  tap = feature_cache.BatchDigest(iter(batches))
  assert list(tap) == batches and tap.num_batches == 3
  again = feature_cache.BatchDigest(batches)
  list(again)
  assert again.hexdigest() == tap.hexdigest()
  other = feature_cache.BatchDigest(batches[:2])
  list(other)
  assert other.hexdigest() != tap.hexdigest()


def test_cache_dir_from_the_environment(monkeypatch, tmp_path):
  monkeypatch.setenv("HOME", str(tmp_path))
  monkeypatch.delenv(feature_cache.ENV_VAR, raising=False)
  assert feature_cache.cache_dir() == str(tmp_path / ".cache" / "linvit_jax" / "features")
  for off in ("", "off", "None", " 0 "):
    monkeypatch.setenv(feature_cache.ENV_VAR, off)
    assert feature_cache.cache_dir() is None and feature_cache.FeatureCache.from_env() is None
  monkeypatch.setenv(feature_cache.ENV_VAR, str(tmp_path / "c"))
  assert feature_cache.FeatureCache.from_env().directory == str(tmp_path / "c")


# ------------------------------------------------------------------------------------------------
# report.knn_retention with a fake input pipeline and fake models (numpy), counting teacher runs


class _Fake:
  """A config with eval.knn, model and data; images per split from a seed; models as matrices."""

  def __init__(self, tmp_path, monkeypatch):
    self.calls = {"teacher": 0, "student": 0}
    self.seed = {"train": 0, "test": 1}
    ns = lambda **kw: type("NS", (), kw)()  # noqa: E731
    self.knn = ns(dataset="fake", k=3, temperature=0.07, label_key="label", train_split="train",
                  eval_split="test", train_examples=12, eval_examples=6)  # fmt: skip
    self.config = ns(eval=ns(knn=self.knn), model={"width": 4}, data=ns(image_size=5))
    monkeypatch.setenv(feature_cache.ENV_VAR, str(tmp_path / "cache"))
    monkeypatch.setattr(report.build, "knn_batches", self.batches)
    monkeypatch.setattr(report.build, "knn_pp", lambda config: "resize(5)")
    monkeypatch.setattr(report.evaluate, "pooled_features", self.features)

  def batches(self, config, split, limit):
    rs = np.random.RandomState(self.seed[split])
    for start in range(0, limit, 4):
      n = min(4, limit - start)
      yield {"image": rs.randn(n, 6).astype(np.float32), "label": np.arange(start, start + n) % 2}

  def features(self, model, params, batches, label_key):
    self.calls[model] += 1
    batches = list(batches)  # consumed, as the real one does (the digest needs every batch)
    feats = np.concatenate([b["image"] @ params["b"]["w"] for b in batches])
    return feats, np.concatenate([b[label_key] for b in batches]).astype(np.int64)

  def run(self, teacher_params=None):
    teacher_params = _params() if teacher_params is None else teacher_params
    return report.knn_retention(self.config, "teacher", teacher_params, "student", _params(0.5))


def test_second_run_reads_the_teachers_features(tmp_path, monkeypatch):
  fake = _Fake(tmp_path, monkeypatch)
  first = fake.run()
  assert fake.calls == {"teacher": 2, "student": 2}  # one pass per split each
  assert first["teacher_features_cached"] is False and "teacher_features_saved_seconds" not in first
  assert len(os.listdir(tmp_path / "cache")) == 2  # one entry per split
  second = fake.run()
  assert fake.calls == {"teacher": 2, "student": 4}  # the student always runs, the teacher not
  assert second["teacher_features_cached"] is True and second["teacher_features_saved_seconds"] >= 0
  for key in ("teacher_top1", "student_top1", "retention", "cls_cosine", "cls_cosine_min"):
    assert second[key] == first[key], key
  assert (second["train_examples"], second["eval_examples"]) == (12, 6)


def test_changed_param_count_or_images_miss(tmp_path, monkeypatch):
  fake = _Fake(tmp_path, monkeypatch)
  fake.run()
  changed = _params()
  changed["a"][0] = 7.0  # a leaf the fake teacher does not even read: the key is the params
  assert fake.run(changed)["teacher_features_cached"] is False
  assert fake.calls["teacher"] == 4
  fake.knn.train_examples = 8  # the train split misses, the eval split still hits
  out = fake.run()
  assert fake.calls["teacher"] == 5 and out["teacher_features_cached"] is False
  assert out["teacher_features_saved_seconds"] >= 0  # what the hit on the eval split saved
  fake.seed["test"] = 2  # same dataset name, split and count; other photos
  assert fake.run()["teacher_features_cached"] is False
  assert fake.calls["teacher"] == 6


def test_corrupt_or_foreign_entry_is_computed_again(tmp_path, monkeypatch, caplog):
  fake = _Fake(tmp_path, monkeypatch)
  expected = fake.run()
  entries = sorted((tmp_path / "cache").iterdir())
  entries[0].write_bytes(b"PK\x03\x04 torn")  # a zip header and nothing after it
  entries[1].write_bytes(b"")
  out = fake.run()
  assert fake.calls["teacher"] == 4 and out["teacher_features_cached"] is False
  assert out["teacher_top1"] == expected["teacher_top1"]
  assert "unreadable" in caplog.text
  assert fake.run()["teacher_features_cached"] is True  # rewritten by the run that recovered
  # An entry renamed to another key's name is not trusted.
  a, b = sorted((tmp_path / "cache").iterdir())
  a.write_bytes(b.read_bytes())
  assert fake.run()["teacher_features_cached"] is False


def test_disabled_cache_computes_every_time(tmp_path, monkeypatch):
  fake = _Fake(tmp_path, monkeypatch)
  monkeypatch.setenv(feature_cache.ENV_VAR, "")
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  for _ in range(2):
    assert fake.run()["teacher_features_cached"] is False
  assert fake.calls["teacher"] == 4
  assert not (tmp_path / "cache").exists() and not (tmp_path / "home").exists()


def test_unwritable_cache_is_a_warning(tmp_path, monkeypatch, caplog):
  fake = _Fake(tmp_path, monkeypatch)
  (tmp_path / "file").write_text("not a directory")
  monkeypatch.setenv(feature_cache.ENV_VAR, str(tmp_path / "file" / "cache"))
  out = fake.run()
  assert out["teacher_features_cached"] is False and "could not write" in caplog.text
  assert fake.run()["teacher_features_cached"] is False


def test_get_and_put_roundtrip(tmp_path):
  cache = feature_cache.FeatureCache(str(tmp_path))
  parts = {"what": "x", "n": 3}
  assert cache.get(parts) is None
  assert cache.put(parts, {"features": np.ones((3, 2), np.float32), "seconds": np.float64(1.5)})
  got = cache.get(parts)
  assert got["features"].dtype == np.float32 and float(got["seconds"]) == 1.5
  assert cache.get({"what": "x", "n": 4}) is None
  assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]  # written atomically


if __name__ == "__main__":
  pytest.main([__file__])
