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

Writes {"workdir", "res", "sizes", "views", "n_photos", "split", "stage_starts" (images seen
when each stage begins), "points": [{"stage", "step", "images_seen", "size", "view",
"cls_cosine", "patch_cosine"} (means over photos)]} to --out (default
WORKDIR/resolution_curves.json) and a plot (default WORKDIR/resolution_curves.png). A hybrid
run's checkpoints up to its first distill_attention stage are the all-linear student before the
swap (measured as such: every softmax layer of the export given the other layers' linear
operator); later ones are the hybrid. A run whose checkpoints are not the params its stages hand
on (EMA / tail averages, start weights, LoRA) is refused: its curve would describe models the run
never had.
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


def validation_setup(
    workdir: str, teacher_init: str = ""
) -> tuple[Any, int, Any, Any, Any, list[str], str]:
  """(config, res, exported student, teacher model, teacher params, validation photo paths, the
  pp's value ops) of a finished run: what a measurement on its validation photos starts from.
  `teacher_init` replaces the recorded config.teacher.init (a relative path is the run's cwd's)."""
  import linvit_jax
  from linvit_jax import build
  from linvit_jax import compare
  from linvit_jax.data import pp_spec
  from linvit_jax.evaluation import photo_eval

  config = _config(workdir)
  size = config.data.image_size
  res = int(size[0] if isinstance(size, (tuple, list)) else size)
  student = linvit_jax.load_student(workdir)
  init = teacher_init or config.teacher.init
  if not os.path.exists(init):
    raise SystemExit(
        f"error: the teacher {init!r} does not exist here (the run recorded it relative to its "
        "own working directory): pass --teacher PATH"
    )
  teacher, teacher_params = compare.load_teacher(init, student, res)
  paths, _ = build.photo_paths(config, config.data.eval_split, "data.eval_split")
  if not paths:
    raise SystemExit(
        f"error: the run's validation split {config.data.eval_split!r} holds no photos"
    )
  values = photo_eval.value_ops(pp_spec.inference_pp(config.data.pp_eval))
  return config, res, student, teacher, teacher_params, paths, values


def raw_params_differ(config: Any) -> list[str]:
  """Why a run's checkpoints are not what its student hands on (empty: they are): averages /
  start weights / LoRA merges change the params a stage hands on. (The hybrid swap does not: its
  checkpoints before and after it are each the student of their stage, `pre_swap_stages`.)"""
  reasons = []
  for stage in config.stages:
    block = config[stage]
    for field in ("start_weight", "lora_rank"):
      if block.get(field, 0):
        reasons.append(f"{stage}.{field}={block[field]}")
    for field in ("ema_decay", "average_last"):
      if block.get("optimizer", {}).get(field, 0):
        reasons.append(f"{stage}.optimizer.{field}={block.optimizer[field]}")
  return reasons


def pre_swap_stages(config: Any) -> set[str]:
  """The stages whose checkpoints hold the student before the hybrid swap: up to and including
  the first distill_attention stage of a run with student.softmax_layers (else none)."""
  if not config.student.get("softmax_layers", 0):
    return set()
  kinds = [config[stage].kind for stage in config.stages]  # as run.py finds the swap
  if "distill_attention" not in kinds:
    return set()
  return set(config.stages[: kinds.index("distill_attention") + 1])


def linear_model(model: Any) -> Any:
  """`model` with every softmax layer given the operator of its linear layers: the student before
  the hybrid swap (which turned those layers from the run's linear operator into softmax)."""
  from linvit_jax.models import vit

  specs = vit.layer_specs(model)
  linear = [s for s in specs if s.kind == "linear"]
  if not linear or len(set(linear)) != 1:
    raise SystemExit("error: the export's linear layers differ: the pre-swap student is unknown")
  return model.clone(attention=tuple(linear[0] for _ in specs))


def sizes_for(res: int, factors: tuple[float, ...], patch: tuple[int, ...]) -> list[int]:
  """res·factor for each factor, each a multiple of the patch (else SystemExit)."""
  sizes = [int(round(f * res)) for f in factors]
  bad = [s for s in sizes if s % patch[0] or s % patch[1]]
  if bad:
    raise SystemExit(f"error: sizes {bad} are not multiples of the patch {tuple(patch)}")
  return sizes


