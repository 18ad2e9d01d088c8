"""What a run measures of the final student after its stages, reading the config through
linvit_jax.build: how it scores a student as it goes (`Scorer`), k-NN retention, fidelity on the
eval view, resolution scaling, the test photos (evaluation/photo_eval.py), the MEASURES that fill
the results record, and the run's plots (drawn by evaluation/plots.py). The summary table the CLI
prints is evaluation/summary.py's."""

from __future__ import annotations

import dataclasses
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections as mlc
import numpy as np

from linvit_jax import build
from linvit_jax.data import pp_spec
from linvit_jax.evaluation import evaluate
from linvit_jax.evaluation import feature_cache
from linvit_jax.evaluation import photo_eval
from linvit_jax.evaluation import plots
from linvit_jax.evaluation import results as results_lib
from linvit_jax.models import vit
from linvit_jax.runtime import gfile
from linvit_jax.runtime import progress
from linvit_jax.runtime import tree
from linvit_jax.runtime.errors import ConfigError


@dataclasses.dataclass
class Scorer:
  """How a run scores a student as it goes: top-1 on the eval split (when labelled), fidelity to
  the teacher on held-out images (teacher-forced per layer, and end to end), and the cheap
  curves a stage draws every `eval_every` steps."""

  config: mlc.ConfigDict
  mesh: jax.sharding.Mesh
  labelled: bool
  teacher_model: Any
  teacher_params: Any
  sample: np.ndarray  # the fidelity / calibration images (build.sample_images)

  def top1(self, model: Any, params: Any, batches: Any = None) -> float | None:
    if not self.labelled:
      return None
    return evaluate.top1(model, params, batches or build.eval_batches(self.config), self.mesh)

  def fidelity_images(self) -> np.ndarray:
    """The first eval.fidelity_images images of the sample: what fidelity is measured on."""
    return self.sample[: self.config.eval.fidelity_images]

  def fidelity(self, model: Any, params: Any) -> results_lib.Fidelity:
    """Per layer (teacher-forced) and end to end, on `fidelity_images`."""
    images = self.fidelity_images()
    t, tp = self.teacher_model, self.teacher_params
    return results_lib.Fidelity(
        layers=evaluate.attention_fidelity(t, tp, model, params, images),
        end_to_end=evaluate.end_to_end_fidelity(t, tp, model, params, images),
    )

  def throughput_batch(self) -> np.ndarray:
    """The sample, cycled to eval.throughput_batch images: what images/s is timed on."""
    n = self.config.eval.throughput_batch
    tb = self.sample[:n]
    return tb if len(tb) == n else np.resize(tb, (n,) + tb.shape[1:])

  def curve_fn(self, model: Any) -> Callable[[Any], dict[str, float]]:
    """A stage's `eval_fn`: the first `curve_examples` test images (top-1) and `curve_images`
    held-out images (fidelity to the teacher): cheap enough to draw every few steps."""
    config = self.config
    correct = evaluate.correct_fn(model, config.data.label_key) if self.labelled else None
    curve_images = self.sample[: max(1, min(len(self.sample), config.eval.curve_images))]

    def eval_fn(params):
      scores = {}
      if correct is not None:
        batches = build.eval_batches(config, max_examples=config.eval.curve_examples)
        scores["top1"] = evaluate.evaluate(params, correct, batches, self.mesh)["top1"]
      if self.teacher_params is not None:
        e2e = evaluate.end_to_end_fidelity(
            self.teacher_model, self.teacher_params, model, params, curve_images
        )
        scores.update({k: v for k, v in e2e.items() if isinstance(v, float)})
        scores["block_cosine_min"] = float(min(e2e["block_cosine"]))
      return scores

    return eval_fn


