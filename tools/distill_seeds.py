"""Distillation stability across seeds (a study: whole conversions, so a tool, not a benchmark):
copy_same + N distillation steps, nothing else.

    python tools/distill_seeds.py --seeds 0,1,2,3,4 [--steps 100] [--set k=v ...] --out OUT

For each seed: the demo's conversion (shipped 50-token teacher, hedgehog, copy_same, calibrated)
followed by `steps` of distill_attention only; records top-1 before fine-tuning, the per-layer
teacher-forced fidelity, the end-to-end fidelity and the distillation loss curve. `--set` applies
config overrides (e.g. `distill_attention.optimizer.lr=1e-3`, `distill.w_routing=0`) to every seed,
so candidate fixes are compared on the same seeds. Writes OUT.json (and OUT.png: loss curves and
per-layer cosine of the best and worst seed side by side).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import tempfile
import time

from linvit_jax import run as run_lib
from linvit_jax.configuration import recipes


def _config(seed: int, steps: int, sets: list[str], patch: int):
  c = recipes.fmnist_conversion(
      feature_map="hedgehog", patch=patch, distill_steps=steps, finetune_steps=1
  )
  c.seed = seed
  c.surgery.policy = "copy_same"
  c.stages = ("distill_attention",)
  c.distill_attention.log_every = max(1, steps // 25)
  c.distill_attention.checkpoint_every = steps
  c.eval.plots = False
  c.eval.resolution_factors = ()
  c.eval.attention_map_images = 0
  c.eval.throughput_batch = 8
  for item in sets:
    key, value = item.split("=", 1)
    node = c
    *parents, leaf = key.split(".")
    for p in parents:
      node = node[p]
    try:
      node[leaf] = ast.literal_eval(value)
    except (ValueError, SyntaxError):
      node[leaf] = value
  return c


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--seeds", default="0,1,2,3,4")
  p.add_argument("--steps", type=int, default=100)
  p.add_argument("--patch", type=int, default=4)
  p.add_argument("--set", action="append", default=[], dest="sets")
  p.add_argument("--out", required=True)
  args = p.parse_args()
  rows = []
  for seed in [int(s) for s in args.seeds.split(",")]:
    config = _config(seed, args.steps, args.sets, args.patch)
    config.eval.teacher = not rows
    t0 = time.time()
    with tempfile.TemporaryDirectory() as workdir:
      r = run_lib.run(config, workdir)
    hist = r.histories["distill_attention"]
    rows.append(
        dict(
            seed=seed,
            top1_converted=r.converted.top1,
            top1_after_distill=r.top1_after("distill_attention"),
            teacher_top1=r.teacher_top1,
            layer_cosine=[row["cosine"] for row in r.fidelity("distill_attention").layers],
            cls_cosine=r.fidelity("distill_attention").end_to_end.get("cls_cosine"),
            loss=[(h["step"], h["loss"]) for h in hist if h.get("loss") is not None],
            terms={
                k: [h.get(k) for h in hist]
                for k in hist[-1]
                if k.startswith(("attn", "routing", "w_", "loss_"))
            },
            grad_norm=[h.get("grad_norm") for h in hist],
            seconds=time.time() - t0,
        )
    )
    print(
        f"seed {seed}: top-1 after distill {100 * rows[-1]['top1_after_distill']:.2f} %, "
        f"layer cos {[round(x, 3) for x in rows[-1]['layer_cosine']]}, "
        f"{rows[-1]['seconds']:.0f} s",
        flush=True,
    )
  top = [100 * r["top1_after_distill"] for r in rows]
  summary = dict(
      sets=args.sets,
      steps=args.steps,
      patch=args.patch,
      rows=rows,
      spread_points=max(top) - min(top),
      mean=sum(top) / len(top),
  )
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out + ".json", "w") as f:
    json.dump(summary, f, indent=1)
  print(f"spread {summary['spread_points']:.2f} points, mean {summary['mean']:.2f} %")


if __name__ == "__main__":
  main()


def plot(runs: dict[str, str], out_png: str) -> None:
  """Loss curves and per-layer cosine of every seed, one colour per setting (label → OUT.json)."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, (ax_loss, ax_layer) = plt.subplots(1, 2, figsize=(11, 4))
  for color, (label, path) in zip(("tab:red", "tab:blue", "tab:green", "tab:orange"), runs.items()):
    with open(path) as f:
      rows = json.load(f)["rows"]
    for i, r in enumerate(rows):
      steps, loss = zip(*r["loss"])
      style = "-" if r["seed"] != 0 else "--"
      kw = dict(color=color, ls=style, lw=1, label=label if i == 0 else None)
      ax_loss.plot(steps, loss, **kw)
      ax_layer.plot(range(len(r["layer_cosine"])), r["layer_cosine"], marker="o", **kw)
  ax_loss.set(
      xlabel="distillation step",
      ylabel="distillation loss",
      yscale="log",
      title="per seed (dashed: seed 0)",
  )
  ax_layer.set(
      xlabel="layer",
      ylabel="teacher-forced attention cosine after distillation",
      title="per-layer fidelity, per seed",
  )
  ax_loss.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(out_png, dpi=110)
