"""The ablation: which parts of a softmax teacher are worth copying into a linear student?

  python -m linvit_jax.studies.ablation --config configs/ablation.py --workdir DIR   (local or gs://)

Every arm gets the same fine-tune budget (steps × batch) on the same data and seed; arms differ
only in how the student starts:

  teacher_ft         the softmax teacher itself, fine-tuned for the budget (a control)
  random             linear, every weight at random init (copy_none)
  copy_attention     linear, every weight copied, attention q/k/v/out included (copy_all)
  copy_same          linear, everything but attention copied (copy_same), no distillation
  copy_same_distill  copy_same + teacher-forced attention distillation before fine-tuning
  copy_all_distill   copy_all + distillation
  copy_same_distill_in_budget  copy_same + distillation, whose steps count into the budget

Results: `ablation.md` (top-1 before and after fine-tuning, mean ± std over seeds, per-layer
fidelity) and `ablation.png` (test accuracy during fine-tuning), plus each run's own workdir.
The command line is main.py's (same flags, errors and exit codes) around `run_ablation`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import ml_collections as mlc
import numpy as np

from linvit_jax.evaluation import plots
from linvit_jax.evaluation import results as results_lib
from linvit_jax.runtime import gfile
from linvit_jax.runtime.errors import UserError

ARMS: dict[str, dict[str, Any]] = {
    "teacher_ft": dict(attention="softmax", policy="copy_all", distill=False),
    "random": dict(policy="copy_none", distill=False),
    "copy_attention": dict(policy="copy_all", distill=False),
    "copy_same": dict(policy="copy_same", distill=False),
    "copy_same_distill": dict(policy="copy_same", distill=True),
    "copy_all_distill": dict(policy="copy_all", distill=True),
    "copy_same_distill_in_budget": dict(policy="copy_same", distill=True, in_budget=True),
}


def arm_config(
    base: mlc.ConfigDict,
    arm: str,
    seed: int,
    finetune_steps: int,
    distill_steps: int,
    eval_every: int,
) -> mlc.ConfigDict:
  """The run config of one (arm, seed): the base conversion config with the arm's choices."""
  if arm not in ARMS:
    raise ValueError(f"unknown ablation arm {arm!r}; known: {sorted(ARMS)}")
  spec = ARMS[arm]
  c = mlc.ConfigDict(base.to_dict())
  c.seed = seed
  if "attention" in spec:
    c.student.attention = spec["attention"]
  c.surgery.policy = spec["policy"]
  # Calibration rescales freshly initialised attention against the teacher; fully random
  # students have no teacher stream to calibrate against.
  c.surgery.calibrate = spec["policy"] == "copy_same"
  ft = finetune_steps
  if spec["distill"]:
    c.stages = ("distill_attention", "finetune")
    c.distill_attention.steps = distill_steps
    if spec.get("in_budget"):
      ft = finetune_steps - distill_steps
      if ft <= 0:
        raise ValueError(f"in-budget arm: distill_steps {distill_steps} ≥ budget {finetune_steps}")
  else:
    c.stages = ("finetune",)
  c.finetune.steps = ft
  c.finetune.eval_every = eval_every
  c.finetune.checkpoint_every = max(1, ft // 2)
  c.finetune.log_every = max(1, ft // 10)
  c.eval.plots = False
  c.eval.resolution_factors = ()
  c.eval.attention_map_images = 0
  return c


def _mean_std(values: list[float]) -> str:
  a = 100 * np.asarray(values, np.float64)
  if len(a) == 0:
    return "n/a"
  return f"{a.mean():.2f} ± {a.std(ddof=1) if len(a) > 1 else 0.0:.2f}"


def summarize(
    results: Mapping[str, Sequence[results_lib.Results | Mapping[str, Any]]],
    teacher_top1: float | None,
) -> str:
  """The markdown table of ablation.md."""
  lines = [
      "| arm | top-1 before fine-tune (%) | top-1 after fine-tune (%) | Δ vs teacher "
      "(points) | last-layer cosine after | seeds |",
      "|---|---|---|---|---|---|",
  ]
  for arm, runs in results.items():
    runs = [results_lib.as_record(r) for r in runs]
    nan = float("nan")
    before = [nan if r.top1_before_finetune is None else r.top1_before_finetune for r in runs]
    after = [r.student_top1 for r in runs]
    delta = f"{100 * (np.mean(after) - teacher_top1):+.2f}" if teacher_top1 is not None else "n/a"
    # The last layer's cosine after fine-tuning (after surgery for an arm without a teacher run).
    stage = next(
        (s for s in ("finetune", results_lib.CONVERTED) if runs[0].fidelity(s) is not None), None
    )
    cos = (
        f"{np.mean([r.fidelity(stage).layers[-1]['cosine'] for r in runs]):.3f}" if stage else "n/a"
    )
    lines.append(
        f"| {arm} | {_mean_std(before)} | {_mean_std(after)} | {delta} | {cos} | " f"{len(runs)} |"
    )
  return "\n".join(lines)


def run_budget(config: Mapping[str, Any], arm: str) -> dict[str, Any]:
  """What must agree for two runs to sit in one table: model, operator, teacher, budget."""
  c, spec = config, ARMS[arm]
  distill = "distill_attention" in tuple(c["stages"])
  return {
      "attention": c["student"]["attention"],
      "patch_size": list(c["model"]["patch_size"]),
      "teacher": os.path.basename(c["teacher"]["init"]),
      "finetune": (c["finetune"]["steps"], c["finetune"]["batch_size"]),
      "distill_steps": c["distill_attention"]["steps"] if distill else None,
      "arm_distills": bool(spec["distill"]),
  }


def finished_runs(
    workdir: str, arms: Sequence[str] = tuple(ARMS)
) -> dict[str, dict[int, results_lib.Results]]:
  """Every finished run under `workdir` ({arm: {seed: results}}), whichever invocation made it."""
  runs: dict[str, dict[int, results_lib.Results]] = {}
  for arm in arms:
    arm_dir = os.path.join(workdir, arm)
    if not gfile.exists(arm_dir):
      continue
    for name in gfile.listdir(arm_dir):
      name = name.rstrip("/")
      done = os.path.join(arm_dir, name, "results.json")
      if not (name.startswith("seed") and name[4:].isdigit() and gfile.exists(done)):
        continue
      runs.setdefault(arm, {})[int(name[4:])] = results_lib.read(done)
  return {arm: dict(sorted(by_seed.items())) for arm, by_seed in runs.items()}


def write_report(config: mlc.ConfigDict, workdir: str) -> dict[str, Any]:
  """ablation.md + ablation.png from every finished run in `workdir` that matches this config's
  model and budget (runs made by earlier invocations included: the table can grow over days)."""
  a = config.ablation
  results: dict[str, list[results_lib.Results]] = {}
  made_of, ignored = [], []
  for arm, by_seed in finished_runs(workdir).items():
    expected = arm_config(config, arm, 0, a.finetune_steps, a.distill_steps, a.eval_every)
    want = run_budget(expected.to_dict(), arm)
    for seed, r in by_seed.items():
      if run_budget(r.config, arm) != want:
        ignored.append(f"{arm}/seed{seed}")
        continue
      results.setdefault(arm, []).append(r)
      made_of.append((arm, seed, r.timing_s.get("total", float("nan"))))
  if not results:
    raise ValueError(f"no finished ablation runs under {workdir!r} match this config")
  teacher_top1 = shared_teacher_top1(results)
  table = summarize(results, teacher_top1)
  runs_md = "\n".join(
      f"- `{arm}`: seeds {[s for a_, s, _ in made_of if a_ == arm]}, "
      f"{sum(t for a_, _, t in made_of if a_ == arm) / 60:.1f} min in all"
      for arm in results
  )
  if ignored:
    runs_md += f"\n- ignored (another model or budget): {', '.join(ignored)}"
  teacher = "n/a" if teacher_top1 is None else f"{100 * teacher_top1:.2f} %"
  with gfile.open(os.path.join(workdir, "ablation.md"), "w") as f:
    f.write(
        f"# Ablation\n\nteacher top-1 (softmax, before any fine-tuning): {teacher}\n\n"
        f"fine-tune budget: {a.finetune_steps} steps × batch {config.finetune.batch_size}; "
        f"distillation: {a.distill_steps} steps; tokens: {tokens(config)}\n\n{table}\n\n"
        f"Made of these runs (each `{workdir}/<arm>/seed<N>/results.json`):\n\n{runs_md}\n"
    )
  plots.plot_ablation_curves(results, os.path.join(workdir, "ablation.png"), teacher_top1)
  print(table)
  return {"table": table, "teacher_top1": teacher_top1, "results": results}


def tokens(config: Mapping[str, Any]) -> int:
  """Tokens per image (patches + cls) of a run config (ConfigDict or its results.json dict)."""
  size = config["data"]["image_size"]
  size = (size, size) if isinstance(size, int) else size
  grid = [s // p for s, p in zip(size, config["model"]["patch_size"])]
  model = config["model"]
  return grid[0] * grid[1] + (model["pool_type"] == "tok") + model.get("reg_tokens", 0)


def shared_teacher_top1(runs: Mapping[str, Any]) -> float | None:
  """The teacher's top-1 that one run of an ablation evaluated ({arm: [results] or {seed: results}})."""
  for by in runs.values():
    for r in map(results_lib.as_record, by.values() if isinstance(by, Mapping) else by):
      if r.teacher_scored:
        return r.teacher_top1
  return None


def run_ablation(config: mlc.ConfigDict, workdir: str) -> dict[str, Any]:
  """Runs the config's (arm, seed)s, each in its own resumable sub-workdir, skipping finished
  ones, then writes the report over every matching finished run in the workdir."""
  if "ablation" not in config:
    raise UserError(
        "the config has no `ablation` block (arms, seeds, finetune_steps, ...): "
        "see configs/ablation.py"
    )
  from linvit_jax import run as run_lib  # the single-run path, shared with main.py

  a = config.ablation
  unknown = sorted(set(a.arms) - set(ARMS))
  if unknown:
    raise UserError(f"unknown ablation arm(s) {unknown}; known: {list(ARMS)}")
  finished = finished_runs(workdir)
  teacher_top1 = shared_teacher_top1(finished)
  # Seed-major: an interrupted ablation has every arm at the first seeds, not some arms at all.
  for seed in a.seeds:
    for arm in a.arms:
      if a.report_only or seed in finished.get(arm, {}):
        continue  # finished earlier: a rerun only fills the gaps
      cfg = arm_config(config, arm, seed, a.finetune_steps, a.distill_steps, a.eval_every)
      cfg.eval.teacher = teacher_top1 is None  # one shared teacher: evaluate it once
      r = run_lib.run(cfg, os.path.join(workdir, arm, f"seed{seed}"))
      teacher_top1 = r.teacher_top1 if r.teacher_scored else teacher_top1
      print(f"[ablation] {arm} seed {seed}: top-1 {100 * r.student_top1:.2f} %", flush=True)
  return write_report(config, workdir)


if __name__ == "__main__":
  from linvit_jax import main as main_lib

  main_lib.cli(run_ablation)
