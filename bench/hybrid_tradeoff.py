"""Hybrid students: keep the k layers that linearize worst as softmax; fidelity and speed vs k.

    python -m bench.hybrid_tradeoff --workdir workdirs/vits14_224 [--ks 0,1,2,3] \
        [--resolutions 224,448,896] [--out docs/hybrid_tradeoff]

Reads a finished convert_folder (or any run) workdir: its config.json, the teacher checkpoint it
names and the student after its first distill_attention stage (the stage's last orbax
checkpoint). For each k, the k layers with the lowest teacher-forced cosine on held-out images
(the rule `student.softmax_layers` uses) get softmax attention with the teacher's weights — no
further training, so the rows isolate what the operator choice buys — and are measured for
end-to-end fidelity to the teacher at the training resolution and for forward images/s (batch 1,
median of repeats, interleaved teacher/student) and XLA peak memory at every resolution. Writes
OUT.json, OUT.md and OUT.png. Run it on a quiet machine: the speeds are only comparable within one
run.
"""

from __future__ import annotations

import argparse
import json
import os

import jax
import ml_collections as mlc
import numpy as np
import orbax.checkpoint as ocp

from linvit_jax import build
from linvit_jax.conversion import surgery
from linvit_jax.evaluation import evaluate
from linvit_jax.evaluation import plots
from linvit_jax.models import vit


def _distilled_params(workdir: str, stage: str):
  ckpt_dir = os.path.abspath(os.path.join(workdir, stage, "checkpoints"))
  with ocp.CheckpointManager(ckpt_dir, options=ocp.CheckpointManagerOptions(read_only=True)) as m:
    step = m.latest_step()
    if step is None:
      raise FileNotFoundError(f"no checkpoint of stage {stage!r} in {ckpt_dir}")
    state = m.restore(step, args=ocp.args.StandardRestore())
  return state["params"], step


def main(argv=None) -> dict:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--workdir", required=True)
  ap.add_argument("--ks", default="0,1,2,3")
  ap.add_argument("--resolutions", default="224,448,896")
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--out", default="docs/hybrid_tradeoff")
  args = ap.parse_args(argv)
  with open(os.path.join(args.workdir, "config.json")) as f:
    config = mlc.ConfigDict(json.load(f))
  stage = next(s for s in config.stages if config[s].kind == "distill_attention")
  teacher_model, student_model = build.models(config)
  sample = build.sample_images(config, config.eval.fidelity_images)  # held-out views
  shapes = jax.eval_shape(teacher_model.init, jax.random.PRNGKey(0), sample[:1])["params"]
  teacher_params = vit.load(shapes, config.teacher.init, build.model_kwargs(config.model))
  student_params, step = _distilled_params(args.workdir, stage)
  fid = evaluate.attention_fidelity(
      teacher_model, teacher_params, student_model, student_params, sample
  )
  resolutions = [int(r) for r in args.resolutions.split(",")]
  teacher = (teacher_model, teacher_params)
  rows = []
  for k in (int(x) for x in args.ks.split(",")):
    layers = surgery.worst_layers(fid, k)
    hybrid = surgery.to_softmax_layers(teacher_params, student_model, student_params, layers)
    row = _fidelity_row(k, layers, fid, teacher, hybrid, sample)
    for res in resolutions:
      _measure_speed(
          row, rows, res, config.model.patch_size[0], teacher, hybrid, sample, args.repeats
      )
    print(json.dumps(row), flush=True)
    rows.append(row)
  out = {
      "workdir": args.workdir,
      "stage": stage,
      "step": int(step),
      "image_size": config.data.image_size,
      "teacher_forced_cosine": [r["cosine"] for r in fid],
      "rows": rows,
      "load": os.getloadavg(),
  }
  os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
  with open(args.out + ".json", "w") as f:
    json.dump(out, f, indent=1)
  lines = _table(out, resolutions, len(sample))
  with open(args.out + ".md", "w") as f:
    f.write("\n".join(lines) + "\n")
  _plot(rows, resolutions, args.out + ".png")
  print("\n".join(lines))
  return out


