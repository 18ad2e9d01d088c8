r"""The token-count study: the ablation at several token counts, and the seed paper's claims.

  python -m linvit_jax.studies.token_study workdirs/ablation_p7 workdirs/ablation_p4 --out docs

Each argument is an ablation workdir (`python -m linvit_jax.studies.ablation ...`), one teacher and token
count each. Writes `ablation_tokens.png` (Δ to the teacher vs tokens, one line per arm, ± std over
seeds) and `ablation.md` (each workdir's table, the runs it is made of, and a verdict per claim and
token count) into --out. The same tables go into the README through
tools/update_token_study_readme.py (the package never edits the repository's docs).

The claims (copy_attention = attention copied too, copy_same = MLPs etc. copied, attention fresh):
  1. copy_attention ≤ random after the same fine-tune budget;
  2. random < copy_same, by at most ~3 points;
  3. copy_same + distillation ≥ the teacher.
A difference within 2σ of the seed noise (σ of the difference of the means) is "not resolved".
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from linvit_jax.evaluation import plots
from linvit_jax.runtime import gfile
from linvit_jax.studies import ablation

ARM_ORDER = tuple(ablation.ARMS)


def load(workdir: str) -> dict[str, Any]:
  """One ablation workdir: tokens, teacher top-1 and per-arm final top-1 over seeds."""
  runs = ablation.finished_runs(workdir)
  if not runs:
    raise ValueError(f"no finished ablation runs under {workdir!r}")
  any_run = next(iter(next(iter(runs.values())).values()))
  teacher = ablation.shared_teacher_top1(runs)
  if teacher is None:
    raise ValueError(f"{workdir!r}: no run evaluated the teacher (teacher_top1 missing)")
  arms = {}
  for arm, by_seed in runs.items():
    budgets = {repr(ablation.run_budget(r.config, arm)) for r in by_seed.values()}
    if len(budgets) > 1:
      raise ValueError(f"{workdir!r}: the {arm} runs differ in model or budget: {budgets}")
    arms[arm] = {
        "seeds": sorted(by_seed),
        "top1": [100 * r.student_top1 for r in by_seed.values()],
        "before": [100 * _or_nan(r.top1_before_finetune) for r in by_seed.values()],
    }
  return {
      "workdir": workdir,
      "tokens": ablation.tokens(any_run.config),
      "teacher": 100 * teacher,
      "arms": arms,
  }


def _or_nan(value: float | None) -> float:
  return float("nan") if value is None else value


def _mean_sem(values: Sequence[float]) -> tuple[float, float, float]:
  a = np.asarray(values, np.float64)
  std = float(a.std(ddof=1)) if len(a) > 1 else float("nan")
  return float(a.mean()), std, std / math.sqrt(len(a)) if len(a) > 1 else float("nan")


def _compare(diff: float, sigma: float, holds: bool) -> str:
  if math.isnan(sigma):  # one seed: no noise estimate, the sign alone
    return ("holds" if holds else "does not hold") + " (1 seed)"
  if abs(diff) < 2 * sigma:
    return "not resolved"
  return "holds" if holds else "does not hold"


def _pm(sigma: float) -> str:
  return "" if math.isnan(sigma) else f" ± {sigma:.2f}"


def verdicts(study: Mapping[str, Any]) -> list[tuple[str, str, str]]:
  """[(claim, evidence, verdict)] for one token count; claims whose arms did not run are skipped."""
  arms, out = study["arms"], []

  def stats(arm):
    return _mean_sem(arms[arm]["top1"])

  if {"copy_attention", "random"} <= set(arms):
    (ca, _, sa), (ra, _, sr) = stats("copy_attention"), stats("random")
    d, s = ca - ra, math.hypot(sa, sr)
    out.append(
        (
            "1. copy_attention ≤ random",
            f"{ca:.2f} vs {ra:.2f} ({d:+.2f}{_pm(s)})",
            _compare(d, s, d <= 0),
        )
    )
  if {"copy_same", "random"} <= set(arms):
    (cs, _, ss), (ra, _, sr) = stats("copy_same"), stats("random")
    d, s = cs - ra, math.hypot(ss, sr)
    verdict = _compare(d, s, d > 0)
    if verdict.startswith("holds") and d > 3:
      verdict = "does not hold: copy_same wins by more than 3 points"
    out.append(
        (
            "2. random < copy_same, by ≤ ~3 points",
            f"{cs:.2f} vs {ra:.2f} ({d:+.2f}{_pm(s)})",
            verdict,
        )
    )
  if "copy_same_distill" in arms:
    m, _, sem = stats("copy_same_distill")
    d = m - study["teacher"]
    out.append(
        (
            "3. copy_same + distillation ≥ teacher",
            f"{m:.2f} vs {study['teacher']:.2f} ({d:+.2f}{_pm(sem)})",
            _compare(d, sem, d >= 0),
        )
    )
  return out


def tables(studies: Sequence[Mapping[str, Any]]) -> str:
  """The markdown: Δ to the teacher per arm and token count, then the verdicts."""
  studies = sorted(studies, key=lambda s: s["tokens"])
  arms = [a for a in ARM_ORDER if any(a in s["arms"] for s in studies)]
  head = "| arm | " + " | ".join(f"{s['tokens']} tokens" for s in studies) + " |"
  lines = [
      "Top-1 after fine-tuning (%, mean ± std over seeds; Δ to that token count's teacher):",
      "",
      head,
      "|---|" + "---|" * len(studies),
      "| teacher (softmax, no fine-tune) | "
      + " | ".join(f"{s['teacher']:.2f}" for s in studies)
      + " |",
  ]
  for arm in arms:
    cells = []
    for s in studies:
      if arm not in s["arms"]:
        cells.append("—")
        continue
      m, std, _ = _mean_sem(s["arms"][arm]["top1"])
      n = len(s["arms"][arm]["top1"])
      spread = f" ± {std:.2f}" if n > 1 else ""
      cells.append(f"{m:.2f}{spread} ({m - s['teacher']:+.2f}, n={n})")
    lines.append(f"| {arm} | " + " | ".join(cells) + " |")
  lines += ["", "| tokens | claim | evidence (top-1 %, Δ ± σ) | verdict |", "|---|---|---|---|"]
  for s in studies:
    for claim, evidence, verdict in verdicts(s):
      lines.append(f"| {s['tokens']} | {claim} | {evidence} | {verdict} |")
  return "\n".join(lines)


def plot(studies: Sequence[Mapping[str, Any]], path: str) -> None:
  """ablation_tokens.png (plots.plot_token_study) from the studies' per-arm top-1s."""
  studies = sorted(studies, key=lambda s: s["tokens"])
  points = {
      arm: [
          (s["tokens"], *_mean_sem(s["arms"][arm]["top1"])[:2], s["teacher"])
          for s in studies
          if arm in s["arms"]
      ]
      for arm in ARM_ORDER
  }
  plots.plot_token_study(points, [s["tokens"] for s in studies], path)


