"""Wall time of the demo's evaluation pieces (compile included: each runs once per run).

    python -m bench.bench_eval [--out OUT.json]

On the shipped Fashion-MNIST teacher and its hedgehog copy_same student (configs/demo.py):
calibration of the fresh attention (64 images), cls-attention maps of teacher and student
(8 images), teacher-forced attention fidelity and end-to-end fidelity (256 images). Each piece is
timed on its first call (what a run pays: tracing + compiling + running) and on a second call.
Run it on two commits to compare (the JSON records the git commit).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--out", default=os.path.join(REPO, "bench", "results", "eval.json"))
  args = p.parse_args(argv)
  from configs import demo
  from linvit_jax import build
  from linvit_jax.conversion import calibrate
  from linvit_jax.conversion import surgery
  from linvit_jax.evaluation import evaluate
  from linvit_jax.models import vit_checkpoint

  c = demo.get_config()
  c.compile_cache = "none"
  teacher, student = build.models(c)
  x = np.asarray(
      jax.random.uniform(jax.random.PRNGKey(0), (256, 28, 28, 1), minval=-1.0, maxval=1.0)
  )
  t_init = teacher.init(jax.random.PRNGKey(0), x[:1])["params"]
  tp = vit_checkpoint.load_vit_params(t_init, c.teacher.init, build.model_kwargs(c.model))
  sp, _ = surgery.transplant(tp, student.init(jax.random.PRNGKey(1), x[:1])["params"], "copy_same")

  pieces = {
      "calibrate": lambda: calibrate.calibrate(teacher, tp, student, sp, x[:64]),
      "cls_attention_maps": lambda: (
          evaluate.cls_attention_maps(teacher, tp, x[:8]),
          evaluate.cls_attention_maps(student, sp, x[:8]),
      ),
      "attention_fidelity": lambda: evaluate.attention_fidelity(teacher, tp, student, sp, x),
      "end_to_end_fidelity": lambda: evaluate.end_to_end_fidelity(teacher, tp, student, sp, x),
  }
  rows = {}
  for name, fn in pieces.items():
    times = []
    for _ in range(2):
      t0 = time.perf_counter()
      jax.block_until_ready(jax.tree.leaves(fn()))
      times.append(time.perf_counter() - t0)
    rows[name] = {"first_s": times[0], "second_s": times[1]}
    print(f"{name:22s} first call {times[0]:6.2f} s   second {times[1]:6.2f} s", flush=True)
  commit = subprocess.run(
      ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
  ).stdout.strip()
  result = {"commit": commit, "rows": rows, "load_avg": os.getloadavg(), "date": time.ctime()}
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(result, f, indent=1)
  return result


if __name__ == "__main__":
  main(sys.argv[1:])