def _fidelity_row(k: int, layers: list[int], fid: list[dict], teacher, hybrid, sample) -> dict:
  """The hybrid with `layers` softmax: its end-to-end fidelity to the teacher, and the lowest
  teacher-forced cosine left among its layers (a softmax layer's counts as 1)."""
  return {
      "k": k,
      "softmax_layers": layers,
      **{
          key: v
          for key, v in evaluate.end_to_end_fidelity(*teacher, *hybrid, sample).items()
          if isinstance(v, float)
      },
      "min_layer_cosine": float(
          min(1.0 if l in layers else fid[l]["cosine"] for l in range(len(fid)))
      ),
  }


def _measure_speed(
    row: dict, rows: list[dict], res: int, patch: int, teacher, hybrid, sample, repeats: int
) -> None:
  """Adds teacher and student images/s and XLA peak memory at `res` px (batch 1) to `row`; the
  teacher is the same in every row, so it is measured in the first row only."""
  grid = (res // patch, res // patch)
  images = np.asarray(jax.image.resize(sample[:1], (1, res, res, 3), "bilinear"))
  for name, (m, p) in (("teacher", teacher), ("student", hybrid)):
    p = evaluate.resample_for_resolution(p, grid)
    if name == "teacher" and rows:
      row[f"{name}_{res}_images_per_s"] = rows[0][f"{name}_{res}_images_per_s"]
      row[f"{name}_{res}_peak_mb"] = rows[0][f"{name}_{res}_peak_mb"]
      continue
    row[f"{name}_{res}_images_per_s"] = evaluate.images_per_second(m, p, images, repeats=repeats)
    row[f"{name}_{res}_peak_mb"] = evaluate.forward_peak_bytes(m, p, images) / 2**20


def _table(out: dict, resolutions: list[int], num_views: int) -> list[str]:
  """OUT.md's lines: one row per k, fidelity and student/teacher speed per resolution."""
  lines = [
      f"Student after `{out['stage']}` (step {out['step']}) of `{out['workdir']}`, no further "
      f"training; fidelity on {num_views} held-out views at {out['image_size']} px; speed: "
      "forward, batch 1.",
      "",
      "| k | softmax layers | cls cos | patch cos | min layer cos | "
      + " | ".join(f"{r} px student/teacher speed" for r in resolutions)
      + " |",
      "|---|---|---|---|---|" + "---|" * len(resolutions),
  ]
  for r in out["rows"]:
    speeds = " | ".join(
        f"{r[f'student_{x}_images_per_s'] / r[f'teacher_{x}_images_per_s']:.2f}×"
        for x in resolutions
    )
    lines.append(
        f"| {r['k']} | {r['softmax_layers']} | {r.get('cls_cosine', float('nan')):.4f} "
        f"| {r['patch_cosine']:.4f} | {r['min_layer_cosine']:.3f} | {speeds} |"
    )
  return lines


def _plot(rows: list[dict], resolutions: list[int], path: str) -> None:
  """OUT.png: fidelity vs k, and student/teacher images/s vs k per resolution."""
  fig = plots.new_figure(figsize=(9, 3.5))
  ax1, ax2 = fig.subplots(1, 2)
  ks = [r["k"] for r in rows]
  ax1.plot(ks, [r.get("cls_cosine", np.nan) for r in rows], "o-", label="cls cosine")
  ax1.plot(ks, [r["patch_cosine"] for r in rows], "s-", label="patch cosine")
  ax1.set_xlabel("softmax layers k")
  ax1.set_title("end-to-end fidelity (held-out)")
  ax1.legend(fontsize=8)
  for x in resolutions:
    ax2.plot(
        ks,
        [r[f"student_{x}_images_per_s"] / r[f"teacher_{x}_images_per_s"] for r in rows],
        "o-",
        label=f"{x} px",
    )
  ax2.axhline(1.0, color="k", lw=0.8, ls="--")
  ax2.set_xlabel("softmax layers k")
  ax2.set_title("student / teacher images/s")
  ax2.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=110)


if __name__ == "__main__":
  main()
