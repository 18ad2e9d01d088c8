r"""Crop retrieval: which test photo a random crop came from, by the teacher's features and by the
student's (photo_eval's "crop_retrieval" block; the photos, pp and seed are photo_eval's).

Definition. Take n >= 2 test photos and K crops per photo (PhotoEvalSpec.retrieval_crops).
  feature: a model's final image feature, photo_tokens.image_feature: the cls token after the
    encoder norm (pool "tok", the token photo_eval's cls cosine compares), else the mean of the
    patch tokens;
  gallery: for each photo, the feature of the whole photo at the base size res (photo_eval's
    "whole" view: resized to res × res, aspect not kept, PIL's antialiased bilinear filter, then
    the pp string's value ops: its normalisation);
  queries: for each photo, K crops of the ORIGINAL photo, each a box of a random share of the
    photo's area, uniform in [0.10, 0.50], with a random aspect ratio (width / height)
    log-uniform in [3/4, 4/3] at a uniform random position; when a very elongated photo cannot
    hold that box, the side that overflows is set to the photo's and the other keeps the area
    (the aspect ratio then leaves the range, never the area). Each crop is resized to res × res
    with the same resize and value ops as the gallery. The draws are fixed by the seed alone
    (spec.seed: numpy's default_rng, four uniforms per crop, made into a box by each photo's
    size), so the same photos give the same crops in every run and for both models;
  retrieval: a query's answer is the gallery photo whose feature has the highest cosine with the
    query's, within each model's own feature space (the teacher's queries against the teacher's
    gallery, the student's against the student's); top-1 is right when that photo is the one
    the crop came from (on a tie, the first photo in the list).
Reported: per photo, the share of its K crops retrieved right; teacher_top1 and student_top1 are
STATs of it (mean over photos, bootstrap 95 % interval over photos, worst photo: photo_eval.stat),
retention = student mean / teacher mean (None when the teacher's is 0), chance = 1 / n.
A student that keeps what makes each photo itself retrieves as the teacher does (retention 1);
one whose features are noise falls towards chance.

Cost: (1 + K) images per photo at res, one forward of each model; only the [D] features are kept
(never the tokens), and the teacher's come from photo_eval's feature cache when an earlier run
computed them for the same params and pixels.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from linvit_jax.data import inference_pp
from linvit_jax.evaluation import photo_tokens

DEFAULT_CROPS = 8
AREA = (0.10, 0.50)  # of the photo's area
ASPECT = (3 / 4, 4 / 3)  # width / height, log-uniform
_EPS = 1e-6  # the cosine's guard on a norm (photo_eval's)


def absent_reason(n_photos: int, crops: int) -> str | None:
  """Why retrieval is not measured (fewer than 2 photos, or no crops), or None."""
  if crops <= 0:
    return f"off (retrieval_crops = {crops})"
  if n_photos < 2:
    return f"{n_photos} test photo{'s' * (n_photos != 1)}: retrieval needs at least 2"
  return None


def crop_draws(n_photos: int, crops: int, seed: int) -> np.ndarray:
  """[n_photos, crops, 4] uniforms in [0, 1): each crop's area share, aspect, left, top."""
  return np.random.default_rng(seed).random((n_photos, crops, 4))


def crop_box(height: int, width: int, draw: Sequence[float]) -> tuple[int, int, int, int]:
  """(top, left, h, w) of the crop a draw (`crop_draws`' four uniforms) makes in a photo."""
  u_area, u_aspect, u_left, u_top = (float(u) for u in draw)
  area = (AREA[0] + u_area * (AREA[1] - AREA[0])) * height * width
  log_lo, log_hi = math.log(ASPECT[0]), math.log(ASPECT[1])
  aspect = math.exp(log_lo + u_aspect * (log_hi - log_lo))
  w, h = math.sqrt(area * aspect), math.sqrt(area / aspect)
  if w > width:  # too wide for the photo: its width, the area kept (h <= height / 2 then)
    w, h = width, area / width
  elif h > height:
    w, h = area / height, height
  w, h = min(width, max(1, round(w))), min(height, max(1, round(h)))
  left = int(u_left * (width - w + 1))
  top = int(u_top * (height - h + 1))
  return top, left, h, w


