"""A run's report: what it measures of the converted student besides training (resolution
scaling, k-NN retention), its summary table, and every plot of the project (the driver, the
ablation, the token study and the benchmarks draw here)."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
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
from linvit_jax.evaluation import results as results_lib
from linvit_jax.models import vit
from linvit_jax.runtime import gfile
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

  def fidelity(self, model: Any, params: Any) -> results_lib.Fidelity:
    """Per layer (teacher-forced) and end to end, on the first eval.fidelity_images images."""
    images = self.sample[: self.config.eval.fidelity_images]
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
  student, digests = {}, {}
  for part, (split, limit) in splits.items():
    batches = build.knn_batches(config, split, limit)
    if cache is not None:
      batches = digests[part] = feature_cache.BatchDigest(batches)
    student[part] = evaluate.pooled_features(student_model, student_params, batches, knn.label_key)
  t0 = time.perf_counter()
  teacher, hits, saved_s = {}, 0, 0.0
  params_digest = feature_cache.params_digest(teacher_params) if cache is not None else None
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
    batches = build.knn_batches(config, split, limit)
    if parts is not None:
      batches = feature_cache.BatchDigest(batches)
    teacher[part] = evaluate.pooled_features(teacher_model, teacher_params, batches, knn.label_key)
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
  out = photo_eval.evaluate_photos(
      teacher_model,
      teacher_params,
      student_model,
      student_params,
      test_paths,
      val_paths,
      pp=pp_spec.inference_pp(config.data.pp_eval),  # its decode and normalisation
      res=int(size[0] if isinstance(size, (tuple, list)) else size),
      factors=tuple(test.factors),
      views=tuple(test.views),
      bootstrap=test.bootstrap,
      dense_k=test.dense_k,
      min_photos=test.min_photos,
      seed=config.seed,
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
  plot_fidelity(fid, os.path.join(local, "fidelity.png"))
  plot_fidelity_curves(record.histories or {}, os.path.join(local, "fidelity_curves.png"))
  n = config.eval.attention_map_images
  if n:
    tmaps = evaluate.cls_attention_maps(teacher_model, teacher_params, sample[:n])
    smaps = evaluate.cls_attention_maps(student_model, student_params, sample[:n])
    plot_attention_maps(sample[:n], tmaps, smaps, os.path.join(local, "attention_maps.png"))
  if local != workdir:
    for name in os.listdir(local):
      gfile.copy(os.path.join(local, name), os.path.join(workdir, name))


def format_summary(results: results_lib.Results | Mapping[str, Any]) -> str:
  """The table main.py prints: accuracy (when labelled), fidelity to the teacher, speed."""
  r = results_lib.as_record(results)
  lines = ["", "== linvit_jax results " + "=" * 50]

  def pct(x):
    return f"{100 * x:6.2f} %" if isinstance(x, float) else "   n/a"

  if r.teacher_top1 is not None:
    lines.append(f"teacher (softmax) top-1          {pct(r.teacher_top1)}")
    what = (
        "student as loaded top-1        "
        if (r.config.get("student") or {}).get("init")
        else "student after surgery top-1    "
    )
    lines.append(f"{what}  {pct(r.converted.top1 if r.converted else None)}")
  for stage in r.stages:
    if stage.top1 is not None:
      lines.append(f"student after {stage.name:<19s}top-1 {pct(stage.top1)}")
  if r.student_top1 is not None:
    lines.append(f"student final top-1              {pct(r.student_top1)}")
  e2e = [(tag, f.end_to_end) for tag, f in r.scorings() if f.end_to_end is not None]
  if e2e:
    lines.append("")
    lines.append("end-to-end fidelity to the teacher (student's own forward, held-out images)")
    lines.append(f"{'':28s}{'cls cos':>9s}{'patch cos':>11s}{'min block':>11s}")
    for tag, v in e2e:
      cls = f"{v['cls_cosine']:9.4f}" if "cls_cosine" in v else f"{'-':>9s}"
      lines.append(f"{tag:<28s}{cls}{v['patch_cosine']:11.4f}{min(v['block_cosine']):11.4f}")
  view = r.eval_view_fidelity
  if view:
    cls = f"cls cos {view['cls_cosine']:.4f}, " if "cls_cosine" in view else ""
    lines.append(
        f"held-out images as encode() sees them (pp_eval, {view['images']} image(s)): {cls}"
        f"patch cos {view['patch_cosine']:.4f}"
    )
  if r.softmax_layers:
    lines.append(f"hybrid: layers {r.softmax_layers} keep softmax attention")
  if r.knn:
    k = r.knn
    lines.append(
        f"k-NN top-1 (k={k['k']}, {k['dataset']}, {k['train_examples']} reference / "
        f"{k['eval_examples']} classified): teacher {pct(k['teacher_top1'])}, student "
        f"{pct(k['student_top1'])}, retention {100 * k['retention']:.1f} %"
    )
    if k.get("teacher_features_cached"):  # feature_cache: an earlier run computed them
      lines.append(
          f"  the teacher's k-NN features came from the feature cache (computing them took "
          f"{k.get('teacher_features_saved_seconds', 0.0):.0f} s)"
      )
    if "cls_cosine" in k:
      lines.append(
          f"pooled-feature cosine to the teacher on those {k['train_examples'] + k['eval_examples']}"
          f" images: mean {k['cls_cosine']:.4f}, worst {k['cls_cosine_min']:.4f}"
      )
  elif r.knn_skipped:  # a string: why k-NN was not measured, how to turn it on
    lines.append(f"k-NN: not measured — {' '.join(str(r.knn_skipped).split())}")
  if r.exact_share:
    shares = ", ".join("-" if s is None else f"{s:.2f}" for s in r.exact_share)
    lines.append(
        f"exact-set hybrid (window, sinks): its share of attention mass per layer: {shares}"
    )
  fids = [(tag, f.layers) for tag, f in r.scorings() if f.layers is not None]
  if fids:
    lines.append("")
    lines.append("per-layer attention fidelity (teacher-forced), cosine / normalised MSE")
    width = max([22] + [len(name) for name, _ in fids])  # whole stage names, never cut
    header = "  " + " ".join(f"{name:>{width}s}" for name, _ in fids)
    lines.append("layer" + header[5:] if len(header) > 5 else header)
    for i in range(len(fids[0][1])):
      cells = " ".join(
          ("{:10.3f} / {:<9.3f}".format(v[i]["cosine"], v[i]["nmse"])).rjust(width) for _, v in fids
      )
      lines.append(f"{i:>5d}  {cells}".rstrip())
  if r.test:  # the test photos: the figures nothing was chosen on
    lines += ["", photo_eval.format_table(r.test)]
  if r.teacher_images_per_s is not None:
    lines.append("")
    lines.append(
        f"images/s (forward, batch {r.config['eval']['throughput_batch']}): "
        f"teacher {r.teacher_images_per_s:.1f}, "
        f"student {r.student_images_per_s:.1f}"
    )
  if r.resolution:
    lines.append(
        "the held-out sample resized to other sizes (not native views: see the test table)"
    )
  for row in r.resolution or []:
    acc = (
        f"top-1 teacher {pct(row['teacher_top1'])}, student {pct(row['student_top1'])}; "
        if "teacher_top1" in row
        else ""
    )
    cls = f"cls cos {row['cls_cosine']:.4f}, " if "cls_cosine" in row else ""
    lines.append(
        f"  {row['image_size']:>4d}px ({row['tokens']} tokens): {acc}{cls}patch cos "
        f"{row['patch_cosine']:.4f}; images/s teacher {row['teacher_images_per_s']:.1f}, "
        f"student {row['student_images_per_s']:.1f}; peak MB teacher "
        f"{row['teacher_peak_bytes'] / 2**20:.0f}, student "
        f"{row['student_peak_bytes'] / 2**20:.0f}"
    )
  # A measure without a section above (a new one): one generic line, from the record's fields.
  for field, value in r.measures():
    if field.name not in _SUMMARY_SECTIONS:
      lines.append(f"{field.metadata['label']}: {_brief(value)}")
  lines.extend(format_timing(r))
  return "\n".join(lines)


# The measures format_summary writes a section of its own for.
_SUMMARY_SECTIONS = frozenset(
    {"knn", "eval_view_fidelity", "test", "exact_share", "student_images_per_s"}
    | {"teacher_images_per_s", "resolution"}
)


def _brief(value: Any) -> str:
  """A measure's value on one line: numbers to 4 places, a dict's single numbers by name."""
  if isinstance(value, float):
    return f"{value:.4f}"
  if isinstance(value, Mapping):
    return ", ".join(f"{k} {_brief(v)}" for k, v in value.items() if isinstance(v, (int, float)))
  if isinstance(value, (list, tuple)) and all(isinstance(v, (int, float)) for v in value):
    return ", ".join(_brief(v) for v in value)
  return str(value)


# What run.py's timing_s keys measure, in words (a stage's key is its name).
_TIMING_LABELS = {
    "convert_and_evaluate": "surgery and first scoring",
    "speed_resolution_plots": "speed, resolutions and plots",
    "knn": "k-NN check",
}


def _logged_steps_per_s(history: Sequence[Mapping[str, Any]]) -> float | None:
  """The median of a stage's logged training rates, the first row left out: it holds the
  compilation (and, after a resume, the restart), which the teacher's timed forward excludes."""
  rates = [
      float(r["steps_per_sec"])
      for r in history[1:]
      if isinstance(r.get("steps_per_sec"), (int, float)) and r["steps_per_sec"] > 0
  ]
  return float(np.median(rates)) if rates else None


