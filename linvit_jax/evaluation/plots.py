"""Every plot of the project: a run's fidelity bars, attention maps and fidelity curves (the
driver's write_plots), the ablation's and the token study's curves, the compounding and
window-share studies' per-layer plots, and the benchmarks' line grids. Pure drawing: each takes plain values or a results record and writes one PNG.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from linvit_jax.evaluation import results as results_lib
from linvit_jax.runtime import gfile


def new_figure(**kw):
  """A figure outside pyplot: no global backend switch, so notebooks keep inline plotting."""
  from matplotlib.figure import Figure

  return Figure(**kw)


def plot_fidelity(rows_by_name: Mapping[str, list[dict[str, float]]], path: str) -> None:
  """Bar chart of per-layer cosine and normalised MSE for one or more students."""
  fig = new_figure(figsize=(10, 3.5))
  axes = fig.subplots(1, 2)
  names = list(rows_by_name)
  width = 0.8 / max(1, len(names))
  for j, name in enumerate(names):
    rows = rows_by_name[name]
    x = np.arange(len(rows)) + j * width
    axes[0].bar(x, [r["cosine"] for r in rows], width, label=name)
    axes[1].bar(x, [r["nmse"] for r in rows], width, label=name)
  for ax, title in zip(axes, ("cosine (↑)", "normalised MSE (↓)")):
    ax.set_xlabel("layer")
    ax.set_title(f"attention-output fidelity: {title}")
    ax.set_xticks(np.arange(len(next(iter(rows_by_name.values())))) + 0.4 - width / 2)
    ax.set_xticklabels(range(len(next(iter(rows_by_name.values())))))
  axes[0].set_ylim(0, 1.02)
  axes[0].legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=110)


def plot_attention_maps(
    images: np.ndarray,
    teacher_maps: np.ndarray,
    student_maps: np.ndarray,
    path: str,
    layer: int = -1,
) -> None:
  """Grid: one row per image; the image, then the teacher's and the student's cls maps per head."""
  n_img, heads = teacher_maps.shape[1], teacher_maps.shape[2]
  cols = 1 + 2 * heads
  fig = new_figure(figsize=(1.4 * cols, 1.5 * n_img))
  axes = fig.subplots(n_img, cols, squeeze=False)
  for i in range(n_img):
    img = images[i]
    img = (img - img.min()) / (img.max() - img.min() + 1e-9)
    axes[i, 0].imshow(img.squeeze(), cmap="gray" if img.shape[-1] == 1 else None)
    for h in range(heads):
      axes[i, 1 + h].imshow(teacher_maps[layer, i, h], cmap="viridis")
      axes[i, 1 + heads + h].imshow(student_maps[layer, i, h], cmap="viridis")
      if i == 0:
        axes[i, 1 + h].set_title(f"teacher h{h}", fontsize=7)
        axes[i, 1 + heads + h].set_title(f"student h{h}", fontsize=7)
  for ax in axes.flat:
    ax.set_xticks([])
    ax.set_yticks([])
  fig.suptitle(f"cls-token attention, layer {layer % teacher_maps.shape[0]}", fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=110)


def plot_fidelity_curves(
    histories: Mapping[str, list[dict[str, Any]]],
    path: str,
    keys: tuple[str, ...] = ("cls_cosine", "patch_cosine", "block_cosine_min"),
) -> bool:
  """End-to-end fidelity on held-out images vs images seen, across the run's stages (the
  `eval/...` rows of each stage's metrics); returns False when no stage logged any."""
  fig = new_figure(figsize=(7, 3.8))
  ax = fig.subplots()
  drawn = False
  for key in keys:
    xs, ys = [], []
    for rows in histories.values():
      for r in rows:
        if f"eval/{key}" in r:
          xs.append(r.get("images_seen", r.get("step", 0)))
          ys.append(float(r[f"eval/{key}"]))
    if xs:
      ax.plot(xs, ys, marker="o", ms=3, label=key.replace("_", " "))
      drawn = True
  if not drawn:
    return False
  edges = 0
  for name, rows in histories.items():  # stage boundaries
    if rows:
      edges = max(r.get("images_seen", 0) for r in rows)
      ax.axvline(edges, color="0.8", lw=0.8)
      ax.text(
          edges,
          ax.get_ylim()[0],
          f" {name}",
          fontsize=7,
          rotation=90,
          va="bottom",
          ha="right",
          color="0.4",
      )
  ax.set_xlabel("images seen")
  ax.set_ylabel("cosine to the teacher (held-out)")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  return True


