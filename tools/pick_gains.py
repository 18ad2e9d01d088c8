"""Which layer each hybrid pick rule would give a finished run's distilled (all-linear) student:
`layer_swap.per_image_fix_gains` on the images each `student.softmax_pick_images` choice reads.

  python tools/pick_gains.py WORKDIR [--step N] [--teacher INIT] [--out F.json]

Reads the distill_attention stage's checkpoint (the latest, or --step) of a convert_folder-style
run: the student before its hybrid swap, every layer the run's linear operator. On the run's own
held-out images, "sample" (the fidelity sample: eval.sample_pp's random views) and "eval_view"
(pp_eval's one view per image), per layer l the gain in cosine to the teacher's final tokens
(mean of cls and patch) with layer l's attention the teacher's, averaged over all images
("sensitivity") and over the quarter the student is furthest on ("sensitivity_worst"), and the
layer each rule picks. Nothing is trained; about 2·depth forwards per image set.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def rules(baseline: np.ndarray, gains: np.ndarray, worst_share: float) -> dict[str, Any]:
  """Per rule, the mean gain per layer and the layer it picks (`gains` [L, B])."""
  from linvit_jax.evaluation import layer_swap

  out = {}
  for rule, share in (("sensitivity", 1.0), ("sensitivity_worst", worst_share)):
    mean = layer_swap.mean_gains(baseline, gains, share)
    out[rule] = {"gains": [round(g, 6) for g in mean], "pick": int(np.argmax(mean))}
  return out


def distilled_student(workdir: str, step: int | None) -> tuple[Any, Any, Any, int]:
  """(exported student, the all-linear model, the distill_attention checkpoint's params, step)."""
  import orbax.checkpoint as ocp

  import linvit_jax
  from linvit_jax.models import vit

  student = linvit_jax.load_student(workdir)
  folder = os.path.join(workdir, "distill_attention", "checkpoints")
  steps = sorted(int(s) for s in os.listdir(folder) if s.isdigit()) if os.path.isdir(folder) else []
  if not steps:
    raise SystemExit(f"error: {folder} holds no checkpoint")
  step = steps[-1] if step is None else step
  if step not in steps:
    raise SystemExit(f"error: no checkpoint at step {step} in {folder}; there are {steps}")
  raw = ocp.PyTreeCheckpointer().restore(os.path.join(folder, str(step), "default"))
  linear = [s for s in vit.layer_specs(student.model) if s.kind == "linear"]
  if not linear:
    raise SystemExit(f"error: {workdir}'s student has no linear layer to read the operator from")
  model = student.model.clone(attention=tuple(linear[0] for _ in range(student.model.depth)))
  return student, model, raw["params"], step


def measure(workdir: str, step: int | None = None, teacher_init: str = "") -> dict[str, Any]:
  import ml_collections as mlc

  from linvit_jax import build
  from linvit_jax import compare
  from linvit_jax.evaluation import layer_swap

  with open(os.path.join(workdir, "config.json")) as f:
    config = mlc.ConfigDict(json.load(f))
  student, model, params, step = distilled_student(workdir, step)
  size = config.data.image_size
  res = int(size[0] if isinstance(size, (tuple, list)) else size)
  teacher, teacher_params = compare.load_teacher(teacher_init or config.teacher.init, student, res)
  n = config.eval.fidelity_images
  images = {
      "sample": build.sample_images(config)[:n],
      "eval_view": build.eval_view_images(config, n),
  }
  out: dict[str, Any] = {"workdir": workdir, "step": step, "worst_share": layer_swap.WORST_SHARE}
  for name, batch in images.items():
    baseline, gains = layer_swap.per_image_fix_gains(teacher, teacher_params, model, params, batch)
    out[name] = {
        "images": len(batch),
        "student_cosine": round(float(baseline.mean()), 6),
        **rules(baseline, gains, layer_swap.WORST_SHARE),
    }
  return out


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("workdir")
  parser.add_argument("--step", type=int, default=None, help="default: the latest checkpoint")
  parser.add_argument("--teacher", default="", help="default: the run's teacher.init")
  parser.add_argument("--out", default="", help="default: WORKDIR/pick_gains.json")
  args = parser.parse_args(argv)
  results = measure(args.workdir, args.step, args.teacher)
  for name in ("sample", "eval_view"):
    block = results[name]
    for rule in ("sensitivity", "sensitivity_worst"):
      gains = " ".join(f"{g:+.3f}" for g in block[rule]["gains"])
      print(f"{name:9s} {rule:17s} pick {block[rule]['pick']:2d}: {gains}")
  out = args.out or os.path.join(args.workdir, "pick_gains.json")
  with open(out, "w") as f:
    json.dump(results, f, indent=1)
  print(f"wrote {out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
