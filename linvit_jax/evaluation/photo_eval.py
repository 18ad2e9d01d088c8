r"""A student against its teacher on test photos: native resolution, intervals, a dense measure,
crop retrieval.

    spec = PhotoEvalSpec(pp=pp_eval, res=224)  # factors, views, bootstrap, dense_k, seed, ...
    out = evaluate_photos(teacher, t_params, student, s_params, test_paths, val_paths, spec)
    print(format_table(out))                   # out: a plain dict (schema below)

    python -m linvit_jax.compare --student WORKDIR --teacher INIT --photos DIR   (the CLI)

Views. For each size s = factor × res and each photo, two views, each made from the ORIGINAL
photo (never by upsampling a smaller view): "whole", the photo resized to s×s (its aspect ratio
not kept), and "crop", its shorter side resized to s and the central s×s kept. Resizing is PIL's
antialiased bilinear filter (inference_pp's `resize(..., method="bilinear", antialias=True)`:
box-like when shrinking, bilinear when enlarging); then the pp string's own decode and value ops
(its normalisation). A photo smaller than s is enlarged from its original, and counted
("upsampled" in each row). The position table of both models is resampled from the training grid
to the size's grid by big_vision's rule (posemb.resample_posemb), as `load_student` does.

Fidelity per photo, as evaluate.end_to_end_fidelity defines it: `cls_cosine`, the cosine of the
final cls token (after the encoder norm; only with a cls token), and `patch_cosine`, the mean over
patch tokens (cls and registers excluded) of the cosine of the final tokens.

The dense measure (does the student keep the teacher's parts of a photo?). At each size and view:
  parts: k-means (k = `dense_k`; scipy's kmeans2: k-means++ seeding from a Generator seeded by
    `seed`, then 30 Lloyd steps, dense.py) on the teacher's patch tokens of the VALIDATION
    photos, each token scaled to unit length (at most `fit_patches` tokens, a seeded sample); a
    patch's teacher label is its nearest centroid;
  drop-in: the same centroids applied to the student's tokens of a TEST photo; the value is the
    share of its patches given the teacher's label (the teacher's own value is 1 by construction);
  probe: a linear classifier (multinomial logistic regression with a bias, L2 1e-3 on the
    weights, L-BFGS from zero, at most 300 iterations, scipy) fitted on the validation photos'
    unit-length patch tokens under the teacher's labels, once on the teacher's tokens and once on
    the student's own. The value is the share of a test photo's patches whose probe label is the
    teacher's label. `probe_teacher` is the reference (below 1: the probe is fitted on a few
    photos and read on others), `probe_ratio` = probe_student / probe_teacher (means over
    photos). Fitted from zero, the probe is equivariant to a rotation of the tokens, so a student
    whose tokens are a rotated copy of the teacher's scores ratio 1 while its drop-in is low; a
    student whose tokens carry nothing of the parts scores near chance.
    Why this probe: the same classifier family on both models makes the ratio a comparison of
    tokens, not of probes. A nearest-class-mean probe reproduces the teacher's labels exactly (its
    class means are the k-means centroids), which makes the reference 1 by construction and left
    the student's own probe below its drop-in on real photos (ViT-S/14, 224 px whole views, 3,000
    training images: drop-in 0.80, nearest-mean 0.46); a ridge regression onto one-hot labels
    reproduced the teacher's own labels on only 0.77 / 0.67 of the test patches (squared loss on
    one-hot targets fits directions particular to the few fitting photos).
Nothing is chosen on the test photos: the parts and probes are fitted on validation photos only.

Crop retrieval (crop_retrieval.py defines it): which test photo a random crop came from. At the
base size res only: each test photo's whole view is the gallery, `retrieval_crops` random crops
of each (10-50 % of its area, seeded by `seed`) the queries; top-1 by the cosine of each model's
own final feature (the cls token, else the mean patch token). The teacher's and the student's
accuracies as STATs, retention = student / teacher. Absent (with the reason) below 2 test photos.

Cache. With `cache` (the run's and the CLI's: feature_cache at $LINVIT_CACHE_DIR), the teacher's
tokens of a batch are kept under its params' digest, its model fields and the sha256 of the
batch's pixels: a second evaluation of the same teacher on the same photos (the next experiment
on the same folder) runs only the student, except the first three teacher batches at each size,
which always run so that `teacher_images_per_s` is measured (from two batches, the first being
the compile; "teacher_timed_images" says on how many images). Crop retrieval's teacher features
are kept the same way (the features only, every batch: none is timed). "teacher_cache" says
{"hits", "computed", "saved_seconds"} over both.

Intervals: every number is a mean over test photos with a percentile bootstrap 95 % interval
(`bootstrap` resamples of the photos, seed `seed`), the worst photo and its name, and n. Fewer
than `min_photos` test or validation photos: the evaluation still runs, logs a warning and says so
in "too_few".

Results (plain JSON types):
  {"res", "factors", "views", "n_test", "n_val", "bootstrap", "dense_k", "retrieval_crops",
   "too_few" (only when),
   "rows": [{"size", "view", "n", "upsampled" (photos enlarged to make the view),
             "size_seconds" (the whole size: both models, validation and test photos, compiles),
             "teacher_images_per_s", "student_images_per_s" (the forwards after the first at
             that size, padded rows counted; None with one batch only),
             "teacher_timed_images" (the images the teacher's speed rests on),
             "cls_cosine" (cls-token models), "patch_cosine": STAT,
             "dense": {"drop_in": STAT, "probe_teacher": STAT, "probe_student": STAT,
                       "probe_ratio": float} (when there are validation photos)}],
   "crop_retrieval": {"feature", "size", "crops_per_photo", "n_photos", "n_queries", "area",
                      "aspect", "teacher_top1": STAT, "student_top1": STAT,
                      "retention" (None when the teacher's is 0), "chance"}
                     or {"absent": why} (fewer than 2 test photos, or retrieval_crops 0)}
  (results written before crop retrieval have neither "retrieval_crops" nor "crop_retrieval")
  STAT = {"mean", "lo", "hi", "worst", "worst_photo", "n"}.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from linvit_jax.data import inference_pp
from linvit_jax.data import pp_spec
from linvit_jax.evaluation import crop_retrieval
from linvit_jax.evaluation import dense
from linvit_jax.evaluation import photo_tokens
from linvit_jax.runtime import progress
from linvit_jax.runtime.errors import UserError

DEFAULT_FACTORS = (1, 2, 4)
VIEWS = ("whole", "crop")
DEFAULT_BOOTSTRAP = 1000
DEFAULT_DENSE_K = 8
DEFAULT_MIN_PHOTOS = 8
FIT_PATCHES = 20_000  # the patches the dense measure's fits use at most (a seeded sample)
_EPS = 1e-6  # probe.EPS: the cosine's guard on the norm product
# The pp ops that fix the geometry: replaced by the views here; everything else is kept.
_GEOMETRIC = ("resize", "resize_small", "central_crop", "keep")


class PhotoEvalError(UserError, ValueError):
  """Inputs this evaluation cannot use (no photos, a bad size or factor); one line."""


# ------------------------------------------------------------------------------------------ views


def value_ops(pp: str) -> str:
  """The pp string without its geometric ops: decode, the normalisation and any colour op."""
  kept = []
  for spec in pp_spec.ops(pp):
    if inference_pp.parse(spec)[0][0] not in _GEOMETRIC:
      kept.append(spec)
  if not kept or inference_pp.parse(kept[0])[0][0] != "decode":
    kept.insert(0, "decode")
  return "|".join(kept)


def view_pp(view: str, size: int, values: str) -> str:
  """The pp string of one view at `size` px (module doc), with `values` (`value_ops`)."""
  decode, _, rest = values.partition("|")
  resize = 'method="bilinear", antialias=True'
  if view == "whole":
    geometry = f"resize({size}, {resize})"
  elif view == "crop":
    geometry = f"resize_small({size}, {resize})|central_crop({size})"
  else:
    raise PhotoEvalError(f"view {view!r}: expected one of {', '.join(VIEWS)}")
  return "|".join(p for p in (decode, geometry, rest) if p)


# ------------------------------------------------------------------------------------ statistics


def bootstrap_interval(
    values: Sequence[float], resamples: int = DEFAULT_BOOTSTRAP, seed: int = 0
) -> tuple[float, float]:
  """The percentile bootstrap 95 % interval of the mean of `values` (resampled with replacement)."""
  v = np.asarray(values, np.float64)
  if len(v) == 0:
    return float("nan"), float("nan")
  idx = np.random.default_rng(seed).integers(0, len(v), size=(resamples, len(v)))
  lo, hi = np.percentile(v[idx].mean(axis=1), [2.5, 97.5])
  return float(lo), float(hi)


def stat(
    values: Sequence[float], names: Sequence[str], resamples: int = DEFAULT_BOOTSTRAP, seed: int = 0
) -> dict[str, Any]:
  """{"mean", "lo", "hi", "worst", "worst_photo", "n", "per_photo"} of per-photo values (worst:
  the lowest; per_photo: each photo's value by name, so two runs on the same photos can be
  compared photo by photo, with a paired interval)."""
  v = np.asarray(values, np.float64)
  lo, hi = bootstrap_interval(v, resamples, seed)
  worst = int(np.argmin(v))
  return {
      "mean": float(v.mean()),
      "lo": lo,
      "hi": hi,
      "worst": float(v[worst]),
      "worst_photo": names[worst],
      "n": len(v),
      "per_photo": {str(name): float(x) for name, x in zip(names, v)},
  }


# ----------------------------------------------------------------------------------- evaluation


def too_few_message(n_test: int, n_val: int, min_photos: int) -> str | None:
  """The line a run prints when its test or validation set is smaller than min_photos."""
  parts = []
  if n_test < min_photos:
    why = "intervals are wide" if n_test else "nothing measured (add photos or raise holdout)"
    parts.append(f"test set: {n_test} photo{'s' * (n_test != 1)} (< {min_photos}): {why}")
  if n_val < min_photos:
    parts.append(
        f"validation set: {n_val} photo{'s' * (n_val != 1)} (< {min_photos}): the dense "
        "measure's parts and probes rest on them"
    )
  return "; ".join(parts) or None


@dataclasses.dataclass(frozen=True)
class PhotoEvalSpec:
  """How the photos are evaluated (module doc): `pp`, a pp string whose decode and value ops
  (the normalisation) are kept; `res`, the training size the factors multiply; the views; the
  bootstrap resamples; the dense measure's parts (`dense_k`, 0: none) and the patches its fits
  use at most; `retrieval_crops`, crop retrieval's random crops per test photo (0: none);
  `min_photos`, below which a note is said; `seed`, the bootstrap's, the dense measure's and
  the crops'. A bad view name or crop count fails here, before any compute."""

  pp: str
  res: int
  factors: tuple[float, ...] = DEFAULT_FACTORS
  views: tuple[str, ...] = VIEWS
  bootstrap: int = DEFAULT_BOOTSTRAP
  dense_k: int = DEFAULT_DENSE_K
  fit_patches: int = FIT_PATCHES
  retrieval_crops: int = crop_retrieval.DEFAULT_CROPS
  min_photos: int = DEFAULT_MIN_PHOTOS
  seed: int = 0

  def __post_init__(self):
    object.__setattr__(self, "factors", tuple(self.factors))
    object.__setattr__(self, "views", tuple(self.views))
    for view in self.views:
      view_pp(view, self.res, "decode")
    if self.retrieval_crops < 0:
      raise PhotoEvalError(f"retrieval_crops {self.retrieval_crops}: expected 0 (none) or more")

  def sizes(self, patch: tuple[int, int]) -> list[int]:
    """Each factor × res in px; a PhotoEvalError unless a positive multiple of the patch."""
    sizes = []
    for f in self.factors:
      size = int(round(f * self.res))
      if f <= 0 or size != f * self.res or size % patch[0] or size % patch[1]:
        raise PhotoEvalError(
            f"factor {f}: {f} × {self.res} px = {f * self.res:g} px is not a positive multiple "
            f"of the patch {patch[0]}"
        )
      sizes.append(size)
    return sizes