def format_timing(results: results_lib.Results | Mapping[str, Any]) -> list[str]:
  """Where a run's time went (its timing_s): minutes and share of the total per part, and each
  training stage's step cost beside the teacher's forward. What an older results.json or a run
  without teacher or histories lacks leaves its rows or columns out."""
  r = results_lib.as_record(results)
  timing = {k: v for k, v in (r.timing_s or {}).items() if isinstance(v, (int, float))}
  if not timing:
    return ["", "where the time went: not recorded"]
  config = r.config or {}
  stage_names = [n for n in config.get("stages") or () if n in timing]
  named = (
      [k for k in ("convert_and_evaluate",) if k in timing]
      + stage_names
      + [k for k in timing if k not in stage_names and k not in ("convert_and_evaluate", "total")]
  )
  total = float(timing.get("total", sum(timing[k] for k in named)))
  rest = total - sum(timing[k] for k in named)
  # run.py times these parts; the rest of the total is loading the teacher and the student,
  # scoring after each stage, k-NN and the held-out view (the export comes after the total).
  rest_what = ["loading", "scoring after each stage"]
  if r.knn and "knn" not in timing:
    rest_what.append("k-NN")
  rows = [
      (f"stage {k}" if k in stage_names else _TIMING_LABELS.get(k, k), timing[k]) for k in named
  ]
  rows.append((f"the rest: {', '.join(rest_what)}", rest))
  width = max(34, max(len(label) for label, _ in rows) + 2)
  share = lambda s: f"{100 * s / total:6.1f} %" if total > 0 else "     -"  # noqa: E731
  lines = ["", f"{'where the time went':<{width}s}{'minutes':>9s}{'share':>9s}"]
  lines += [f"  {label:<{width - 2}s}{s / 60:9.1f}{share(s):>9s}" for label, s in rows]
  lines.append(f"  {'total':<{width - 2}s}{total / 60:9.1f}{share(total):>9s}   ({total:.0f} s)")
  return lines + _step_cost(r, stage_names, timing)


