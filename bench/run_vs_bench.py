"""Why the run's 896-px speed ratio (results.json's test rows: the teacher's and the student's
forwards on the test photos) and bench/hybrid_speed's disagree: the same student timed both ways,
with its trained params and with random ones, on a real photo and on noise, interleaved.

    python -m bench.run_vs_bench --student WORKDIR --teacher T.npz --photo P.jpg [--px 896] \
        [--batch 1] [--out bench/results/run_vs_bench_896.json]

Cases (round-robin, first call excluded, bench/common.time_interleaved), seconds per image at
`--batch` copies of the photo per forward (the run's photo_eval batches 2 at 896 px:
photo_tokens.batch_size):
  teacher / student, trained params, real photo — what the run times (through photo_tokens.Tokens:
  the jitted apply returning the tokens, copied to the host);
  teacher / student, random params (bench/hybrid_speed's init) on the same photo;
  student, trained params, on noise (bench/hybrid_speed's input).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

import linvit_jax
from bench import common
from linvit_jax import compare
from linvit_jax.data import inference_pp
from linvit_jax.evaluation import photo_eval
from linvit_jax.evaluation import photo_tokens

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--student", required=True)
  parser.add_argument("--teacher", required=True)
  parser.add_argument("--photo", required=True)
  parser.add_argument("--px", type=int, default=896)
  parser.add_argument("--reps", type=int, default=3)
  parser.add_argument("--batch", type=int, default=1)
  parser.add_argument("--out", default="")
  args = parser.parse_args(argv)
  if args.batch < 1:
    parser.error(f"--batch {args.batch}: at least 1 image per forward")

  student = linvit_jax.load_student(args.student)
  res = student.training_size[0]
  teacher_model, teacher_params = compare.load_teacher(args.teacher, student, res)
  pp = photo_eval.view_pp("whole", args.px, photo_eval.value_ops(compare.student_pp(student)))
  photo = np.repeat(inference_pp.Preprocess(pp)(args.photo)[None], args.batch, axis=0)
  noise = np.random.RandomState(0).randn(*photo.shape).astype(np.float32)
  grid = args.px // student.model.patch_size[0]

  def random_params(model: Any) -> Any:
    x = np.zeros_like(photo)
    return jax.jit(model.init)(jax.random.PRNGKey(0), x)["params"]

  tokens = {
      "teacher": photo_tokens.Tokens(teacher_model, teacher_params, res),
      "student": photo_tokens.Tokens(student.model, student.params, res),
      "teacher_random": photo_tokens.Tokens(teacher_model, random_params(teacher_model), args.px),
      "student_random": photo_tokens.Tokens(student.model, random_params(student.model), args.px),
  }
  cases = {name: (lambda t=t: t(photo, args.batch)) for name, t in tokens.items()}
  cases["student_noise"] = lambda: tokens["student"](noise, args.batch)
  machine = common.machine_summary()  # the load average before the timing
  timings = common.time_interleaved(cases, args.reps)
  out = {
      "machine": machine,
      "commit": common.git_commit(REPO),
      "date": time.strftime("%Y-%m-%d"),
      "px": args.px,
      "grid": grid,
      "student": args.student,
      "reps": args.reps,
      "batch": args.batch,
      "rows": [],
  }
  for name in cases:
    per_image = [t / args.batch for t in timings.wall[name]]
    out["rows"].append({"case": name, "s": float(np.median(per_image)), "times_s": per_image})
  t = {r["case"]: r["s"] for r in out["rows"]}
  out["ratio_trained"] = t["teacher"] / t["student"]
  out["ratio_random"] = t["teacher_random"] / t["student_random"]
  if args.out:
    common.save_result(out, args.out, table)
  else:
    print(table(out))
  return out


def table(result: dict[str, Any]) -> str:
  """The markdown table of one result: seconds per image of each case and the two ratios."""
  lines = ["| case | s / image |", "|---|---|"]
  lines += [f"| {r['case']} | {r['s']:.3f} |" for r in result["rows"]]
  lines.append(
      f"\nteacher ÷ student at {result['px']} px, batch {result.get('batch', 1)}: "
      f"trained {result['ratio_trained']:.2f}×, "
      f"random {result['ratio_random']:.2f}×."
  )
  if "machine" in result:
    lines.append(common.result_footer(result, "through photo_tokens.Tokens"))
  return "\n".join(lines)


if __name__ == "__main__":
  main()
