r"""The levers of a linear layer, each on and off, on one checkpoint: one convert_folder run per arm.

  .venv/bin/python -m tools.lever_table --init CKPT --images DIR --res 112 --max_images 2000 \
      --out docs/levers_112 [--arms baseline,exact_prefix,center_keys,conv_v,all]

Each arm is `configs/convert_folder.py` with the same photos, budget and seed and one lever
switched on (`all`: every lever); its workdir is `<out>/<arm>` (a finished arm is reused: the run
resumes). Writes `<out>/levers.json` and `<out>/levers.md`: per arm the final cls and mean patch
cosine on held-out crops, the worst per-layer teacher-forced cosine, k-NN retention, and images/s
of the student against the teacher at 1× and 2× the resolution (the run's own resolution rows).

Every arm starts from `BASE`, the recipe the table was first measured on (no lever, distillation
only), not from `convert_folder`'s defaults: the defaults move as levers are adopted, and an
arm's row must mean the same run whenever it is made again.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

# convert_folder's settings for every arm before its own changes: no lever inside the layer, the
# whole budget distilled, and the `align` stage (for arms that add one) as it first was.
BASE = {
    "feature_map": "hedgehog_exp",
    "policy": "copy_all",
    "exact_prefix": False,
    "center_keys": False,
    "conv_v": False,
    "window": 0,
    "sinks": 0,
    "compose": 0.0,
    "lr_distill": 1e-3,
    "distill_trainable": "distill_attention",
    "distill_fraction": 1.0,
    "lr_align": 1e-4,
    "align_trainable": "attention",
    "align_update_scale": "absolute",
    "align_warmup": 0.05,
    "align_mixup": 0.0,
    "align_start_weight": 0.0,
    "align_lora": 0,
}
# The align recipe convert_folder adopted, after the same distillation (`align_extra`).
_ALIGN_RMS = {
    "center_keys": True,
    "conv_v": True,
    "align_extra": True,
    "align_trainable": "all",
    "align_update_scale": "param_rms",
    "lr_align": 2e-4,
    "align_warmup": 0.25,
}

ARMS = {
    "baseline": {},
    "exact_prefix": {"exact_prefix": True},
    "center_keys": {"center_keys": True},
    "conv_v": {"conv_v": True},
    "all": {"exact_prefix": True, "center_keys": True, "conv_v": True},
    # ViT-AdaLA's stage 2: after distilling attention on half the budget, the whole network
    # tuned to the teacher's block outputs and final tokens at a small lr (align stage).
    "center_conv": {"center_keys": True, "conv_v": True},
    # LoLCATs' hybrid inside each layer: exact softmax on a w×w patch window (+ prefix keys).
    "center_conv_window3": {"center_keys": True, "conv_v": True, "window": 3},
    "center_conv_window5": {"center_keys": True, "conv_v": True, "window": 5},
    # Attention sinks: the cls key and the m patch keys of largest norm exact for every query.
    "center_conv_sinks4": {"center_keys": True, "conv_v": True, "sinks": 4},
    "center_conv_sinks16": {"center_keys": True, "conv_v": True, "sinks": 16},
    # What the distillation trains (distill_trainable): v/out frozen (the LayerScale columns
    # keep the teacher's values), or q/k frozen (LoLCATs' stage 1: φ adapts, exact rows read the
    # teacher's own scores).
    "center_conv_routing": {
        "center_keys": True,
        "conv_v": True,
        "distill_trainable": "attention_routing",
    },
    "center_conv_features": {
        "center_keys": True,
        "conv_v": True,
        "distill_trainable": "attention_features",
    },
    "center_conv_features_exact_prefix": {
        "center_keys": True,
        "conv_v": True,
        "exact_prefix": True,
        "distill_trainable": "attention_features",
    },
    # The distillation's learning rate around the default 1e-3 (q/k move 60-90 % at 1e-3).
    "center_conv_lr5e-4": {"center_keys": True, "conv_v": True, "lr_distill": 5e-4},
    "center_conv_lr2e-3": {"center_keys": True, "conv_v": True, "lr_distill": 2e-3},
    # Varied inputs from few photos: half of each batch 2×2 mosaics of four crops.
    "center_conv_compose": {"center_keys": True, "conv_v": True, "compose": 0.5},
    # Stage 2 after the same distillation budget (`align_extra`: max_images is doubled and the
    # second half goes to align): every parameter, lr 3e-6 in parameter units, or 2e-4 relative
    # to each output column's RMS (update_scale=param_rms), warm-up a quarter of the stage.
    "center_conv_align_abs3e-6": {**_ALIGN_RMS, "align_update_scale": "absolute", "lr_align": 3e-6},
    "center_conv_align_rms2e-4": _ALIGN_RMS,
    # Its later steps: label-free mixup views handing on the midpoint of the aligned and the
    # distilled weights (the default before LoRA), and rank-8 LoRA handing on the aligned ones.
    "center_conv_align_mixup_mid": {**_ALIGN_RMS, "align_mixup": 1.0, "align_start_weight": 0.5},
    "center_conv_align_mixup_lora8": {**_ALIGN_RMS, "align_mixup": 1.0, "align_lora": 8},
    "align_all": {"distill_fraction": 0.5, "align_trainable": "all", "lr_align": 2e-5},
    "all_align_all": {
        "exact_prefix": True,
        "center_keys": True,
        "conv_v": True,
        "distill_fraction": 0.5,
        "align_trainable": "all",
        "lr_align": 2e-5,
    },
}


def arm_options(name: str, args: argparse.Namespace) -> dict:
  """convert_folder's arguments for arm `name`: `BASE`, the arm's changes, the run's budget."""
  arm = {**BASE, **ARMS[name]}
  max_images = args.max_images
  if arm.pop("align_extra", False):  # the same distillation, then as many images of align
    max_images, arm["distill_fraction"] = 2 * max_images, 0.5
  return dict(
      arm,
      res=args.res,
      max_images=max_images,
      batch=args.batch,
      knn=args.knn,
      knn_train=args.knn_train,
      knn_eval=args.knn_eval,
  )