def _step_cost(
    r: results_lib.Results, stage_names: Sequence[str], timing: Mapping[str, float]
) -> list[str]:
  """Each training stage's step cost beside the teacher's forward, per image: how many of the
  teacher's forward passes one image of training costs (the `align` step runs the teacher, the
  student and the student's backward)."""
  config = r.config or {}
  histories = r.histories or {}
  teacher = r.teacher_images_per_s
  width = max([5] + [len(n) for n in stage_names]) + 4
  rows = []
  for name in stage_names:
    stage = config.get(name) or {}
    steps, batch = stage.get("steps"), stage.get("batch_size")
    if not steps or not batch:
      continue
    logged = _logged_steps_per_s(histories.get(name) or [])
    images_per_s = batch * (logged or steps / max(timing[name], 1e-9))
    ratio = f"{teacher / images_per_s:.1f}×" if teacher else "-"
    rows.append(
        f"  {name:<{width - 2}s}{steps:>7d}{batch:>7d}{timing[name] / steps:>9.2f}"
        f"{images_per_s:>10.2f}{ratio:>11s}"
    )
  if not rows:
    return []
  title = "training step cost"
  if teacher:
    at = (config.get("eval") or {}).get("throughput_batch")
    title += (
        f" beside the teacher's forward ({teacher:.2f} images/s{f' at batch {at}' if at else ''})"
    )
  return [
      "",
      title,
      f"{'stage':<{width}s}{'steps':>7s}{'batch':>7s}{'s/step':>9s}{'images/s':>10s}"
      f"{'÷ teacher':>11s}",
      *rows,
      "  s/step: the stage's wall time / steps (compiling, curves and checkpoints included);",
      "  images/s: the median logged rate (compiling excluded); ÷ teacher: the teacher's forward",
      "  passes one training image costs",
  ]