def knn_retention(config, teacher_model, teacher_params, student_model, student_params) -> dict:
  """Weighted k-NN top-1 of teacher and student on eval.knn's set, and their ratio.

  The teacher's features come from the feature cache when an earlier run computed them for the
  same params and the same batches (`teacher_features_cached`; `teacher_features_seconds` is what
  getting them cost this run, `teacher_features_saved_seconds` what computing them cost then)."""
  knn = config.eval.knn
  out = {"dataset": knn.dataset, "k": knn.k}
  cache = feature_cache.FeatureCache.from_env()
  splits = {
      "train": (knn.train_split, knn.train_examples),
      "eval": (knn.eval_split, knn.eval_examples),
  }
  # The student goes first: the digest of the batches it saw is part of the teacher's key.
  student, digests = _student_knn_features(config, splits, student_model, student_params, cache)
  t0 = time.perf_counter()
  teacher, hits, saved_s = _teacher_knn_features(
      config, splits, teacher_model, teacher_params, cache, digests
  )
  out["teacher_features_cached"] = hits == len(splits)
  out["teacher_features_seconds"] = time.perf_counter() - t0
  if hits:
    out["teacher_features_saved_seconds"] = saved_s
  for who, feats in (("teacher", teacher), ("student", student)):
    out[f"{who}_top1"] = evaluate.knn_top1(
        *feats["train"], *feats["eval"], k=knn.k, temperature=knn.temperature
    )
  out["train_examples"], out["eval_examples"] = len(teacher["train"][0]), len(teacher["eval"][0])
  out["retention"] = out["student_top1"] / max(out["teacher_top1"], 1e-12)
  # The same images reach both models in the same order (the batches are deterministic), so the
  # set doubles as a fidelity sample far larger than the held-out photos: unseen, though from
  # another domain than the user's photos.
  t_feats, t_labels = (np.concatenate([teacher[p][i] for p in splits]) for i in (0, 1))
  s_feats, s_labels = (np.concatenate([student[p][i] for p in splits]) for i in (0, 1))
  if len(t_feats) == len(s_feats) and np.array_equal(t_labels, s_labels):
    cosine = evaluate.row_cosine(t_feats, s_feats)
    out["cls_cosine"], out["cls_cosine_min"] = float(cosine.mean()), float(cosine.min())
  return out


def _student_knn_features(config, splits, model, params, cache) -> tuple[dict, dict]:
  """The student's (features, labels) per k-NN split, and the digest of each split's batches
  (BatchDigest, only with a cache: it keys the teacher's features)."""
  features, digests = {}, {}
  for part, (split, limit) in splits.items():
    batches = _knn_batches(config, split, limit, f"k-NN, student, {part}")
    if cache is not None:
      batches = digests[part] = feature_cache.BatchDigest(batches)
    features[part] = evaluate.pooled_features(model, params, batches, config.eval.knn.label_key)
  return features, digests


def _teacher_knn_features(config, splits, model, params, cache, digests) -> tuple[dict, int, float]:
  """The teacher's (features, labels) per k-NN split, from the cache where it holds them (keyed
  by the student's batch digests), else computed and stored; with the cache hits and the seconds
  they saved."""
  teacher, hits, saved_s = {}, 0, 0.0
  params_digest = feature_cache.params_digest(params) if cache is not None else None
  for part, (split, limit) in splits.items():
    parts = None
    if params_digest is not None:
      parts = _knn_key_parts(config, params_digest, split, limit, digests[part].hexdigest())
      entry = cache.get(parts)
      if entry is not None:
        teacher[part] = (entry["features"], entry["labels"])
        hits, saved_s = hits + 1, saved_s + float(entry["seconds"])
        continue
    t_part = time.perf_counter()
    batches = _knn_batches(config, split, limit, f"k-NN, teacher, {part}")
    if parts is not None:
      batches = feature_cache.BatchDigest(batches)
    teacher[part] = evaluate.pooled_features(model, params, batches, config.eval.knn.label_key)
    if parts is None:
      continue
    if batches.hexdigest() != parts["inputs"]:  # a pipeline that is not deterministic: no key
      logging.warning(
          "k-NN %s batches differ between two reads: teacher features not cached", split
      )
      continue
    features, labels = teacher[part]
    cache.put(parts, {"features": features, "labels": labels,
                      "seconds": np.float64(time.perf_counter() - t_part)})  # fmt: skip
  return teacher, hits, saved_s