def main(argv: Sequence[str] | None = None) -> str:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("workdirs", nargs="+", help="ablation workdirs, one per token count")
  p.add_argument("--out", required=True, help="folder for ablation.md and ablation_tokens.png")
  args = p.parse_args(argv)
  studies = [load(w) for w in args.workdirs]
  md = tables(studies)
  gfile.makedirs(args.out)
  sections = []
  for s in sorted(studies, key=lambda s: s["tokens"]):
    with gfile.open(os.path.join(s["workdir"], "ablation.md")) as f:
      body = f.read().split("\n", 1)[1].strip()  # drop its "# Ablation" title
    curves = f"ablation_{s['tokens']}tokens.png"
    if gfile.exists(os.path.join(s["workdir"], "ablation.png")):
      gfile.copy(os.path.join(s["workdir"], "ablation.png"), os.path.join(args.out, curves))
      body += f"\n\n![fine-tune curves, {s['tokens']} tokens]({curves})"
    sections.append(f"## {s['tokens']} tokens (`{s['workdir']}`)\n\n{body}\n")
  plot(studies, os.path.join(args.out, "ablation_tokens.png"))
  with gfile.open(os.path.join(args.out, "ablation.md"), "w") as f:
    f.write(
        "# Ablation and token-count study\n\nGenerated by `python -m linvit_jax.studies.token_study "
        + " ".join(args.workdirs)
        + f" --out {args.out}` from the runs listed below; not edited by hand.\n\n"
        + md
        + "\n\n![Δ to teacher vs tokens](ablation_tokens.png)\n\n"
        + "\n".join(sections)
    )
  print(md)
  return md


if __name__ == "__main__":
  main()