# ----------------------------------------------------------------------------- pictures


def format_where_exported(workdir: str) -> str:
  """Where a run's student went and the two lines of Python that load it (the CLI's last lines).

  A local workdir is named by its absolute path, so that the lines work from any directory."""
  folder = workdir if gfile.is_remote(workdir) else os.path.abspath(workdir)
  return "\n".join(
      [
          f"student exported to {folder}; load it in Python with:",
          "  import linvit_jax",
          f"  student = linvit_jax.load_student({json.dumps(folder)})",  # a Python literal too
      ]
  )


def new_figure(**kw):
  """A figure outside pyplot: no global backend switch, so notebooks keep inline plotting."""
  from matplotlib.figure import Figure

  return Figure(**kw)


def plot_fidelity(rows_by_name: Mapping[str, list[dict[str, float]]], path: str) -> None:
  """Bar chart of per-layer cosine and normalised MSE for one or more students."""
  fig = new_figure(figsize=(10, 3.5))
  axes = fig.subplots(1, 2)
  names = list(rows_by_name)
  width = 0.8 / max(1, len(names))
  for j, name in enumerate(names):
    rows = rows_by_name[name]
    x = np.arange(len(rows)) + j * width
    axes[0].bar(x, [r["cosine"] for r in rows], width, label=name)
    axes[1].bar(x, [r["nmse"] for r in rows], width, label=name)
  for ax, title in zip(axes, ("cosine (↑)", "normalised MSE (↓)")):
    ax.set_xlabel("layer")
    ax.set_title(f"attention-output fidelity: {title}")
    ax.set_xticks(np.arange(len(next(iter(rows_by_name.values())))) + 0.4 - width / 2)
    ax.set_xticklabels(range(len(next(iter(rows_by_name.values())))))
  axes[0].set_ylim(0, 1.02)
  axes[0].legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=110)


def plot_attention_maps(
    images: np.ndarray,
    teacher_maps: np.ndarray,
    student_maps: np.ndarray,
    path: str,
    layer: int = -1,
) -> None:
  """Grid: one row per image; the image, then the teacher's and the student's cls maps per head."""
  n_img, heads = teacher_maps.shape[1], teacher_maps.shape[2]
  cols = 1 + 2 * heads
  fig = new_figure(figsize=(1.4 * cols, 1.5 * n_img))
  axes = fig.subplots(n_img, cols, squeeze=False)
  for i in range(n_img):
    img = images[i]
    img = (img - img.min()) / (img.max() - img.min() + 1e-9)
    axes[i, 0].imshow(img.squeeze(), cmap="gray" if img.shape[-1] == 1 else None)
    for h in range(heads):
      axes[i, 1 + h].imshow(teacher_maps[layer, i, h], cmap="viridis")
      axes[i, 1 + heads + h].imshow(student_maps[layer, i, h], cmap="viridis")
      if i == 0:
        axes[i, 1 + h].set_title(f"teacher h{h}", fontsize=7)
        axes[i, 1 + heads + h].set_title(f"student h{h}", fontsize=7)
  for ax in axes.flat:
    ax.set_xticks([])
    ax.set_yticks([])
  fig.suptitle(f"cls-token attention, layer {layer % teacher_maps.shape[0]}", fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=110)


def plot_fidelity_curves(
    histories: Mapping[str, list[dict[str, Any]]],
    path: str,
    keys: tuple[str, ...] = ("cls_cosine", "patch_cosine", "block_cosine_min"),
) -> bool:
  """End-to-end fidelity on held-out images vs images seen, across the run's stages (the
  `eval/...` rows of each stage's metrics); returns False when no stage logged any."""
  fig = new_figure(figsize=(7, 3.8))
  ax = fig.subplots()
  drawn = False
  for key in keys:
    xs, ys = [], []
    for rows in histories.values():
      for r in rows:
        if f"eval/{key}" in r:
          xs.append(r.get("images_seen", r.get("step", 0)))
          ys.append(float(r[f"eval/{key}"]))
    if xs:
      ax.plot(xs, ys, marker="o", ms=3, label=key.replace("_", " "))
      drawn = True
  if not drawn:
    return False
  edges = 0
  for name, rows in histories.items():  # stage boundaries
    if rows:
      edges = max(r.get("images_seen", 0) for r in rows)
      ax.axvline(edges, color="0.8", lw=0.8)
      ax.text(
          edges,
          ax.get_ylim()[0],
          f" {name}",
          fontsize=7,
          rotation=90,
          va="bottom",
          ha="right",
          color="0.4",
      )
  ax.set_xlabel("images seen")
  ax.set_ylabel("cosine to the teacher (held-out)")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  return True


