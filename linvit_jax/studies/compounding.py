r"""Error that compounds: how much of a student's final gap to its teacher each layer's attention
causes, measured by swapping one layer's attention at a time.

    python -m linvit_jax.studies.compounding --student EXPORT_DIR --teacher INIT --photos DIR \
        [--res 224] [--views whole|crop] [--out compounding.json] [--plot compounding.png]

Teacher-forced, every student attention layer is close to the teacher's (evaluate.attention_
fidelity); end to end the student is further off, because each layer's error changes every later
layer's input. Two interventions per layer l, each one forward of an ordinary hybrid model
(`layer_swap.swap_attention`: the model's own per-layer attention specs, no patching):

  fix l    the student end to end, its layer l attention replaced by the teacher's (the teacher's
           operator and q/k/v/out params), acting on the student's own stream at that layer;
  break l  the teacher end to end, its layer l attention replaced by the student's (operator,
           projections, feature maps and levers), acting on the teacher's stream.

Each is compared with the teacher's own final tokens: `cls`, the cosine of the pooled feature
(`out["head_input"]`: the final cls token after the encoder norm for a cls-token model, the mean
or MAP pool otherwise; absent with pool "none"), and `patch`, the mean over patch tokens (cls and
registers excluded) of the final tokens' cosine, both per photo, then averaged over photos. From
the averages, per layer and for each of cls / patch:

  recovered_share   (cos_fix_l − cos_student) / (1 − cos_student): the share of the student's
                    gap that fixing layer l alone closes (None when the student has no gap);
  gap_alone         1 − cos_break_l: the gap layer l's student attention makes on its own;
  gap_alone_share   gap_alone / (1 − cos_student): the same on the scale of the student's gap.

Shares that sum to about 1 over the layers mean the layers' errors add up; a layer whose
recovered share is far above its gap_alone_share is one whose error grows through the stack.
Beside them, `attention_tf_cosine`: the layer's teacher-forced attention-output cosine (mean over
all tokens, evaluate.attention_fidelity).

The CLI reads the exported student as `python -m linvit_jax.compare` does (its teacher loader,
the student's own inference pp with the geometry of photo_eval's views at --res), every photo of
the folder (nothing is fitted, so no validation split), and compiles about 2·depth + 3 forwards.

Results (`summarize`; plain JSON types; m in "cls", "patch", "cls" only when the models pool):
  {"n_photos", "baseline": {m: the student's own cosine},
   "per_photo" (when the photos are named): [{"photo", "student": {m}, "fix_gain": {m: [L]}}]
   from the student's worst photo by cls (else patch) to its best: the mean hides where a few
   photos' gap sits (on cross-source photos, one layer can hold most of a bad photo's gap),
   "layers": [{"layer", "fix_cls", "fix_patch", "break_cls", "break_patch",
               "recovered_share": {m}, "gap_alone": {m}, "gap_alone_share": {m},
               "attention_tf_cosine"}],
   "sum_recovered_share": {m}, "sum_gap_alone_share": {m}}   (a share is None without a gap)
  and from the CLI also "student", "teacher", "photos" (its arguments), "res", "view",
  "upsampled" (photos smaller than the view, enlarged to make it).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import linvit_jax
from linvit_jax import compare
from linvit_jax.data import inference_pp
from linvit_jax.evaluation import evaluate
from linvit_jax.evaluation import layer_swap
from linvit_jax.evaluation import photo_eval
from linvit_jax.evaluation import photo_tokens
from linvit_jax.evaluation import plots
from linvit_jax.studies import study_cli

INTERVENTIONS = ("fix", "break")
MEASURES = ("cls", "patch")
WORST_PHOTOS_SHOWN = 3  # format_table's per-photo lines
_NO_GAP = 1e-6  # a student closer than this to its teacher has no gap to share out


class CompoundingError(study_cli.StudyError):
  """Inputs this study cannot use (a scanned model, models of different depth, a bad folder)."""


# ------------------------------------------------------------------------------- the interventions


def intervention_cosines(
    teacher: Any, teacher_params: Any, student: Any, student_params: Any, images: np.ndarray
) -> dict[str, dict[str, np.ndarray]]:
  """Per photo, cosines to the teacher's final tokens: {"baseline": {m: [B]} (the student),
  "fix": {m: [L, B]}, "break": {m: [L, B]}} for m in MEASURES ("cls" only when the models pool).
  The params must hold position tables at the images' grid; both models per-block, of the same
  depth. Each intervention is one jitted forward of a hybrid (`layer_swap.swap_attention`)."""
  if student.depth != teacher.depth:
    raise CompoundingError(f"student depth {student.depth} != teacher depth {teacher.depth}")
  images = jnp.asarray(images)
  reference = layer_swap.final_tokens(teacher, teacher_params, images)
  fetch = lambda m, p: jax.device_get(layer_swap.cosines_to(m, p, images, reference))  # noqa: E731
  per_layer = {
      "fix": layer_swap.swapped_cosines(
          student, student_params, teacher, teacher_params, images, reference
      ),
      "break": layer_swap.swapped_cosines(
          teacher, teacher_params, student, student_params, images, reference
      ),
  }
  out = {"baseline": fetch(student, student_params)}
  for what, rows in per_layer.items():
    out[what] = {m: np.stack([r[m] for r in rows]) for m in rows[0]}
  return out


# ------------------------------------------------------------------------------------ the summary


def _share(gap_closed: float, gap: float) -> float | None:
  return None if gap < _NO_GAP else float(gap_closed / gap)


def summarize(
    cosines: Mapping[str, Mapping[str, np.ndarray]],
    attention_tf: Sequence[float] | None = None,
    photos: Sequence[str] | None = None,
) -> dict[str, Any]:
  """The results (module doc) of `intervention_cosines`' values: photo means, and per layer the
  shares; `attention_tf`: the teacher-forced cosine per layer, when measured; `photos`: the
  photos' names, in the cosines' order, for the per-photo gains."""
  measures = [m for m in MEASURES if m in cosines["baseline"]]
  baseline = {m: float(np.mean(cosines["baseline"][m])) for m in measures}
  gap = {m: 1 - baseline[m] for m in measures}
  layers = []
  for l in range(len(cosines["fix"][measures[0]])):
    row: dict[str, Any] = {"layer": l}
    for what in INTERVENTIONS:
      row.update({f"{what}_{m}": float(np.mean(cosines[what][m][l])) for m in measures})
    row["recovered_share"] = {m: _share(row[f"fix_{m}"] - baseline[m], gap[m]) for m in measures}
    row["gap_alone"] = {m: 1 - row[f"break_{m}"] for m in measures}
    row["gap_alone_share"] = {m: _share(row["gap_alone"][m], gap[m]) for m in measures}
    if attention_tf is not None:
      row["attention_tf_cosine"] = float(attention_tf[l])
    layers.append(row)
  total = lambda key, m: (  # noqa: E731
      None if gap[m] < _NO_GAP else float(sum(r[key][m] for r in layers))
  )
  out = {
      "n_photos": int(len(cosines["baseline"][measures[0]])),
      "baseline": baseline,
      "layers": layers,
      "sum_recovered_share": {m: total("recovered_share", m) for m in measures},
      "sum_gap_alone_share": {m: total("gap_alone_share", m) for m in measures},
  }
  if photos is not None:
    if len(photos) != out["n_photos"]:
      raise CompoundingError(f"{len(photos)} photo names for {out['n_photos']} photos")
    student = cosines["baseline"]
    out["per_photo"] = [
        {
            "photo": photos[i],
            "student": {m: float(student[m][i]) for m in measures},
            "fix_gain": {
                m: [float(g) for g in cosines["fix"][m][:, i] - student[m][i]] for m in measures
            },
        }
        for i in np.argsort(student[measures[0]], kind="stable")
    ]
  return out


def measure(
    teacher: Any,
    teacher_params: Any,
    student: Any,
    student_params: Any,
    images: np.ndarray,
    batch_size: int = 8,
    photos: Sequence[str] | None = None,
) -> dict[str, Any]:
  """`summarize` of every image, in batches of `batch_size` (the last one padded, so each
  forward compiles once), with the teacher-forced attention-output cosine per layer (and the
  per-photo gains when `photos` names the images)."""
  parts, tf_sums = [], None
  batch_size = max(1, min(batch_size, len(images)))
  for start in range(0, len(images), batch_size):
    chunk = np.asarray(images[start : start + batch_size], np.float32)
    k = len(chunk)
    padded = np.concatenate([chunk, np.zeros((batch_size - k, *chunk.shape[1:]), chunk.dtype)])
    cos = intervention_cosines(teacher, teacher_params, student, student_params, padded)
    parts.append(jax.tree.map(lambda a, k=k: a[..., :k], cos))
    rows = evaluate.attention_fidelity(teacher, teacher_params, student, student_params, chunk)
    tf = k * np.array([r["cosine"] for r in rows])
    tf_sums = tf if tf_sums is None else tf_sums + tf
  if not parts:
    raise CompoundingError("no images to measure")
  cosines = jax.tree.map(lambda *a: np.concatenate(a, axis=-1), *parts)
  return summarize(cosines, tf_sums / len(images), photos)


# ---------------------------------------------------------------------------------- table and plot


def _fmt(value: float | None) -> str:
  return "   -  " if value is None else f"{value:6.3f}"


def format_table(results: Mapping[str, Any]) -> str:
  """One line per layer: the teacher-forced attention cosine, then per measure the fixed
  student's cosine and the share of the gap it recovers, the broken teacher's cosine and its gap
  as a share of the student's."""
  measures = list(results["baseline"])
  lines = [
      f"{results['n_photos']} photo(s); student: "
      + ", ".join(f"{m} {results['baseline'][m]:.4f}" for m in measures),
      "fix: the student with the layer's teacher attention (recov: the share of the student's "
      "gap it closes); break: the teacher with the layer's student attention (alone: its gap / "
      "the student's)",
      " " * 13 + "".join(f"| {m:<29}" for m in measures),
      "layer tf cos " + "| fix     recov  break   alone " * len(measures),
  ]
  for r in results["layers"]:
    cells = "".join(
        f"| {r[f'fix_{m}']:.4f} {_fmt(r['recovered_share'][m])}  {r[f'break_{m}']:.4f} "
        f"{_fmt(r['gap_alone_share'][m])} "
        for m in measures
    )
    lines.append(f"{r['layer']:5d} {_fmt(r.get('attention_tf_cosine'))} {cells}")
  sums = [
      f"{m}: recovered {_fmt(results['sum_recovered_share'][m]).strip()}, alone "
      f"{_fmt(results['sum_gap_alone_share'][m]).strip()}"
      for m in measures
  ]
  lines.append("sum over layers: " + "; ".join(sums))
  worst = results.get("per_photo", [])[:WORST_PHOTOS_SHOWN]
  if worst:
    m = measures[0]
    lines.append(f"worst photos by {m}: the student's cosine, then the layers whose fix gains most")
    for row in worst:
      gains = row["fix_gain"][m]
      best = np.argsort(gains)[::-1][:3]
      lines.append(
          f"  {row['photo']}: {row['student'][m]:.4f}; "
          + ", ".join(f"layer {l} {gains[l]:+.4f}" for l in best)
      )
  return "\n".join(lines)