def evaluate_photos(
    teacher: Any,
    teacher_params: Any,
    student: Any,
    student_params: Any,
    test_photos: Sequence[str],
    val_photos: Sequence[str],
    spec: PhotoEvalSpec,
    *,
    test_names: Sequence[str] | None = None,
    cache: Any = None,
) -> dict[str, Any]:
  """The student vs its teacher on `test_photos` (paths) at each of `spec`'s sizes and views; the
  dense measure's parts and probes fitted on `val_photos` (module doc). `test_names`: how photos
  are named (default: the file names); `cache`: a feature_cache.FeatureCache keeping the
  teacher's tokens between evaluations (None: computed every time). Returns the module doc's
  dict."""
  test_photos, val_photos = list(test_photos), list(val_photos)
  sizes = spec.sizes(tuple(int(p) for p in teacher.patch_size))
  names = list(test_names or [os.path.basename(p) for p in test_photos])
  out: dict[str, Any] = {
      "res": int(spec.res),
      "factors": [float(f) if float(f) != int(f) else int(f) for f in spec.factors],
      "views": list(spec.views),
      "n_test": len(test_photos),
      "n_val": len(val_photos),
      "bootstrap": int(spec.bootstrap),
      "dense_k": int(spec.dense_k),
      "retrieval_crops": int(spec.retrieval_crops),
  }
  message = too_few_message(len(test_photos), len(val_photos), spec.min_photos)
  if message:
    logging.warning("photo evaluation: %s", message)
    out["too_few"] = message
  if not test_photos:  # nothing to measure: said, not an error (a run goes on to its export)
    out["rows"] = []
    out["crop_retrieval"] = {"absent": crop_retrieval.absent_reason(0, spec.retrieval_crops)}
    return out
  t_tok = photo_tokens.CachedTokens(photo_tokens.Tokens(teacher, teacher_params, spec.res), cache)
  s_tok = photo_tokens.Tokens(student, student_params, spec.res)
  photos = _Photos(test_photos, val_photos, names)
  out["rows"] = [row for size in sizes for row in _size_rows(t_tok, s_tok, photos, size, spec)]
  # After the rows: its forwards at res must not count in the rows' images/s.
  out["crop_retrieval"] = _crop_retrieval(t_tok, s_tok, photos, spec)
  if cache is not None:
    out["teacher_cache"] = t_tok.summary()
  return out


