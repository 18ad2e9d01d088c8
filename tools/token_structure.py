"""How much of a teacher's patch tokens is shared by the whole photo, and how well a run's student
matches the rest: the measurement behind `align_w_structure` (docs/levers.md).

  python tools/token_structure.py WORKDIR [--factors 1,2] [--out F.json]

On the run's VALIDATION photos (config.data.eval_split), whole views at each factor × res
(photo_eval's views), final tokens of the exported student and its teacher, patches only:
  patch_cosine      mean cosine of the tokens (photo_eval's patch cosine);
  deviation_cosine  the same on each token minus its photo's mean patch token
                    (1 − distill.token_structure_loss);
  mean_token_share  |photo's mean patch token| / mean |patch token|, the teacher's (how large
                    the part every patch of a photo shares is).
Means over photos; prints and writes JSON (default WORKDIR/token_structure.json).
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


def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  return np.sum(a * b, -1) / np.maximum(
      np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1), 1e-6
  )


def measure(
    workdir: str, factors: tuple[float, ...] = (1, 2), teacher_init: str = ""
) -> dict[str, Any]:
  from linvit_jax.data import inference_pp
  from linvit_jax.evaluation import photo_eval
  from linvit_jax.evaluation import photo_tokens
  from tools import resolution_curves

  config, res, student, teacher, teacher_params, paths, values = resolution_curves.validation_setup(
      workdir, teacher_init
  )
  prefix = teacher.num_prefix_tokens
  sizes = resolution_curves.sizes_for(res, factors, teacher.patch_size)
  t_tok = photo_tokens.Tokens(teacher, teacher_params, res)
  s_tok = photo_tokens.Tokens(student.model, student.params, res)
  rows = []
  for at in sizes:
    pps = {"whole": inference_pp.Preprocess(photo_eval.view_pp("whole", at, values))}
    tokens, _ = photo_tokens.forward_all(t_tok, s_tok, paths, pps, at)
    t, s = (x[:, prefix:] for x in tokens["whole"])
    t_dev, s_dev = t - t.mean(1, keepdims=True), s - s.mean(1, keepdims=True)
    share = np.linalg.norm(t.mean(1), axis=-1) / np.linalg.norm(t, axis=-1).mean(1)
    rows.append({
        "size": at,
        "patch_cosine": float(_cos(s, t).mean()),
        "deviation_cosine": float(_cos(s_dev, t_dev).mean()),
        "mean_token_share": float(share.mean()),
    })  # fmt: skip
    print(json.dumps(rows[-1]), flush=True)
  return {"workdir": os.path.basename(os.path.normpath(workdir)), "n_photos": len(paths),
          "split": config.data.eval_split, "view": "whole", "rows": rows}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("workdir")
  parser.add_argument("--factors", default="1,2")
  parser.add_argument("--out", default="")
  parser.add_argument("--teacher", default="", help="the teacher checkpoint (default: recorded)")
  args = parser.parse_args(argv)
  out = measure(args.workdir, tuple(float(f) for f in args.factors.split(",")), args.teacher)
  path = args.out or os.path.join(args.workdir, "token_structure.json")
  with open(path, "w") as f:
    json.dump(out, f, indent=1)
    f.write("\n")
  print(f"wrote {path}")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