def plot_ablation_curves(
    results: Mapping[str, Sequence[results_lib.Results | Mapping[str, Any]]],
    path: str,
    teacher_top1: float | None,
) -> None:
  """Test top-1 during fine-tuning, mean ± std over seeds, one line per ablation arm."""
  fig = new_figure(figsize=(7, 4.2))
  ax = fig.subplots()
  for arm, runs in results.items():
    curves = []
    for r in map(results_lib.as_record, runs):
      rows = [h for h in (r.histories or {}).get("finetune", []) if "eval/top1" in h]
      curves.append([(h["step"], h["eval/top1"]) for h in rows])
    if not curves or not curves[0]:
      continue
    steps = [s for s, _ in curves[0]]
    acc = np.array([[a for _, a in c][: len(steps)] for c in curves if len(c) >= len(steps)])
    mean, std = 100 * acc.mean(0), 100 * acc.std(0)
    ax.plot(steps, mean, marker="o", ms=3, label=arm)
    ax.fill_between(steps, mean - std, mean + std, alpha=0.15)
  if teacher_top1 is not None:
    ax.axhline(100 * teacher_top1, color="k", ls="--", lw=1, label="teacher (before)")
  ax.set_xlabel("fine-tune step")
  ax.set_ylabel("test top-1 (%)")
  ax.set_title("Same fine-tune budget, different starting points")
  ax.legend(fontsize=7, loc="lower right")
  ax.grid(alpha=0.3)
  fig.tight_layout()
  with gfile.open(path, "wb") as f:  # matplotlib writes file objects: gs:// paths work too
    fig.savefig(f, format="png", dpi=120)


def plot_lines(
    panels: list[dict[str, Any]], path: str, *, ncols: int = 2, title: str = "", size=(11, 4.2)
) -> None:
  """A grid of line plots, one panel per dict: `series` {label: [(x, y), ...]}, `title`,
  `xlabel`, `ylabel`, optional `dashed` (labels drawn dashed), `log` (both axes log; default
  True). The benchmarks' speed and memory curves are drawn with it."""
  nrows = -(-len(panels) // ncols)
  fig = new_figure(figsize=size)
  axes = np.asarray(fig.subplots(nrows, ncols, squeeze=False)).ravel()
  for ax, panel in zip(axes, panels):
    for label, pts in panel["series"].items():
      if pts:
        ls = "--" if label in panel.get("dashed", ()) else "-"
        ax.plot(*zip(*pts), marker="o", label=label, ls=ls)
    if panel.get("log", True):
      ax.set_xscale("log")
      ax.set_yscale("log")
    ax.set_title(panel.get("title", ""))
    ax.set_xlabel(panel.get("xlabel", ""))
    ax.set_ylabel(panel.get("ylabel", ""))
    ax.grid(True, which="both", alpha=0.3)
  axes[0].legend(fontsize=8)
  if title:
    fig.suptitle(title, fontsize=10)
  fig.tight_layout()
  with gfile.open(path, "wb") as f:
    fig.savefig(f, format="png", dpi=110)


def plot_token_study(
    points: Mapping[str, Sequence[tuple[int, float, float, float]]],
    tokens: Sequence[int],
    path: str,
) -> None:
  """Δ top-1 to the teacher vs tokens per image: per arm, (tokens, mean, spread, teacher) points."""
  fig = new_figure(figsize=(6.5, 4))
  ax = fig.subplots()
  for arm, pts in points.items():
    if not pts:
      continue
    t, m, sd, teach = map(np.asarray, zip(*pts))
    ax.errorbar(t, m - teach, yerr=np.nan_to_num(sd), marker="o", capsize=3, label=arm)
  ax.axhline(0, color="k", ls="--", lw=1, label="teacher")
  ax.set_xscale("log")
  ax.set_xticks(list(tokens), [str(t) for t in tokens])
  ax.set_xticks([], minor=True)  # no "2×10¹"-style minor labels between the token counts
  ax.set_xlabel("tokens per image (patches + cls)")
  ax.set_ylabel("Δ top-1 to the teacher (points)")
  ax.set_title("Same fine-tune budget: what copying buys at each token count")
  ax.legend(fontsize=7)
  ax.grid(alpha=0.3)
  fig.tight_layout()
  with gfile.open(path, "wb") as f:
    fig.savefig(f, format="png", dpi=120)
