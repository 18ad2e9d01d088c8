"""The dense measure's arithmetic: does a student keep its teacher's parts of a photo?
(photo_eval.py's docstring defines the measure and why its probe is this one.)

  fit = dense.fit(val_teacher, val_student, k, seed, fit_patches)  # on validation patch tokens
  per_photo = dense.score(fit, test_teacher, test_student)         # shares of patches per photo

Parts are k-means centroids of the teacher's unit-length patch tokens (scipy's kmeans2:
k-means++ seeding from a seeded numpy Generator, then a fixed number of Lloyd steps); a patch's
label is its nearest centroid. Probes are multinomial logistic regressions fitted by L-BFGS from
zero (scipy). Pure numpy / scipy: nothing here knows a model.
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np

KMEANS_STEPS = 30
_EPS = 1e-6  # probe.EPS: the guard on a token's norm


@dataclasses.dataclass(frozen=True)
class Fit:
  """What the dense measure fits on the validation photos: the teacher's parts and one probe per
  model (logistic_fit's weights), both under the teacher's labels."""

  centroids: np.ndarray  # [k, D]
  teacher_probe: np.ndarray  # [D + 1, k]
  student_probe: np.ndarray  # [D + 1, k]


def unit(x: np.ndarray) -> np.ndarray:
  """The rows of x scaled to unit length (float32; a zero row stays zero)."""
  x = np.asarray(x, np.float32)
  return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), _EPS)


def kmeans(x: np.ndarray, k: int, seed: int = 0, steps: int = KMEANS_STEPS) -> np.ndarray:
  """k centroids [k, D] of the rows of x: scipy's kmeans2, k-means++ seeding from
  numpy.random.default_rng(seed), then `steps` Lloyd steps (no convergence test: a fixed count);
  an empty cluster keeps its centroid."""
  from scipy.cluster import vq

  x = np.asarray(x, np.float64)
  with warnings.catch_warnings():  # an empty cluster keeps its centroid: expected, not news
    warnings.filterwarnings("ignore", message="One of the clusters is empty")
    # `seed`, not `rng`: the keyword scipy >= 1.13 (setup.py's floor) accepts a Generator by.
    centroids, _ = vq.kmeans2(
        x, k, iter=steps, minit="++", missing="warn", seed=np.random.default_rng(seed)
    )
  return centroids


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


def fit(t: np.ndarray, s: np.ndarray, k: int, seed: int, fit_patches: int) -> Fit | None:
  """The parts and probes from the validation photos' patch tokens (teacher `t`, student `s`,
  [photos, patches, D] each): at most `fit_patches` patches, the same seeded sample for both
  models; None with fewer patches than parts."""
  t, s = unit(t.reshape(-1, t.shape[-1])), unit(s.reshape(-1, s.shape[-1]))
  if len(t) < k:
    return None
  if len(t) > fit_patches:
    keep = np.sort(np.random.default_rng(seed).choice(len(t), fit_patches, replace=False))
    t, s = t[keep], s[keep]
  centroids = kmeans(t, k, seed)
  labels = assign(t, centroids)
  return Fit(centroids, logistic_fit(t, labels, k), logistic_fit(s, labels, k))


def score(fitted: Fit, t: np.ndarray, s: np.ndarray) -> dict[str, list[float]]:
  """Per test photo (`t`, `s`: [photos, patches, D]), the share of its patches given the
  teacher's label: by the teacher's centroids on the student's tokens ("drop_in"), and by each
  model's probe on its own tokens ("probe_teacher", "probe_student")."""
  out: dict[str, list[float]] = {"drop_in": [], "probe_teacher": [], "probe_student": []}
  for tp, sp in zip(t, s):  # one photo's patches at a time
    tp, sp = unit(tp), unit(sp)
    truth = assign(tp, fitted.centroids)
    out["drop_in"].append(float(np.mean(assign(sp, fitted.centroids) == truth)))
    out["probe_teacher"].append(float(np.mean(logistic_predict(tp, fitted.teacher_probe) == truth)))
    out["probe_student"].append(float(np.mean(logistic_predict(sp, fitted.student_probe) == truth)))
  return out