@dataclasses.dataclass(frozen=True)
class _Photos:
  """The photos of one evaluation: test and validation paths, the test photos' names."""

  test: list[str]
  val: list[str]
  names: list[str]  # the test photos'


def _size_rows(
    t_tok: photo_tokens.CachedTokens,
    s_tok: photo_tokens.Tokens,
    photos: _Photos,
    size: int,
    spec: PhotoEvalSpec,
) -> list[dict[str, Any]]:
  """The rows of one size, one per view: both models on the validation photos (the dense fits)
  and the test photos, the fidelity and dense statistics, the size's seconds and speeds."""
  teacher = t_tok.model
  prefix, has_cls = teacher.num_prefix_tokens, teacher.pool_type == "tok"
  values = value_ops(spec.pp)
  pps = {v: inference_pp.Preprocess(view_pp(v, size, values)) for v in spec.views}
  t0 = time.time()
  fits = {}
  fit_val = bool(photos.val and spec.dense_k)
  total = len(photos.test) + (len(photos.val) if fit_val else 0)
  with progress.bar(total, f"photos at {size} px", "photo") as bar:
    if fit_val:
      val, _ = photo_tokens.forward_all(t_tok, s_tok, photos.val, pps, size, bar.update)
      fits = {
          v: dense.fit(t[:, prefix:], s[:, prefix:], spec.dense_k, spec.seed, spec.fit_patches)
          for v, (t, s) in val.items()
      }
    test, up = photo_tokens.forward_all(t_tok, s_tok, photos.test, pps, size, bar.update)
  seconds = time.time() - t0
  bootstrap = functools.partial(stat, names=photos.names, resamples=spec.bootstrap, seed=spec.seed)
  rows = []
  for view in spec.views:
    t, s = test[view]
    row: dict[str, Any] = {"size": size, "view": view, "n": len(t), "upsampled": up[view]}
    if has_cls:
      row["cls_cosine"] = bootstrap(cosine(s[:, 0], t[:, 0]))
    row["patch_cosine"] = bootstrap(cosine(s[:, prefix:], t[:, prefix:]).mean(axis=1))
    if fits.get(view) is not None:
      row["dense"] = _dense_stats(dense.score(fits[view], t[:, prefix:], s[:, prefix:]), bootstrap)
    row["size_seconds"] = seconds
    row["teacher_images_per_s"] = t_tok.images_per_s(size)
    row["student_images_per_s"] = s_tok.images_per_s(size)
    row["teacher_timed_images"] = t_tok.timed_images(size)
    rows.append(row)
  return rows