def _knn_batches(config, split: str, limit: int, desc: str) -> Iterator[dict]:
  """build.knn_batches with a progress bar `desc` (its total from `limit`; 0, all: a counter)."""
  batches = build.knn_batches(config, split, limit)
  batch = getattr(config.eval.knn, "batch_size", None)
  total = -(-limit // batch) if limit and batch else None  # no batch size known: a counter
  return progress.iterate(batches, total, desc, "batch")


def _knn_key_parts(config, params_digest: str, split: str, limit: int, inputs: str) -> dict:
  """What the teacher's pooled features on one k-NN split depend on (feature_cache's key)."""
  knn = config.eval.knn
  return {
      "what": "pooled_features(head_input)",
      "params": params_digest,
      "model": tree.as_dict(config.model),
      "dataset": knn.dataset,
      "split": split,
      "examples": limit,
      "pp": build.knn_pp(config),
      "image_size": config.data.image_size,
      "inputs": inputs,  # sha256 of the batches themselves: a changed photo folder misses
      "backend": jax.default_backend(),
      "jax": jax.__version__,
  }


def eval_view_fidelity(
    config, teacher_model, teacher_params, student_model, student_params
) -> dict[str, Any] | None:
  """End-to-end fidelity on the held-out images as the exported student sees them (`pp_eval`:
  one whole-image view each, up to eval.fidelity_images), beside the random views of the run's
  fidelity sample; None when that sample already is the eval view (no `eval.sample_pp`)."""
  if not config.eval.sample_pp:
    return None
  images = build.eval_view_images(config, config.eval.fidelity_images)
  e2e = evaluate.end_to_end_fidelity(
      teacher_model, teacher_params, student_model, student_params, images
  )
  return {"images": len(images), **{k: v for k, v in e2e.items() if isinstance(v, float)}}


def resolution_scaling(
    config,
    mesh,
    teacher_model,
    teacher_params,
    student_model,
    student_params,
    labelled: bool,
    sample: np.ndarray,
    known: Mapping[str, float] | None = None,
):
  """Teacher and student at each factor × the training resolution (position embeddings
  resampled): top-1 when labelled, the student's end-to-end fidelity to the teacher at the same
  resolution, forward images/s and the compiled forward's peak memory (XLA's estimate).

  `known`: images/s the run already measured at the training resolution on the same batch
  ({"teacher": ..., "student": ...}): the factor-1 row reuses them."""
  known = known or {}
  rows = []
  size = config.data.image_size
  n_fid = max(1, min(len(sample), config.eval.resolution_fidelity_images))
  for factor in config.eval.resolution_factors:
    new = int(size * factor)
    grid = (new // config.model.patch_size[0], new // config.model.patch_size[1])
    row = {
        "factor": factor,
        "image_size": new,
        "tokens": grid[0] * grid[1]
        + (1 if config.model.pool_type == "tok" else 0)
        + config.model.reg_tokens,
    }
    # The normalised sample, resized (resizing commutes with the affine normalisation).
    images = np.asarray(
        jax.image.resize(jnp.asarray(sample), (len(sample), new, new, sample.shape[-1]), "bilinear")
    )
    tb = np.resize(images, (config.eval.throughput_batch,) + images.shape[1:])
    params = {}
    for name, model, p in (
        ("teacher", teacher_model, teacher_params),
        ("student", student_model, student_params),
    ):
      params[name] = evaluate.resample_for_resolution(p, grid)
      if labelled:
        pp = config.data.pp_eval if factor == 1 else pp_spec.with_resize(config.data.pp_eval, new)
        batches = build.eval_batches(config, pp, max_examples=config.eval.resolution_examples)
        row[f"{name}_top1"] = evaluate.top1(model, params[name], batches, mesh)
      measured = known.get(name) if factor == 1 else None
      row[f"{name}_images_per_s"] = measured or evaluate.images_per_second(model, params[name], tb)
      row[f"{name}_peak_bytes"] = evaluate.forward_peak_bytes(model, params[name], tb)
    e2e = evaluate.end_to_end_fidelity(
        teacher_model, params["teacher"], student_model, params["student"], images[:n_fid]
    )
    row.update({k: v for k, v in e2e.items() if isinstance(v, float)})
    rows.append(row)
  return rows


# ----------------------------------------------------------------------------- the test photos


def test_block(config) -> Any:
  """config.eval.test when it is on (a config recorded before the block existed has none)."""
  test = config.eval.get("test")
  return test if test is not None and test.split else None


def test_sets(config) -> tuple[list[str], list[str], list[str]]:
  """(test paths, their names, validation paths); a photo in both is a ConfigError: a choice made
  on a test photo would be reported as if it had not been."""
  test_paths, names = build.photo_paths(config, config.eval.test.split)
  val_paths, _ = build.photo_paths(config, config.data.eval_split, "data.eval_split")
  shared = sorted(set(test_paths) & set(val_paths))
  if shared:
    raise ConfigError(
        f"config.eval.test.split={config.eval.test.split!r} and data.eval_split="
        f"{config.data.eval_split!r} share {len(shared)} photo(s) (e.g. {shared[0]}): the run "
        "chooses on the eval split; use 'val@F' and 'test@F' (the two halves of holdout@F)"
    )
  return test_paths, names, val_paths


def test_photos(config, teacher_model, teacher_params, student_model, student_params) -> dict:
  """The student vs its teacher on the test photos (eval.test.split), reported and never chosen
  on: native sizes, intervals, the dense measure, whose parts and probes are fitted on the
  validation photos (data.eval_split, where the run made its choices). photo_eval.py."""
  test = config.eval.test
  test_paths, names, val_paths = test_sets(config)
  size = config.data.image_size
  spec = photo_eval.PhotoEvalSpec(
      pp=pp_spec.inference_pp(config.data.pp_eval),  # its decode and normalisation
      res=int(size[0] if isinstance(size, (tuple, list)) else size),
      factors=tuple(test.factors),
      views=tuple(test.views),
      bootstrap=test.bootstrap,
      dense_k=test.dense_k,
      min_photos=test.min_photos,
      seed=config.seed,
  )
  out = photo_eval.evaluate_photos(
      teacher_model,
      teacher_params,
      student_model,
      student_params,
      test_paths,
      val_paths,
      spec,
      test_names=names,
      cache=feature_cache.FeatureCache.from_env(),
  )
  return {"split": test.split, "val_split": config.data.eval_split, **out}


# ----------------------------------------------------------------------------- the measures


@dataclasses.dataclass(frozen=True)
class Measure:
  """One evaluation of the final student: `fn(scorer, model, params, record)` returns the value of
  the record's measure field `field` (results.measure), or None where it does not apply. `timing`:
  the timing_s part its seconds add to (None: the rest of the run)."""

  field: str
  fn: Callable[[Scorer, Any, Any, results_lib.Results], Any]
  timing: str | None = None


def _knn(s: Scorer, model, params, record) -> dict | None:
  if not s.config.eval.knn.dataset or s.teacher_params is None:
    return None
  return knn_retention(s.config, s.teacher_model, s.teacher_params, model, params)


def _eval_view(s: Scorer, model, params, record) -> dict | None:
  if s.teacher_params is None:
    return None
  return eval_view_fidelity(s.config, s.teacher_model, s.teacher_params, model, params)


def _test(s: Scorer, model, params, record) -> dict | None:
  if not test_block(s.config) or s.teacher_params is None:
    return None
  return test_photos(s.config, s.teacher_model, s.teacher_params, model, params)


def _exact_share(s: Scorer, model, params, record) -> list | None:
  if not any(spec.window or spec.sinks for spec in vit.layer_specs(model)):
    return None
  return evaluate.exact_shares(model, params, s.sample[: s.config.eval.fidelity_images])


def _student_speed(s: Scorer, model, params, record) -> float:
  return evaluate.images_per_second(model, params, s.throughput_batch())


def _matmul_rate(s: Scorer, model, params, record) -> float | None:
  if not any(record.histories or {}):  # no training step to read against it
    return None
  return evaluate.matmul_gflops()


def _teacher_speed(s: Scorer, model, params, record) -> float | None:
  if s.teacher_params is None:
    return None
  return evaluate.images_per_second(s.teacher_model, s.teacher_params, s.throughput_batch())


def _resolution(s: Scorer, model, params, record) -> list | None:
  if s.teacher_params is None:
    return None
  known = {"teacher": record.teacher_images_per_s, "student": record.student_images_per_s}
  return resolution_scaling(
      s.config, s.mesh, s.teacher_model, s.teacher_params, model, params, s.labelled, s.sample,
      known=known,
  )  # fmt: skip


# In the order they run (the resolution rows reuse the two images/s). A new measure: its function
# here (or in evaluate.py), one row, and its field in results.Results.
MEASURES = (
    Measure("knn", _knn, timing="knn"),
    Measure("eval_view_fidelity", _eval_view),
    Measure("test", _test, timing="test_photos"),
    Measure("exact_share", _exact_share),
    Measure("student_images_per_s", _student_speed, timing="speed_resolution_plots"),
    Measure("teacher_images_per_s", _teacher_speed, timing="speed_resolution_plots"),
    Measure("resolution", _resolution, timing="speed_resolution_plots"),
    Measure("matmul_gflops", _matmul_rate, timing="speed_resolution_plots"),
)
PLOTS_TIMING = "speed_resolution_plots"  # the plots' seconds go with the speed measures'


def take_measures(scorer: Scorer, model: Any, params: Any, record: results_lib.Results) -> None:
  """Every MEASURES entry on the final student, into its field of the record."""
  for m in MEASURES:
    t0 = time.time()
    value = m.fn(scorer, model, params, record)
    if value is None:
      continue
    setattr(record, m.field, value)
    if m.timing:
      record.add_time(m.timing, time.time() - t0)


def write_plots(
    config,
    workdir,
    record: results_lib.Results,
    teacher_model,
    teacher_params,
    student_model,
    student_params,
    sample,
) -> None:
  """fidelity.png, fidelity_curves.png and attention_maps.png in the workdir."""
  # matplotlib writes local files; a gs:// workdir gets a copy of each.
  local = tempfile.mkdtemp() if gfile.is_remote(workdir) else workdir
  fid = {tag: f.layers for tag, f in record.scorings() if f.layers is not None}
  plots.plot_fidelity(fid, os.path.join(local, "fidelity.png"))
  plots.plot_fidelity_curves(record.histories or {}, os.path.join(local, "fidelity_curves.png"))
  n = config.eval.attention_map_images
  if n:
    tmaps = evaluate.cls_attention_maps(teacher_model, teacher_params, sample[:n])
    smaps = evaluate.cls_attention_maps(student_model, student_params, sample[:n])
    plots.plot_attention_maps(sample[:n], tmaps, smaps, os.path.join(local, "attention_maps.png"))
  if local != workdir:
    for name in os.listdir(local):
      gfile.copy(os.path.join(local, name), os.path.join(workdir, name))