def photo_images(
    original: np.ndarray, draws: np.ndarray, pp: inference_pp.Preprocess
) -> tuple[np.ndarray, np.ndarray]:
  """(the whole photo [res, res, C], its crops [K, res, res, C]) of a decoded photo, each through
  `pp` (the whole view's resize and value ops at res)."""
  height, width = original.shape[:2]
  crops = []
  for draw in draws:
    top, left, h, w = crop_box(height, width, draw)
    crops.append(pp(original[top : top + h, left : left + w]))
  return pp(original).astype(np.float32), np.stack(crops).astype(np.float32)


def top1_shares(gallery: np.ndarray, queries: np.ndarray) -> np.ndarray:
  """[n]: per photo, the share of its queries whose nearest gallery feature (by cosine) is its
  own. gallery [n, D]; queries [n, K, D], photo i's crops in queries[i]."""
  n, k, _ = queries.shape

  def unit(x):
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), _EPS)

  scores = unit(queries.reshape(n * k, -1).astype(np.float64)) @ unit(gallery.astype(np.float64)).T
  right = np.argmax(scores, axis=1).reshape(n, k) == np.arange(n)[:, None]
  return right.mean(axis=1)


def features(
    tokens: Sequence[Any],
    paths: Sequence[str],
    pp: inference_pp.Preprocess,
    size: int,
    draws: np.ndarray,
) -> list[tuple[np.ndarray, np.ndarray]]:
  """For each of `tokens` (photo_tokens' Tokens or CachedTokens, the teacher's first), (gallery
  [n, D], queries [n, K, D]). Photos are decoded a batch at a time and each image batch goes
  through every model, so memory holds one batch of photos' images and the features."""
  batch = photo_tokens.batch_size(tokens[0].model, size)
  gallery = [[] for _ in tokens]
  queries = [[] for _ in tokens]
  for start in range(0, len(paths), batch):
    made = [
        photo_images(inference_pp.decode(path, pp.channels), draws[start + i], pp)
        for i, path in enumerate(paths[start : start + batch])
    ]
    wholes = np.stack([whole for whole, _ in made])
    crops = np.concatenate([c for _, c in made])
    for m, tok in enumerate(tokens):
      gallery[m].append(tok.features(wholes, batch))
      queries[m] += [tok.features(crops[i : i + batch], batch) for i in range(0, len(crops), batch)]
  k = draws.shape[1]
  return [
      (np.concatenate(g), np.concatenate(q).reshape(len(paths), k, -1))
      for g, q in zip(gallery, queries)
  ]


def evaluate(
    teacher: Any,
    student: Any,
    paths: Sequence[str],
    pp: inference_pp.Preprocess,
    size: int,
    crops: int,
    seed: int,
    stat: Callable[[Sequence[float]], dict[str, Any]],
) -> dict[str, Any]:
  """The "crop_retrieval" block (module doc) for `paths`, `pp` the whole view at `size` px (the
  base size res): `teacher` and `student`
  are photo_tokens' Tokens / CachedTokens, `stat` photo_eval.stat with the photos' names and
  the bootstrap bound. {"absent": why} with fewer than 2 photos or no crops."""
  n = len(paths)
  why = absent_reason(n, crops)
  if why:
    return {"absent": why}
  draws = crop_draws(n, crops, seed)
  (t_gallery, t_queries), (s_gallery, s_queries) = features(
      (teacher, student), paths, pp, size, draws
  )
  t_top1 = stat(top1_shares(t_gallery, t_queries))
  s_top1 = stat(top1_shares(s_gallery, s_queries))
  return {
      "feature": photo_tokens.feature_name(teacher.model),
      "size": int(size),
      "crops_per_photo": int(crops),
      "n_photos": n,
      "n_queries": n * crops,
      "area": list(AREA),
      "aspect": [float(a) for a in ASPECT],
      "teacher_top1": t_top1,
      "student_top1": s_top1,
      "retention": s_top1["mean"] / t_top1["mean"] if t_top1["mean"] > 0 else None,
      "chance": 1.0 / n,
  }