def _crop_retrieval(
    t_tok: photo_tokens.CachedTokens,
    s_tok: photo_tokens.Tokens,
    photos: _Photos,
    spec: PhotoEvalSpec,
) -> dict[str, Any]:
  """The "crop_retrieval" block: crop_retrieval.evaluate at res on the whole view's pp."""
  pp = inference_pp.Preprocess(view_pp("whole", spec.res, value_ops(spec.pp)))
  bootstrap = functools.partial(stat, names=photos.names, resamples=spec.bootstrap, seed=spec.seed)
  return crop_retrieval.evaluate(
      t_tok, s_tok, photos.test, pp, spec.res, spec.retrieval_crops, spec.seed, bootstrap
  )


def _dense_stats(
    per_photo: dict[str, list[float]], bootstrap: Callable[[Sequence[float]], dict[str, Any]]
) -> dict[str, Any]:
  """dense.score's per-photo shares as STATs, and probe_ratio (of the means)."""
  out = {name: bootstrap(values) for name, values in per_photo.items()}
  out["probe_ratio"] = out["probe_student"]["mean"] / max(out["probe_teacher"]["mean"], 1e-12)
  return out


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """probe.cosine in numpy: along the last axis, the norm product guarded by eps."""
  num = np.sum(a * b, -1)
  return num / np.maximum(np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1), _EPS)


