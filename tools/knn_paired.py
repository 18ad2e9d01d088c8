"""k-NN on the README run's set (Fashion-MNIST, upsampled; 1,024 train, 512 eval, k = 20,
T = 0.07: report.knn_retention's protocol) of exported students, query by query, compared in
pairs: what one student gets right that the other does not, with a bootstrap interval over the
queries.

  python tools/knn_paired.py --teacher T.npz --photos DIR --out F.json REF_WORKDIR ARM_WORKDIR \
      [REF2 ARM2 ...] [--knn_train N] [--knn_eval N] [--with_teacher] [--knn image_folder:DIR]

The config is convert_folder's with init=T and images=DIR (its k-NN set, knn=auto unless --knn
says); --knn_train / --knn_eval: another number of reference / classified images than the run's
(1,000 / 500, batched to 1,024 / 512); --with_teacher: the teacher's features too, so each
student's retention (its top-1 ÷ the teacher's) gets a bootstrap interval over the same queries
(the runs' results.json hold the teacher's top-1 on the default set only).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import linvit_jax  # noqa: E402
from linvit_jax import build  # noqa: E402
from linvit_jax import compare  # noqa: E402
from linvit_jax import preflight  # noqa: E402
from linvit_jax import report  # noqa: E402
from linvit_jax.configuration import config_files  # noqa: E402
from linvit_jax.evaluation import photo_eval  # noqa: E402
from linvit_jax.runtime.errors import ConfigError  # noqa: E402


def query_hits(train_feats, train_labels, test_feats, test_labels, k, temperature) -> np.ndarray:
  """1.0 where a query's weighted k-NN vote is right (evaluate.knn_top1's rule), per query."""

  def unit(x):
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)

  sims = unit(test_feats.astype(np.float64)) @ unit(train_feats.astype(np.float64)).T
  top = np.argpartition(-sims, k - 1, axis=1)[:, :k]
  weights = np.exp(np.take_along_axis(sims, top, 1) / temperature)
  votes = np.zeros((len(sims), int(max(train_labels.max(), test_labels.max())) + 1))
  np.add.at(votes, (np.arange(len(sims))[:, None], train_labels[top]), weights)
  return (votes.argmax(1) == test_labels).astype(np.float64)


def ratio_interval(
    numerator: np.ndarray, denominator: np.ndarray, resamples: int = 1000, seed: int = 0
) -> tuple[float, float]:
  """95 % bootstrap interval of mean(numerator) / mean(denominator), the queries resampled
  together (paired: one student's and the teacher's hits on the same queries)."""
  rs = np.random.RandomState(seed)
  idx = rs.randint(0, len(numerator), size=(resamples, len(numerator)))
  num, den = numerator[idx].mean(1), denominator[idx].mean(1)
  ratios = num / np.maximum(den, 1e-12)
  return float(np.percentile(ratios, 2.5)), float(np.percentile(ratios, 97.5))


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--teacher", required=True)
  parser.add_argument("--photos", required=True)
  parser.add_argument("--out", required=True)
  parser.add_argument("--knn_train", type=int, default=0, help="0: the run's default")
  parser.add_argument("--knn_eval", type=int, default=0, help="0: the run's default")
  parser.add_argument("--knn", default="", help="the k-NN set (convert_folder's knn=)")
  parser.add_argument("--with_teacher", action="store_true")
  parser.add_argument("workdirs", nargs="+")
  args = parser.parse_args(argv)
  if len(args.workdirs) % 2:
    raise SystemExit("error: give workdirs in pairs: REF ARM [REF ARM ...]")
  if args.knn == "none":
    raise SystemExit("error: --knn none: there is no k-NN set to compare on")
  students = {w: linvit_jax.load_student(w) for w in dict.fromkeys(args.workdirs)}
  sizes = {w: s.training_size for w, s in students.items()}
  if None in sizes.values() or len(set(sizes.values())) > 1:
    raise SystemExit(
        f"error: the students' training sizes differ or are unrecorded ({sizes}): the k-NN set "
        "is read at one size, the one their runs measured at"
    )
  first = next(iter(students.values()))  # the k-NN set at their training size
  config = config_files.load(
      os.path.join(os.path.dirname(__file__), "..", "configs", "convert_folder.py"),
      {
          "init": args.teacher,
          "images": args.photos,
          "res": first.training_size[0],
          **{k: getattr(args, k) for k in ("knn_train", "knn_eval", "knn") if getattr(args, k)},
      },
  )
  config = build.resolve_from_init(config)
  config, why = preflight.resolve_knn(config)
  if why:
    raise SystemExit(f"error: no k-NN set: {why}")
  knn = config.eval.knn
  splits = {
      "train": (knn.train_split, knn.train_examples),
      "eval": (knn.eval_split, knn.eval_examples),
  }
  out = {"dataset": knn.dataset, "k": knn.k, "temperature": knn.temperature, "students": {}}
  try:  # the run's own checks: a readable set of two classes or more, at least k references
    preflight.check_knn_dataset(knn.dataset, knn.data_dir)
    preflight.check_knn_set(config)
  except ConfigError as e:
    raise SystemExit(f"error: {e}") from None
  out.update(train_examples=knn.train_examples, eval_examples=knn.eval_examples)

  def hits_of(model, params) -> np.ndarray:
    feats, _ = report._student_knn_features(config, splits, model, params, None)
    return query_hits(*feats["train"], *feats["eval"], knn.k, knn.temperature)

  hits, teacher_hits = {}, None
  if args.with_teacher:
    teacher_model, teacher_params = compare.load_teacher(
        args.teacher, first, config.data.image_size
    )
    teacher_hits = hits_of(teacher_model, teacher_params)
    out["teacher"] = {"top1": float(teacher_hits.mean()), "n": len(teacher_hits)}
    print("teacher", out["teacher"], flush=True)
  for workdir, student in students.items():
    hits[workdir] = hits_of(student.model, student.params)
    out["students"][workdir] = {"top1": float(hits[workdir].mean()), "n": len(hits[workdir])}
    if teacher_hits is not None:
      retention = hits[workdir].mean() / max(teacher_hits.mean(), 1e-12)
      out["students"][workdir]["retention"] = float(retention)
      out["students"][workdir]["retention_ci"] = ratio_interval(hits[workdir], teacher_hits)
    print(workdir, out["students"][workdir], flush=True)
  out["paired"] = []
  for ref, arm in zip(args.workdirs[::2], args.workdirs[1::2]):
    d = hits[arm] - hits[ref]
    lo, hi = photo_eval.bootstrap_interval(list(d))
    out["paired"].append(
        {
            "ref": ref,
            "arm": arm,
            "delta_top1": float(d.mean()),
            "ci": [lo, hi],
            "only_ref_right": int((d < 0).sum()),
            "only_arm_right": int((d > 0).sum()),
        }
    )
    print(out["paired"][-1], flush=True)
  with open(args.out, "w") as f:
    json.dump(out, f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
