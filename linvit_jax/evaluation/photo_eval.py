r"""A student against its teacher on test photos: native resolution, intervals, a dense measure.

    out = evaluate_photos(teacher, t_params, student, s_params, test_paths, val_paths,
                          pp=pp_eval, res=224)                # a plain dict (schema below)
    print(format_table(out))

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
  parts: k-means (k = `dense_k`, k-means++ seeded, 30 Lloyd steps, numpy) on the teacher's patch
    tokens of the VALIDATION photos, each token scaled to unit length (at most `fit_patches`
    tokens, a seeded sample); a patch's teacher label is its nearest centroid;
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

Cache. With `cache` (the run's and the CLI's: feature_cache at $LINVIT_CACHE_DIR), the teacher's
tokens of a batch are kept under its params' digest, its model fields and the sha256 of the
batch's pixels: a second evaluation of the same teacher on the same photos (the next experiment
on the same folder) runs only the student, except the first three teacher batches at each size,
which always run so that `teacher_images_per_s` is measured (from two batches, the first being
the compile; "teacher_timed_images" says on how many images). "teacher_cache" says {"hits",
"computed", "saved_seconds"}.

Intervals: every number is a mean over test photos with a percentile bootstrap 95 % interval
(`bootstrap` resamples of the photos, seed `seed`), the worst photo and its name, and n. Fewer
than `min_photos` test or validation photos: the evaluation still runs, logs a warning and says so
in "too_few".

Results (plain JSON types):
  {"res", "factors", "views", "n_test", "n_val", "bootstrap", "dense_k", "too_few" (only when),
   "rows": [{"size", "view", "n", "upsampled" (photos enlarged to make the view),
             "size_seconds" (the whole size: both models, validation and test photos, compiles),
             "teacher_images_per_s", "student_images_per_s" (the forwards after the first at
             that size, padded rows counted; None with one batch only),
             "teacher_timed_images" (the images the teacher's speed rests on),
             "cls_cosine" (cls-token models), "patch_cosine": STAT,
             "dense": {"drop_in": STAT, "probe_teacher": STAT, "probe_student": STAT,
                       "probe_ratio": float} (when there are validation photos)}]}
  STAT = {"mean", "lo", "hi", "worst", "worst_photo", "n"}.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from linvit_jax.data import inference_pp
from linvit_jax.runtime.errors import UserError

DEFAULT_FACTORS = (1, 2, 4)
VIEWS = ("whole", "crop")
DEFAULT_BOOTSTRAP = 1000
DEFAULT_DENSE_K = 8
DEFAULT_MIN_PHOTOS = 8
# Tokens per forward batch: a 4·res softmax teacher holds an N×N attention per head and image.
_TOKENS_PER_BATCH = 8192
_MAX_BATCH = 8
_FIT_PATCHES = 20_000
# Teacher batches per size always computed (the first compiles, the second is timed) when the
# rest come from the feature cache.
_TIMED_CALLS = 3  # the compile and two timed batches: a speed from more than one batch
_KMEANS_STEPS = 30
_EPS = 1e-6  # probe.EPS: the cosine's guard on the norm product
# The pp ops that fix the geometry: replaced by the views here; everything else is kept.
_GEOMETRIC = ("resize", "resize_small", "central_crop", "keep")


class PhotoEvalError(UserError, ValueError):
  """Inputs this evaluation cannot use (no photos, a bad size or factor); one line."""


# ------------------------------------------------------------------------------------------ views


def value_ops(pp: str) -> str:
  """The pp string without its geometric ops: decode, the normalisation and any colour op."""
  kept = []
  for spec in (s.strip() for s in pp.split("|")):
    if spec and inference_pp.parse(spec)[0][0] not in _GEOMETRIC:
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


def _enlarged(shape: tuple[int, ...], size: int) -> bool:
  """Whether a view at `size` enlarges the photo (both views scale its shorter side to >= size)."""
  return min(shape[:2]) < size


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
  """{"mean", "lo", "hi", "worst", "worst_photo", "n"} of per-photo values (worst: the lowest)."""
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
  }


# ---------------------------------------------------------------------------------- dense measure


def _unit(x: np.ndarray) -> np.ndarray:
  x = np.asarray(x, np.float32)
  return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), _EPS)


def kmeans(x: np.ndarray, k: int, seed: int = 0, steps: int = _KMEANS_STEPS) -> np.ndarray:
  """k centroids of the rows of x: k-means++ seeding, then Lloyd steps (an empty cluster keeps
  its centroid)."""
  x = np.asarray(x, np.float64)
  rng = np.random.default_rng(seed)
  centroids = [x[rng.integers(len(x))]]
  dist = np.sum((x - centroids[0]) ** 2, axis=1)
  for _ in range(1, k):
    total = dist.sum()
    pick = rng.choice(len(x), p=dist / total) if total > 0 else rng.integers(len(x))
    centroids.append(x[pick])
    dist = np.minimum(dist, np.sum((x - x[pick]) ** 2, axis=1))
  c = np.stack(centroids)
  for _ in range(steps):
    labels = assign(x, c)
    for j in range(k):
      members = x[labels == j]
      if len(members):
        c[j] = members.mean(axis=0)
  return c


def assign(x: np.ndarray, centroids: np.ndarray) -> np.ndarray:
  """The nearest centroid of each row (squared Euclidean distance)."""
  x, c = np.asarray(x, np.float64), np.asarray(centroids, np.float64)
  d = np.sum(x * x, 1)[:, None] - 2 * x @ c.T + np.sum(c * c, 1)[None]
  return np.argmin(d, axis=1)


def logistic_fit(
    x: np.ndarray, labels: np.ndarray, k: int, *, l2: float = 1e-3, iterations: int = 300
) -> np.ndarray:
  """Multinomial logistic regression [D + 1, k] (last row: the bias) of `labels` on the rows of
  x: mean cross-entropy + l2/2 ‖W‖² (the bias not decayed), L-BFGS from zero (deterministic)."""
  from scipy import optimize

  x = np.asarray(x, np.float64)
  xb = np.concatenate([x, np.ones((len(x), 1))], axis=1)
  onehot = np.eye(k)[np.asarray(labels)]
  decay = np.ones((xb.shape[1], 1))
  decay[-1] = 0.0

  def loss_and_grad(flat):
    w = flat.reshape(xb.shape[1], k)
    logits = xb @ w
    logits -= logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(axis=1, keepdims=True)
    loss = -np.mean(np.sum(onehot * np.log(p + 1e-12), axis=1)) + 0.5 * l2 * np.sum(decay * w * w)
    grad = xb.T @ (p - onehot) / len(xb) + l2 * decay * w
    return loss, grad.ravel()

  start = np.zeros(xb.shape[1] * k)
  fit = optimize.minimize(
      loss_and_grad, start, jac=True, method="L-BFGS-B", options={"maxiter": iterations}
  )
  return fit.x.reshape(xb.shape[1], k)


def logistic_predict(x: np.ndarray, w: np.ndarray) -> np.ndarray:
  """The most probable label of each row under logistic_fit's weights."""
  x = np.asarray(x, np.float64)
  return np.argmax(x @ w[:-1] + w[-1], axis=1)