# ----------------------------------------------------------------------------------------- table


def _ci(s: dict[str, Any]) -> str:
  return f"{s['mean']:.4f} [{s['lo']:.4f}, {s['hi']:.4f}]"


def format_table(results: dict[str, Any]) -> str:
  """The results as a small text table: size × view, fidelity with 95 % intervals and the worst
  photo, the dense measure (drop-in; probe on the student's / the teacher's tokens) and one line
  of crop retrieval."""
  lines = [
      f"on {results['n_test']} test photos (parts and probes fitted on {results['n_val']} "
      f"validation photos; 95 % bootstrap intervals over photos):"
  ]
  if results.get("too_few"):
    lines.append(f"  note: {results['too_few']}")
  if not results.get("rows"):
    return "\n".join(lines + ["  nothing measured"])
  head = f"  {'size':>5} {'view':<5} {'cls cosine [95% CI]':<27} {'patch cosine [95% CI]':<27} worst photo (patch)"
  lines.append(head)
  for r in results["rows"]:
    cls = _ci(r["cls_cosine"]) if "cls_cosine" in r else "-"
    p = r["patch_cosine"]
    worst = f"{p['worst']:.4f} {p['worst_photo']}"
    up = f"  ({r['upsampled']} enlarged)" if r.get("upsampled") else ""
    t_speed, s_speed = r.get("teacher_images_per_s"), r.get("student_images_per_s")
    speed = f"  speed {s_speed / t_speed:.2f}× the teacher's" if t_speed and s_speed else ""
    lines.append(f"  {r['size']:>5} {r['view']:<5} {cls:<27} {_ci(p):<27} {worst}{up}{speed}")
  dense = [r for r in results["rows"] if "dense" in r]
  if dense:
    k = results.get("dense_k")
    lines.append(
        f"  dense (teacher's {k} parts): drop-in [95% CI] | probe student / teacher (ratio)"
    )
    for r in dense:
      d = r["dense"]
      lines.append(
          f"  {r['size']:>5} {r['view']:<5} {_ci(d['drop_in'])} | {d['probe_student']['mean']:.4f}"
          f" / {d['probe_teacher']['mean']:.4f} ({d['probe_ratio']:.3f})"
      )
  if "crop_retrieval" in results:  # (absent from results written before it)
    lines.append(retrieval_line(results["crop_retrieval"]))
  return "\n".join(lines)


def retrieval_line(block: dict[str, Any]) -> str:
  """The table's line of the "crop_retrieval" block: student top-1 [95% CI] / teacher's."""
  if "absent" in block:
    return f"  crop retrieval: not measured ({block['absent']})"
  s, t, retention = block["student_top1"], block["teacher_top1"], block["retention"]
  kept = f"retention {retention:.3f}" if retention is not None else "retention -"
  return (
      f"  crop retrieval ({block['crops_per_photo']} random crops of each of {block['n_photos']} "
      f"photos at {block['size']} px, top-1 to the photo): student {_ci(s)} / teacher "
      f"{t['mean']:.4f} ({kept}; chance {block['chance']:.4f})"
  )


# ----------------------------------------------------------------------------- a folder of photos


def split_folder(
    folder: str, holdout: float = 1.0, test_split: str = "test"
) -> tuple[list[str], list[str], list[str]]:
  """(test paths, validation paths, test names) of a folder by image_folder's splits test@F and
  val@F: with F = 1 the whole folder is held out and halved by the val / test rule; with F < 1 it
  is a run's training folder and only the photos the run held out are used. test_split="train"
  tests on the photos such a run trained on instead (train@F: how well it fits what it saw)."""
  from linvit_jax.data import image_folder

  index = scan(folder)
  test, val = (image_folder.split_files(index.files, f"{s}@{holdout}") for s in (test_split, "val"))
  return [index.path(i) for i in test], [index.path(i) for i in val], [index.files[i] for i in test]


def scan(folder: str) -> Any:
  from linvit_jax.data import image_folder

  try:
    return image_folder.scan(folder, min_size=0)
  except (FileNotFoundError, ValueError) as e:
    raise PhotoEvalError(str(e)) from None
