"""Fidelity curves at every deployment size: each kept checkpoint of a finished run, on its
VALIDATION photos, at res, 2·res and 4·res.

  python tools/resolution_curves.py WORKDIR [--factors 1,2,4] [--views whole] [--out F.json]
      [--plot F.png]

A run's own curves (fidelity_curves.png) are measured on validation crops at the training size
only; a student converted for high-resolution work needs its curve where it is deployed. This
reads every checkpoint the run kept (run it with `--config.<stage>.max_to_keep` above the
stage's saves to keep them all), loads its student params into the exported student's model, and
measures cls and patch cosine (photo_eval's definitions: whole views resized from the original
photo, both models' position tables resampled) on the run's validation split
(`config.data.eval_split`) — the photos the run chooses on, never its test photos. The teacher's
tokens are computed once per size and view; each checkpoint costs one student forward per photo.

Writes {"workdir", "res", "sizes", "views", "n_photos", "points": [{"stage", "step",
"images_seen", "size", "view", "cls_cosine", "patch_cosine"} (means over photos)]} to --out
(default WORKDIR/resolution_curves.json) and a plot (default WORKDIR/resolution_curves.png).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _config(workdir: str) -> Any:
  import ml_collections

  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path):
    raise SystemExit(f"error: {path!r} does not exist (not a finished run's workdir)")
  with open(path) as f:
    return ml_collections.ConfigDict(json.load(f))


def checkpoint_steps(workdir: str, stage: str) -> list[int]:
  """The complete checkpoints a stage kept, by step (orbax writes commit_success.txt last)."""
  folder = os.path.join(workdir, stage, "checkpoints")
  if not os.path.isdir(folder):
    return []
  return sorted(
      int(name)
      for name in os.listdir(folder)
      if name.isdigit() and os.path.exists(os.path.join(folder, name, "commit_success.txt"))
  )


def restore_params(workdir: str, stage: str, step: int) -> Any:
  """The student params of one checkpoint, as numpy arrays (no target tree: read as saved)."""
  import orbax.checkpoint as ocp

  folder = os.path.abspath(os.path.join(workdir, stage, "checkpoints"))  # orbax: absolute only
  options = ocp.CheckpointManagerOptions(read_only=True)
  with ocp.CheckpointManager(folder, options=options) as manager:
    state = manager.restore(step, args=ocp.args.StandardRestore())
  return state["params"]


def validation_setup(workdir: str) -> tuple[Any, int, Any, Any, Any, list[str], str]:
  """(config, res, exported student, teacher model, teacher params, validation photo paths, the
  pp's value ops) of a finished run: what a measurement on its validation photos starts from."""
  import linvit_jax
  from linvit_jax import build
  from linvit_jax import photo_eval
  from linvit_jax.data import pp_spec

  config = _config(workdir)
  size = config.data.image_size
  res = int(size[0] if isinstance(size, (tuple, list)) else size)
  student = linvit_jax.load_student(workdir)
  teacher, teacher_params = photo_eval.load_teacher(config.teacher.init, student, res)
  paths, _ = build.photo_paths(config, config.data.eval_split, "data.eval_split")
  values = photo_eval.value_ops(pp_spec.inference_pp(config.data.pp_eval))
  return config, res, student, teacher, teacher_params, paths, values


def measure(
    workdir: str, factors: tuple[float, ...] = (1, 2, 4), views: tuple[str, ...] = ("whole",)
) -> dict[str, Any]:
  from linvit_jax import inference_pp
  from linvit_jax import photo_eval

  config, res, student, teacher, teacher_params, paths, values = validation_setup(workdir)
  prefix, has_cls = teacher.num_prefix_tokens, teacher.pool_type == "tok"
  sizes = [int(round(f * res)) for f in factors]
  checkpoints = [
      (stage, step) for stage in config.stages for step in checkpoint_steps(workdir, stage)
  ]
  if not checkpoints:
    raise SystemExit(f"error: {workdir!r} kept no checkpoint of stages {list(config.stages)}")
  seen_before, offsets = 0, {}
  for stage in config.stages:  # images seen at the start of each stage
    offsets[stage] = seen_before
    seen_before += int(config[stage].steps) * int(config[stage].batch_size)
  t_tok = photo_eval._Tokens(teacher, teacher_params, res)
  points = []
  for size in sizes:
    t0 = time.time()
    pps = {v: inference_pp.Preprocess(photo_eval.view_pp(v, size, values)) for v in views}
    batch = photo_eval._batch_size(teacher, size)
    chunks = [
        photo_eval._views(paths[i : i + batch], pps, size)[0] for i in range(0, len(paths), batch)
    ]
    teacher_tokens = {v: np.concatenate([t_tok(c[v], batch) for c in chunks]) for v in views}
    for stage, step in checkpoints:
      params = restore_params(workdir, stage, step)
      s_tok = photo_eval._Tokens(student.model, params, res)
      for view in views:
        s = np.concatenate([s_tok(c[view], batch) for c in chunks])
        t = teacher_tokens[view]
        point = {
            "stage": stage,
            "step": step,
            "images_seen": offsets[stage] + step * int(config[stage].batch_size),
            "size": size,
            "view": view,
            "patch_cosine": float(photo_eval._cosine(s[:, prefix:], t[:, prefix:]).mean()),
        }
        if has_cls:
          point["cls_cosine"] = float(photo_eval._cosine(s[:, 0], t[:, 0]).mean())
        points.append(point)
    print(f"{size} px: {len(checkpoints)} checkpoints in {time.time() - t0:.0f} s", flush=True)
  return {
      "workdir": workdir,
      "res": res,
      "sizes": sizes,
      "views": list(views),
      "n_photos": len(paths),
      "split": config.data.eval_split,
      "points": points,
  }


def plot(curves: dict[str, Any], path: str) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  keys = [k for k in ("cls_cosine", "patch_cosine") if any(k in p for p in curves["points"])]
  fig, axes = plt.subplots(1, len(keys), figsize=(5.5 * len(keys), 4), squeeze=False)
  for ax, key in zip(axes[0], keys):
    for size in curves["sizes"]:
      for view in curves["views"]:
        pts = [p for p in curves["points"] if p["size"] == size and p["view"] == view]
        pts.sort(key=lambda p: p["images_seen"])
        label = f"{size} px" + (f" {view}" if len(curves["views"]) > 1 else "")
        ax.plot([p["images_seen"] for p in pts], [p[key] for p in pts], "o-", label=label)
    stage_starts = sorted(
        {p["images_seen"] for p in curves["points"] if p["stage"] != "distill_attention"}
    )
    if stage_starts:
      ax.axvline(min(stage_starts), color="gray", lw=0.5, ls="--")
    ax.set_xlabel("training images seen")
    ax.set_ylabel(key.replace("_", " "))
    ax.grid(alpha=0.3)
    ax.legend()
  fig.suptitle(f"validation photos (n={curves['n_photos']}), every kept checkpoint")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("workdir")
  parser.add_argument("--factors", default="1,2,4")
  parser.add_argument("--views", default="whole")
  parser.add_argument("--out", default="")
  parser.add_argument("--plot", default="")
  args = parser.parse_args(argv)
  factors = tuple(float(f) for f in args.factors.split(","))
  views = tuple(v for v in args.views.split(",") if v)
  curves = measure(args.workdir, factors, views)
  out = args.out or os.path.join(args.workdir, "resolution_curves.json")
  with open(out, "w") as f:
    json.dump(curves, f, indent=1)
  plot(curves, args.plot or os.path.join(args.workdir, "resolution_curves.png"))
  print(f"wrote {out}")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