def plot_ablation_curves(
    results: Mapping[str, Sequence[results_lib.Results | Mapping[str, Any]]],
    path: str,
    teacher_top1: float | None,
) -> None:
  """Test top-1 during fine-tuning, mean ± std over seeds, one line per ablation arm."""
  fig = new_figure(figsize=(7, 4.2))
  ax = fig.subplots()
  for arm, runs in results.items():
    curves = []
    for r in map(results_lib.as_record, runs):
      rows = [h for h in (r.histories or {}).get("finetune", []) if "eval/top1" in h]
      curves.append([(h["step"], h["eval/top1"]) for h in rows])
    if not curves or not curves[0]:
      continue
    steps = [s for s, _ in curves[0]]
    acc = np.array([[a for _, a in c][: len(steps)] for c in curves if len(c) >= len(steps)])
    mean, std = 100 * acc.mean(0), 100 * acc.std(0)
    ax.plot(steps, mean, marker="o", ms=3, label=arm)
    ax.fill_between(steps, mean - std, mean + std, alpha=0.15)
  if teacher_top1 is not None:
    ax.axhline(100 * teacher_top1, color="k", ls="--", lw=1, label="teacher (before)")
  ax.set_xlabel("fine-tune step")
  ax.set_ylabel("test top-1 (%)")
  ax.set_title("Same fine-tune budget, different starting points")
  ax.legend(fontsize=7, loc="lower right")
  ax.grid(alpha=0.3)
  fig.tight_layout()
  with gfile.open(path, "wb") as f:  # matplotlib writes file objects: gs:// paths work too
    fig.savefig(f, format="png", dpi=120)