# ---------------------------------------------------------------------------------------- the CLI


def run(args: argparse.Namespace) -> dict[str, Any]:
  """The study of one export on one folder of photos: `measure`'s results with what they rest
  on (the paths, the size, the view, how many photos were enlarged to make it)."""
  paths = study_cli.photo_paths(args.photos)
  student = linvit_jax.load_student(args.student)
  res = args.res or (student.training_size[0] if student.training_size else 0)
  if not res:
    raise CompoundingError(f"student '{args.student}' records no input size: pass --res")
  if res % student.patch[0] or res % student.patch[1]:
    raise CompoundingError(f"--res {res}: not a multiple of the patch size {student.patch}")
  teacher, teacher_params = compare.load_teacher(args.teacher, student, res)
  trained = student.training_size or (res, res)
  pp = photo_eval.view_pp(args.views, res, photo_eval.value_ops(compare.student_pp(student)))
  images, upsampled = photo_tokens.decode_views(paths, {"view": inference_pp.Preprocess(pp)}, res)
  results = measure(
      teacher,
      study_cli.params_at(teacher_params, student.patch, trained, res),
      student.model,
      study_cli.params_at(student.params, student.patch, trained, res),
      images["view"],
      photo_tokens.batch_size(teacher, res),
      [os.path.basename(p) for p in paths],
  )
  where = {"student": args.student, "teacher": args.teacher, "photos": args.photos}
  return {**where, "res": res, "view": args.views, "upsampled": upsampled["view"], **results}


def main(argv: list[str] | None = None) -> int:
  parser = study_cli.Parser(
      prog="python -m linvit_jax.studies.compounding",
      description="Per layer, how much of the student's final gap to its teacher its attention "
      "causes.",
  )
  parser.add_argument("--student", required=True, help="the export folder (a run's workdir)")
  parser.add_argument("--teacher", required=True, help="the teacher: npz, model folder, hub name")
  parser.add_argument("--photos", required=True, help="a folder of photos (all of them are used)")
  parser.add_argument("--res", type=int, default=0, help="size in px (default: the training size)")
  parser.add_argument(
      "--views", choices=photo_eval.VIEWS, default="whole", help="photo_eval's view"
  )
  parser.add_argument("--out", default="", help="write the results as JSON here")
  parser.add_argument("--plot", default="", help="draw the per-layer shares as a PNG here")
  return study_cli.run_and_report(
      parser.parse_args(argv), run, plots.plot_compounding, format_table
  )


if __name__ == "__main__":
  sys.exit(main())