def measure(
    workdir: str,
    factors: tuple[float, ...] = (1, 2, 4),
    views: tuple[str, ...] = ("whole",),
    teacher_init: str = "",
) -> dict[str, Any]:
  from linvit_jax.evaluation import photo_tokens

  config, res, student, teacher, teacher_params, paths, values = validation_setup(
      workdir, teacher_init
  )
  reasons = raw_params_differ(config)
  if reasons:
    raise SystemExit(
        "error: this run's checkpoints are not the params its stages hand on ("
        + "; ".join(reasons)
        + "): their curve would describe models the run never had"
    )
  sizes = sizes_for(res, factors, teacher.patch_size)
  checkpoints = [
      (stage, step) for stage in config.stages for step in checkpoint_steps(workdir, stage)
  ]
  if not checkpoints:
    raise SystemExit(f"error: {workdir!r} kept no checkpoint of stages {list(config.stages)}")
  seen_before, offsets = 0, {}
  for stage in config.stages:  # images seen at the start of each stage
    offsets[stage] = seen_before
    seen_before += int(config[stage].steps) * int(config[stage].batch_size)
  t0 = time.time()
  teacher_side = _teacher_side(teacher, teacher_params, res, paths, values, sizes, views)
  print(f"teacher at {sizes} px: {time.time() - t0:.0f} s", flush=True)
  # One student forward for every checkpoint (one compile per size and model): its params are
  # swapped in. A hybrid's checkpoints before the swap are the all-linear student's.
  before_swap = pre_swap_stages(config)
  models = {False: student.model, True: linear_model(student.model) if before_swap else None}
  s_toks: dict[bool, Any] = {}
  points = []
  for stage, step in checkpoints:
    t0 = time.time()
    params = restore_params(workdir, stage, step)
    pre = stage in before_swap
    s_tok = s_toks.get(pre)
    if s_tok is None:
      s_tok = s_toks[pre] = photo_tokens.Tokens(models[pre], params, res)
    else:
      s_tok.swap_params(params)
    seen = offsets[stage] + step * int(config[stage].batch_size)
    base = {"stage": stage, "step": step, "images_seen": seen}
    points += _points(teacher, s_tok, teacher_side, base)
    print(f"{stage} {step}: {len(sizes)} sizes in {time.time() - t0:.0f} s", flush=True)
  return {
      "workdir": workdir,
      "res": res,
      "sizes": sizes,
      "views": list(views),
      "n_photos": len(paths),
      "split": config.data.eval_split,
      "stage_starts": offsets,
      "points": points,
  }


def _teacher_side(teacher, teacher_params, res, paths, values, sizes, views) -> dict[int, Any]:
  """Per size: (the photos' views in batches, the batch size, the teacher's tokens per view);
  made once, then read for every checkpoint."""
  from linvit_jax.data import inference_pp
  from linvit_jax.evaluation import photo_eval
  from linvit_jax.evaluation import photo_tokens

  t_tok = photo_tokens.Tokens(teacher, teacher_params, res)
  out = {}
  for size in sizes:
    pps = {v: inference_pp.Preprocess(photo_eval.view_pp(v, size, values)) for v in views}
    batch = photo_tokens.batch_size(teacher, size)
    chunks = [
        photo_tokens.decode_views(paths[i : i + batch], pps, size)[0]
        for i in range(0, len(paths), batch)
    ]
    tokens = {v: np.concatenate([t_tok(c[v], batch) for c in chunks]) for v in views}
    out[size] = (chunks, batch, tokens)
  return out


def _points(teacher, s_tok, teacher_side, base: dict[str, Any]) -> list[dict[str, Any]]:
  """One checkpoint's points: patch (and cls) cosine to the teacher per size and view."""
  from linvit_jax.evaluation import photo_eval

  prefix, has_cls = teacher.num_prefix_tokens, teacher.pool_type == "tok"
  points = []
  for size, (chunks, batch, teacher_tokens) in teacher_side.items():
    for view, t in teacher_tokens.items():
      s = np.concatenate([s_tok(c[view], batch) for c in chunks])
      point = {
          **base,
          "size": size,
          "view": view,
          "patch_cosine": float(photo_eval.cosine(s[:, prefix:], t[:, prefix:]).mean()),
      }
      if has_cls:
        point["cls_cosine"] = float(photo_eval.cosine(s[:, 0], t[:, 0]).mean())
      points.append(point)
  return points


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
    for start in sorted(curves.get("stage_starts", {}).values())[1:]:  # where each stage begins
      ax.axvline(start, color="gray", lw=0.5, ls="--")
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
  parser.add_argument("--teacher", default="", help="the teacher checkpoint (default: recorded)")
  args = parser.parse_args(argv)
  factors = tuple(float(f) for f in args.factors.split(","))
  views = tuple(v for v in args.views.split(",") if v)
  curves = measure(args.workdir, factors, views, args.teacher)
  out = args.out or os.path.join(args.workdir, "resolution_curves.json")
  with open(out, "w") as f:
    json.dump(curves, f, indent=1)
  plot(curves, args.plot or os.path.join(args.workdir, "resolution_curves.png"))
  print(f"wrote {out}")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