def plot_lines(
    panels: list[dict[str, Any]], path: str, *, ncols: int = 2, title: str = "", size=(11, 4.2)
) -> None:
  """A grid of line plots, one panel per dict: `series` {label: [(x, y), ...]}, `title`,
  `xlabel`, `ylabel`, optional `dashed` (labels drawn dashed), `log` (both axes log; default
  True). The benchmarks' speed and memory curves are drawn with it."""
  nrows = -(-len(panels) // ncols)
  fig = new_figure(figsize=size)
  axes = np.asarray(fig.subplots(nrows, ncols, squeeze=False)).ravel()
  for ax, panel in zip(axes, panels):
    for label, pts in panel["series"].items():
      if pts:
        ls = "--" if label in panel.get("dashed", ()) else "-"
        ax.plot(*zip(*pts), marker="o", label=label, ls=ls)
    if panel.get("log", True):
      ax.set_xscale("log")
      ax.set_yscale("log")
    ax.set_title(panel.get("title", ""))
    ax.set_xlabel(panel.get("xlabel", ""))
    ax.set_ylabel(panel.get("ylabel", ""))
    ax.grid(True, which="both", alpha=0.3)
  axes[0].legend(fontsize=8)
  if title:
    fig.suptitle(title, fontsize=10)
  fig.tight_layout()
  with gfile.open(path, "wb") as f:
    fig.savefig(f, format="png", dpi=110)


def plot_token_study(
    points: Mapping[str, Sequence[tuple[int, float, float, float]]],
    tokens: Sequence[int],
    path: str,
) -> None:
  """Δ top-1 to the teacher vs tokens per image: per arm, (tokens, mean, spread, teacher) points."""
  fig = new_figure(figsize=(6.5, 4))
  ax = fig.subplots()
  for arm, pts in points.items():
    if not pts:
      continue
    t, m, sd, teach = map(np.asarray, zip(*pts))
    ax.errorbar(t, m - teach, yerr=np.nan_to_num(sd), marker="o", capsize=3, label=arm)
  ax.axhline(0, color="k", ls="--", lw=1, label="teacher")
  ax.set_xscale("log")
  ax.set_xticks(list(tokens), [str(t) for t in tokens])
  ax.set_xticks([], minor=True)  # no "2×10¹"-style minor labels between the token counts
  ax.set_xlabel("tokens per image (patches + cls)")
  ax.set_ylabel("Δ top-1 to the teacher (points)")
  ax.set_title("Same fine-tune budget: what copying buys at each token count")
  ax.legend(fontsize=7)
  ax.grid(alpha=0.3)
  fig.tight_layout()
  with gfile.open(path, "wb") as f:
    fig.savefig(f, format="png", dpi=120)


def plot_compounding(results: Mapping[str, Any], path: str) -> None:
  """The compounding study's per-layer bars (studies/compounding.py's results), one panel per
  measure (cls, patch): the share of the student's gap that fixing the layer recovers, beside the
  gap the layer's student attention makes alone in the teacher, on the same scale."""
  measures = list(results["baseline"])
  layers = results["layers"]
  fig = new_figure(figsize=(5 + 0.35 * len(layers) * len(measures), 3.8))
  axes = np.asarray(fig.subplots(1, len(measures), squeeze=False)).ravel()
  x = np.arange(len(layers))
  for ax, m in zip(axes, measures):
    for offset, key, label in (
        (-0.2, "recovered_share", "fix one: share of the gap recovered"),
        (0.2, "gap_alone_share", "break one: gap alone / student's gap"),
    ):
      values = [np.nan if r[key][m] is None else r[key][m] for r in layers]
      ax.bar(x + offset, values, 0.4, label=label)
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xticks(x, [str(r["layer"]) for r in layers])
    ax.set_xlabel("layer")
    ax.set_title(f"{m} cosine: student {results['baseline'][m]:.4f}", fontsize=9)
    ax.grid(axis="y", alpha=0.3)
  axes[0].set_ylabel("share of the student's gap (1 − cosine)")
  fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=2, fontsize=8)
  fig.suptitle(f"error that compounds, {results['n_photos']} photo(s)", fontsize=10)
  fig.tight_layout(rect=(0, 0.07, 1, 1))
  with gfile.open(path, "wb") as f:
    fig.savefig(f, format="png", dpi=110)


def plot_window_share(results: Mapping[str, Any], path: str) -> None:
  """The window-share study's per-layer lines (studies/window_share.py's results), one colour
  per resolution: left, the teacher's softmax mass on the exact set (solid) and the student's
  share of it (dashed); right, the teacher's mass on the window's patches (solid) and on the
  prefix tokens (dotted)."""
  fig = new_figure(figsize=(11, 3.8))
  axes = fig.subplots(1, 2)
  for j, block in enumerate(results["resolutions"]):
    color, rows = f"C{j}", block["layers"]
    x = [r["layer"] for r in rows]
    label = f"{block['res']} px"
    axes[0].plot(x, [r["teacher_exact_mass"] for r in rows], "-o", color=color, label=label)
    share = [np.nan if r["student_share"] is None else r["student_share"] for r in rows]
    if not np.all(np.isnan(share)):
      axes[0].plot(x, share, "--s", color=color, label=f"{label}: student's share")
    axes[1].plot(x, [r["teacher_window_mass"] for r in rows], "-o", color=color, label=label)
    axes[1].plot(x, [r["teacher_prefix_mass"] for r in rows], ":^", color=color)
  axes[0].set_title("exact set: teacher's mass (solid), student's share (dashed)", fontsize=9)
  axes[1].set_title("teacher's mass: window patches (solid), prefix tokens (dotted)", fontsize=9)
  for ax in axes:
    ax.set_xticks([r["layer"] for r in results["resolutions"][0]["layers"]])
    ax.set_xlabel("layer")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
  axes[0].set_ylabel("attention mass (mean over patch queries)")
  fig.suptitle(
      f"window {results['window']}, sinks {results['sinks']}, {results['n_photos']} photo(s)",
      fontsize=10,
  )
  fig.tight_layout()
  with gfile.open(path, "wb") as f:
    fig.savefig(f, format="png", dpi=110)