def run_arm(name: str, args: argparse.Namespace) -> Any:
  import linvit_jax
  from linvit_jax.evaluation import results as results_lib

  workdir = os.path.join(args.out, name)
  linvit_jax.convert(args.init, images=args.images, workdir=workdir, **arm_options(name, args))
  return results_lib.read(os.path.join(workdir, "results.json"))


def row(name: str, results: Any) -> dict:
  """One arm's row from its run's results record (or results.json dict)."""
  from linvit_jax.evaluation import results as results_lib

  record = results_lib.as_record(results)
  _, final = record.final()  # the student as exported (end to end and per layer)
  e2e = final.end_to_end
  out = {
      "arm": name,
      "cls_cosine": e2e.get("cls_cosine"),
      "patch_cosine": e2e["patch_cosine"],
      "worst_layer_cosine": min(r["cosine"] for r in final.layers),
      "knn_retention": (record.knn or {}).get("retention"),
      "distill_s": record.timing_s.get("distill_attention"),
  }
  for r in record.resolution or []:
    out[f"speedup_{r['image_size']}px"] = r["student_images_per_s"] / r["teacher_images_per_s"]
    out[f"cls_cosine_{r['image_size']}px"] = r.get("cls_cosine")
  return out


def speed(arms: list[str], sizes: list[int], batch: int = 1) -> list[dict]:
  """Forward images/s of a ViT-S/14 student per arm against the softmax teacher at each size
  (random weights: speed does not depend on them), measured side by side in one process."""
  import jax
  import numpy as np

  from linvit_jax.evaluation import evaluate
  from linvit_jax.models import vit

  arch = dict(num_classes=None, variant="S/14", pool_type="tok", gelu_approximate=False)
  rows = []
  for size in sizes:
    images = np.zeros((batch, size, size, 3), np.float32)
    teacher = vit.Model(**arch)
    params = jax.jit(teacher.init)(jax.random.PRNGKey(0), images)["params"]
    t_ips = evaluate.images_per_second(teacher, params, images, repeats=3)
    row = {"image_size": size, "teacher_images_per_s": t_ips}
    for name in arms:
      levers = {
          k: v
          for k, v in ARMS[name].items()
          if k in ("exact_prefix", "center_keys", "conv_v", "window")
      }
      spec = dict(
          kind="linear",
          feature_map="hedgehog_exp",
          conv_v=levers.get("conv_v", False),
          exact_prefix_rows=levers.get("exact_prefix", False),
          center_keys=levers.get("center_keys", False),
          window=levers.get("window", 0),
      )
      student = vit.Model(**arch, attention=spec)
      s_params = jax.jit(student.init)(jax.random.PRNGKey(0), images)["params"]
      row[f"{name}_speedup"] = (
          evaluate.images_per_second(student, s_params, images, repeats=3) / t_ips
      )
    rows.append(row)
    print(row, flush=True)
  return rows


def table(rows: list[dict]) -> str:
  cols = list(rows[0])
  fmt = lambda v: "—" if v is None else (f"{v:.4f}" if isinstance(v, float) else str(v))  # noqa: E731
  lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
  lines += ["| " + " | ".join(fmt(r.get(c)) for c in cols) + " |" for r in rows]
  return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--init", required=True)
  p.add_argument("--images", required=True)
  p.add_argument("--out", required=True)
  p.add_argument("--res", type=int, default=112)
  p.add_argument("--max_images", type=int, default=2000)
  p.add_argument("--batch", type=int, default=8)
  p.add_argument("--knn", default="fashion_mnist_local")
  p.add_argument("--knn_train", type=int, default=500)
  p.add_argument("--knn_eval", type=int, default=250)
  p.add_argument("--arms", default=",".join(ARMS))
  p.add_argument("--speed_sizes", default="", help="e.g. 224,448,896: time the arms' students")
  args = p.parse_args(argv)
  os.makedirs(args.out, exist_ok=True)
  if args.speed_sizes:
    arms = [a for a in args.arms.split(",") if not a.endswith("align_all")]
    rows = speed(arms, [int(x) for x in args.speed_sizes.split(",")])
    with open(os.path.join(args.out, "lever_speed.json"), "w") as f:
      json.dump(rows, f, indent=1)
    with open(os.path.join(args.out, "lever_speed.md"), "w") as f:
      f.write(table(rows) + "\n")
    return rows
  # Rows of arms run earlier into the same folder stay in the table (an arm run again replaces
  # its row), so a table can be built in parts.
  path = os.path.join(args.out, "levers.json")
  rows = []
  if os.path.exists(path):
    with open(path) as f:
      rows = json.load(f)["rows"]
  for name in args.arms.split(","):
    rows = [r for r in rows if r["arm"] != name] + [row(name, run_arm(name, args))]
    with open(path, "w") as f:
      json.dump({"args": vars(args), "rows": rows}, f, indent=1)
    with open(os.path.join(args.out, "levers.md"), "w") as f:
      f.write(table(rows) + "\n")
    print(table(rows), flush=True)
  return rows


if __name__ == "__main__":
  main()