# --------------------------------------------------------------------------------------- forward


def _train_grid(params: Any, res: int, patch: tuple[int, int]) -> tuple[int, int]:
  grid = (res // patch[0], res // patch[1])
  pe = params.get("pos_embedding") if hasattr(params, "get") else None
  if pe is not None and np.shape(pe)[1] != grid[0] * grid[1]:
    side = int(round(np.sqrt(np.shape(pe)[1])))
    grid = (side, side)
  return grid


class _Tokens:
  """A model's final normalised tokens [B, N, D] (float32) at fixed-size batches: one compile per
  size."""

  def __init__(self, model: Any, params: Any, res: int):
    import jax

    self.model, self.params = model, params
    self.patch = tuple(int(p) for p in model.patch_size)
    self.train_grid = _train_grid(params, res, self.patch)
    self._fn = jax.jit(lambda p, x: model.apply({"params": p}, x, train=False)[1]["encoded"])
    self._sized: dict[int, Any] = {}
    # size -> [seconds, images] of the forwards after the first (which compiles) at that size
    self.timing: dict[int, list[float]] = {}

  def __call__(self, images: np.ndarray, batch: int) -> np.ndarray:
    import jax

    from linvit_jax.models import vit_checkpoint

    size = images.shape[1]
    if size not in self._sized:  # one size on the device at a time: a 4·res table is large
      grid = (size // self.patch[0], size // self.patch[1])
      resized = vit_checkpoint.with_posemb_grid(self.params, grid, self.train_grid)
      self._sized = {size: jax.device_put(resized)}
    k = len(images)
    if k < batch:  # padded: one compile per size, not per chunk
      images = np.concatenate([images, np.zeros((batch - k, *images.shape[1:]), images.dtype)])
    t0 = time.perf_counter()
    out = np.asarray(self._fn(self._sized[size], images), np.float32)[:k]
    if size in self.timing:
      self.timing[size][0] += time.perf_counter() - t0
      self.timing[size][1] += batch  # padded rows cost the same
    else:
      self.timing[size] = [0.0, 0]
    return out

  def images_per_s(self, size: int) -> float | None:
    seconds, images = self.timing.get(size, (0.0, 0))
    return images / seconds if images else None

  def timed_images(self, size: int) -> int:
    return int(self.timing.get(size, (0.0, 0))[1])

  def swap_params(self, params: Any) -> None:
    """Other params of the same tree (another checkpoint): the compiled forwards are kept."""
    self.params, self._sized = params, {}


class _CachedTokens:
  """The teacher's tokens of one batch, from `cache` when an earlier evaluation computed them for
  the same params, model and pixels (feature_cache's key: a changed photo, pp or weight misses).
  The first `_TIMED_CALLS` batches at each size always run, so the teacher's images/s (the speed
  goal's denominator) stays measured on two batches, compile excluded, when every other batch
  is a hit."""

  def __init__(self, tokens: _Tokens, cache: Any):
    from linvit_jax.evaluation import feature_cache

    self.inner, self.cache, self.model = tokens, cache, tokens.model
    self.digest = feature_cache.params_digest(tokens.params) if cache is not None else None
    model = tokens.model
    self.fields = {
        f.name: getattr(model, f.name)
        for f in dataclasses.fields(model)
        if f.name not in ("parent", "name")
    }
    self.calls: dict[int, int] = {}
    self.hits, self.misses, self.saved_seconds = 0, 0, 0.0

  def _parts(self, images: np.ndarray, batch: int) -> dict[str, Any]:
    import hashlib

    import jax

    pixels = np.ascontiguousarray(images, np.float32)
    return {
        "what": "photo_eval tokens(encoded)",
        "params": self.digest,
        "model": self.fields,
        "batch": int(batch),
        "train_grid": list(self.inner.train_grid),
        "inputs": hashlib.sha256(pixels.reshape(-1).view(np.uint8)).hexdigest(),
        "shape": list(pixels.shape),
        "backend": jax.default_backend(),
        "jax": jax.__version__,
    }

  def __call__(self, images: np.ndarray, batch: int) -> np.ndarray:
    size = images.shape[1]
    self.calls[size] = calls = self.calls.get(size, 0) + 1
    if self.digest is None:
      return self.inner(images, batch)
    parts = self._parts(images, batch)
    if calls > _TIMED_CALLS:
      entry = self.cache.get(parts)
      if entry is not None and entry["tokens"].shape[0] == len(images):
        self.hits += 1
        self.saved_seconds += float(entry["seconds"])
        return entry["tokens"]
    t0 = time.perf_counter()
    out = self.inner(images, batch)
    self.misses += 1
    if calls > _TIMED_CALLS:  # the timed batches run every time: storing them saves nothing
      self.cache.put(parts, {"tokens": out, "seconds": np.float64(time.perf_counter() - t0)})
    return out

  def images_per_s(self, size: int) -> float | None:
    return self.inner.images_per_s(size)

  def timed_images(self, size: int) -> int:
    return self.inner.timed_images(size)

  def summary(self) -> dict[str, Any]:
    return {"hits": self.hits, "computed": self.misses, "saved_seconds": self.saved_seconds}


def _batch_size(model: Any, size: int) -> int:
  tokens = (size // model.patch_size[0]) * (size // model.patch_size[1])
  return max(1, min(_MAX_BATCH, _TOKENS_PER_BATCH // max(tokens, 1)))


def _views(paths: Sequence[str], pps: dict[str, inference_pp.Preprocess], size: int):
  """Per view: the batch [B, s, s, C] and how many photos were enlarged; each photo decoded once."""
  out = {v: [] for v in pps}
  up = dict.fromkeys(pps, 0)
  for path in paths:
    channels = next(iter(pps.values())).channels
    original = inference_pp.decode(path, channels)
    for view, pp in pps.items():
      out[view].append(pp(original))
      up[view] += _enlarged(original.shape, size)
  return {v: np.stack(x).astype(np.float32) for v, x in out.items()}, up


def _forward_all(teacher, student, paths, pps, size):
  """Per view: (teacher tokens, student tokens) of every photo, and the enlarged counts."""
  batch = _batch_size(teacher.model, size)
  tokens = {v: ([], []) for v in pps}
  up = dict.fromkeys(pps, 0)
  for start in range(0, len(paths), batch):
    views, enlarged = _views(paths[start : start + batch], pps, size)
    for view, images in views.items():
      tokens[view][0].append(teacher(images, batch))
      tokens[view][1].append(student(images, batch))
      up[view] += enlarged[view]
  return {v: (np.concatenate(t), np.concatenate(s)) for v, (t, s) in tokens.items()}, up


def _cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """probe.cosine in numpy: along the last axis, the norm product guarded by eps."""
  num = np.sum(a * b, -1)
  return num / np.maximum(np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1), _EPS)


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


def evaluate_photos(
    teacher: Any,
    teacher_params: Any,
    student: Any,
    student_params: Any,
    test_photos: Sequence[str],
    val_photos: Sequence[str],
    *,
    pp: str,
    res: int,
    factors: Sequence[float] = DEFAULT_FACTORS,
    views: Sequence[str] = VIEWS,
    bootstrap: int = DEFAULT_BOOTSTRAP,
    dense_k: int = DEFAULT_DENSE_K,
    min_photos: int = DEFAULT_MIN_PHOTOS,
    seed: int = 0,
    test_names: Sequence[str] | None = None,
    fit_patches: int = _FIT_PATCHES,
    cache: Any = None,
) -> dict[str, Any]:
  """The student vs its teacher on `test_photos` (paths) at each factor × res and view; the dense
  measure's parts and probes fitted on `val_photos` (module doc). `pp`: a pp string whose decode
  and value ops (the normalisation) are kept; `test_names`: how photos are named (default: the
  file names); `cache`: a feature_cache.FeatureCache keeping the teacher's tokens between
  evaluations (None: computed every time). Returns the module doc's dict."""
  test_photos, val_photos = list(test_photos), list(val_photos)
  for view in views:
    view_pp(view, res, "decode")  # a bad view name fails before any compute
  patch = tuple(int(p) for p in teacher.patch_size)
  sizes = []
  for f in factors:
    size = int(round(f * res))
    if f <= 0 or size != f * res or size % patch[0] or size % patch[1]:
      raise PhotoEvalError(
          f"factor {f}: {f} × {res} px = {f * res:g} px is not a positive multiple of the patch "
          f"{patch[0]}"
      )
    sizes.append(size)
  names = list(test_names or [os.path.basename(p) for p in test_photos])
  values = value_ops(pp)
  out: dict[str, Any] = {
      "res": int(res),
      "factors": [float(f) if float(f) != int(f) else int(f) for f in factors],
      "views": list(views),
      "n_test": len(test_photos),
      "n_val": len(val_photos),
      "bootstrap": int(bootstrap),
      "dense_k": int(dense_k),
  }
  message = too_few_message(len(test_photos), len(val_photos), min_photos)
  if message:
    logging.warning("photo evaluation: %s", message)
    out["too_few"] = message
  if not test_photos:  # nothing to measure: said, not an error (a run goes on to its export)
    out["rows"] = []
    return out
  t_tok = _CachedTokens(_Tokens(teacher, teacher_params, res), cache)
  s_tok = _Tokens(student, student_params, res)
  prefix, has_cls = teacher.num_prefix_tokens, teacher.pool_type == "tok"
  rows = []
  for size in sizes:
    pps = {v: inference_pp.Preprocess(view_pp(v, size, values)) for v in views}
    t0 = time.time()
    fits = {}
    if val_photos and dense_k:
      val, _ = _forward_all(t_tok, s_tok, val_photos, pps, size)
      fits = {
          v: _fit_dense(t[:, prefix:], s[:, prefix:], dense_k, seed, fit_patches)
          for v, (t, s) in val.items()
      }
    test, up = _forward_all(t_tok, s_tok, test_photos, pps, size)
    seconds = time.time() - t0
    for view in views:
      t, s = test[view]
      row: dict[str, Any] = {"size": size, "view": view, "n": len(t), "upsampled": up[view]}
      if has_cls:
        row["cls_cosine"] = stat(_cosine(s[:, 0], t[:, 0]), names, bootstrap, seed)
      per_photo = _cosine(s[:, prefix:], t[:, prefix:]).mean(axis=1)
      row["patch_cosine"] = stat(per_photo, names, bootstrap, seed)
      if fits.get(view) is not None:
        row["dense"] = _score_dense(
            fits[view], t[:, prefix:], s[:, prefix:], names, bootstrap, seed
        )
      row["size_seconds"] = seconds
      row["teacher_images_per_s"] = t_tok.images_per_s(size)
      row["student_images_per_s"] = s_tok.images_per_s(size)
      row["teacher_timed_images"] = t_tok.timed_images(size)
      rows.append(row)
  out["rows"] = rows
  if cache is not None:
    out["teacher_cache"] = t_tok.summary()
  return out


def _fit_dense(t, s, k, seed, fit_patches):
  """(centroids, teacher probe, student probe) from the validation photos' patch tokens."""
  t, s = _unit(t.reshape(-1, t.shape[-1])), _unit(s.reshape(-1, s.shape[-1]))
  if len(t) < k:
    return None
  if len(t) > fit_patches:  # the same seeded sample of patches for both models
    keep = np.sort(np.random.default_rng(seed).choice(len(t), fit_patches, replace=False))
    t, s = t[keep], s[keep]
  centroids = kmeans(t, k, seed)
  labels = assign(t, centroids)
  return centroids, logistic_fit(t, labels, k), logistic_fit(s, labels, k)


def _score_dense(fit, t, s, names, resamples, seed):
  centroids, w_teacher, w_student = fit
  drop_in, probe_t, probe_s = [], [], []
  for tp, sp in zip(t, s):  # one photo's patches at a time
    tp, sp = _unit(tp), _unit(sp)
    truth = assign(tp, centroids)
    drop_in.append(np.mean(assign(sp, centroids) == truth))
    probe_t.append(np.mean(logistic_predict(tp, w_teacher) == truth))
    probe_s.append(np.mean(logistic_predict(sp, w_student) == truth))
  out = {
      "drop_in": stat(drop_in, names, resamples, seed),
      "probe_teacher": stat(probe_t, names, resamples, seed),
      "probe_student": stat(probe_s, names, resamples, seed),
  }
  out["probe_ratio"] = out["probe_student"]["mean"] / max(out["probe_teacher"]["mean"], 1e-12)
  return out


# ----------------------------------------------------------------------------------------- table


def _ci(s: dict[str, Any]) -> str:
  return f"{s['mean']:.4f} [{s['lo']:.4f}, {s['hi']:.4f}]"


def format_table(results: dict[str, Any]) -> str:
  """The results as a small text table: size × view, fidelity with 95 % intervals and the worst
  photo, and the dense measure (drop-in; probe on the student's / the teacher's tokens)."""
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
  return "\n".join(lines)


# ----------------------------------------------------------------------------- a folder of photos


def split_folder(folder: str) -> tuple[list[str], list[str], list[str]]:
  """(test paths, validation paths, test names) of a folder by image_folder's val / test rule,
  the whole folder taken as held out."""
  from linvit_jax.data import image_folder

  index = scan(folder)
  in_val = image_folder.val_mask(index.files)
  test = [i for i, v in enumerate(in_val) if not v]
  val = [i for i, v in enumerate(in_val) if v]
  return [index.path(i) for i in test], [index.path(i) for i in val], [index.files[i] for i in test]


def scan(folder: str) -> Any:
  from linvit_jax.data import image_folder

  try:
    return image_folder.scan(folder, min_size=0)
  except (FileNotFoundError, ValueError) as e:
    raise PhotoEvalError(str(e)) from None
