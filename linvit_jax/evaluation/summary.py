"""A run's summary as text: the table `python -m linvit_jax.main` prints at the end (accuracy,
fidelity to the teacher, k-NN, the test photos, speed, resolutions), where the run's time went,
and the lines that say where the student was exported. Pure formatting of a results record
(results.Results, or its results.json dict)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from linvit_jax.evaluation import photo_eval
from linvit_jax.evaluation import results as results_lib
from linvit_jax.runtime import gfile


def format_summary(results: results_lib.Results | Mapping[str, Any]) -> str:
  """The table main.py prints: accuracy (when labelled), fidelity to the teacher, speed; one
  section per part of the record, in this order."""
  r = results_lib.as_record(results)
  lines = ["", "== linvit_jax results " + "=" * 50]
  lines += _accuracy(r)
  lines += _end_to_end(r)
  lines += _knn(r)
  if r.exact_share:
    shares = ", ".join("-" if s is None else f"{s:.2f}" for s in r.exact_share)
    lines.append(
        f"exact-set hybrid (window, sinks): its share of attention mass per layer: {shares}"
    )
  lines += _per_layer(r)
  if r.test:  # the test photos: the figures nothing was chosen on
    lines += ["", photo_eval.format_table(r.test)]
  lines += _speed(r)
  # A measure without a section above (a new one): one generic line, from the record's fields.
  for field, value in r.measures():
    if field.name not in _SUMMARY_SECTIONS:
      lines.append(f"{field.metadata['label']}: {_brief(value)}")
  lines.extend(format_timing(r))
  return "\n".join(lines)


# The measures format_summary writes a section of its own for.
_SUMMARY_SECTIONS = frozenset(
    {"knn", "eval_view_fidelity", "test", "exact_share", "student_images_per_s"}
    | {"teacher_images_per_s", "resolution", "matmul_gflops"}
)


def _pct(x: Any) -> str:
  return f"{100 * x:6.2f} %" if isinstance(x, float) else "   n/a"


def _accuracy(r: results_lib.Results) -> list[str]:
  """Top-1 of the teacher, the student before the stages, after each stage and at the end."""
  lines = []
  if r.teacher_top1 is not None:
    lines.append(f"teacher (softmax) top-1          {_pct(r.teacher_top1)}")
    what = (
        "student as loaded top-1        "
        if (r.config.get("student") or {}).get("init")
        else "student after surgery top-1    "
    )
    lines.append(f"{what}  {_pct(r.converted.top1 if r.converted else None)}")
  for stage in r.stages:
    if stage.top1 is not None:
      lines.append(f"student after {stage.name:<19s}top-1 {_pct(stage.top1)}")
  if r.student_top1 is not None:
    lines.append(f"student final top-1              {_pct(r.student_top1)}")
  return lines


def _end_to_end(r: results_lib.Results) -> list[str]:
  """End-to-end fidelity per scoring, on the eval view, and the hybrid's softmax layers."""
  lines = []
  e2e = [(tag, f.end_to_end) for tag, f in r.scorings() if f.end_to_end is not None]
  if e2e:
    lines.append("")
    lines.append("end-to-end fidelity to the teacher (student's own forward, held-out images)")
    lines.append(f"{'':28s}{'cls cos':>9s}{'patch cos':>11s}{'min block':>11s}")
    for tag, v in e2e:
      cls = f"{v['cls_cosine']:9.4f}" if "cls_cosine" in v else f"{'-':>9s}"
      lines.append(f"{tag:<28s}{cls}{v['patch_cosine']:11.4f}{min(v['block_cosine']):11.4f}")
  view = r.eval_view_fidelity
  if view:
    cls = f"cls cos {view['cls_cosine']:.4f}, " if "cls_cosine" in view else ""
    lines.append(
        f"held-out images as encode() sees them (pp_eval, {view['images']} image(s)): {cls}"
        f"patch cos {view['patch_cosine']:.4f}"
    )
  if r.softmax_layers:
    lines.append(f"hybrid: layers {r.softmax_layers} keep softmax attention")
  return lines


def _knn(r: results_lib.Results) -> list[str]:
  """k-NN top-1 and retention, the feature cache's saving, the pooled-feature cosine; or why
  k-NN was not measured."""
  if not r.knn:
    if r.knn_skipped:  # a string: why k-NN was not measured, how to turn it on
      return [f"k-NN: not measured — {' '.join(str(r.knn_skipped).split())}"]
    return []
  k = r.knn
  lines = [
      f"k-NN top-1 (k={k['k']}, {k['dataset']}, {k['train_examples']} reference / "
      f"{k['eval_examples']} classified): teacher {_pct(k['teacher_top1'])}, student "
      f"{_pct(k['student_top1'])}, retention {100 * k['retention']:.1f} %"
  ]
  if k.get("teacher_features_cached"):  # feature_cache: an earlier run computed them
    lines.append(
        f"  the teacher's k-NN features came from the feature cache (computing them took "
        f"{k.get('teacher_features_saved_seconds', 0.0):.0f} s)"
    )
  if "cls_cosine" in k:
    lines.append(
        f"pooled-feature cosine to the teacher on those {k['train_examples'] + k['eval_examples']}"
        f" images: mean {k['cls_cosine']:.4f}, worst {k['cls_cosine_min']:.4f}"
    )
  return lines


def _per_layer(r: results_lib.Results) -> list[str]:
  """Per-layer attention fidelity (teacher-forced), one column per scoring."""
  fids = [(tag, f.layers) for tag, f in r.scorings() if f.layers is not None]
  if not fids:
    return []
  lines = ["", "per-layer attention fidelity (teacher-forced), cosine / normalised MSE"]
  width = max([22] + [len(name) for name, _ in fids])  # whole stage names, never cut
  header = "  " + " ".join(f"{name:>{width}s}" for name, _ in fids)
  lines.append("layer" + header[5:] if len(header) > 5 else header)
  for i in range(len(fids[0][1])):
    cells = " ".join(
        ("{:10.3f} / {:<9.3f}".format(v[i]["cosine"], v[i]["nmse"])).rjust(width) for _, v in fids
    )
    lines.append(f"{i:>5d}  {cells}".rstrip())
  return lines


def _speed(r: results_lib.Results) -> list[str]:
  """Images/s of both models, and the resolution rows (the held-out sample resized)."""
  lines = []
  if r.teacher_images_per_s is not None:
    lines.append("")
    lines.append(
        f"images/s (forward, batch {r.config['eval']['throughput_batch']}): "
        f"teacher {r.teacher_images_per_s:.1f}, "
        f"student {r.student_images_per_s:.1f}"
    )
  if r.resolution:
    lines.append(
        "the held-out sample resized to other sizes (not native views: see the test table)"
    )
  for row in r.resolution or []:
    acc = (
        f"top-1 teacher {_pct(row['teacher_top1'])}, student {_pct(row['student_top1'])}; "
        if "teacher_top1" in row
        else ""
    )
    cls = f"cls cos {row['cls_cosine']:.4f}, " if "cls_cosine" in row else ""
    lines.append(
        f"  {row['image_size']:>4d}px ({row['tokens']} tokens): {acc}{cls}patch cos "
        f"{row['patch_cosine']:.4f}; images/s teacher {row['teacher_images_per_s']:.1f}, "
        f"student {row['student_images_per_s']:.1f}; peak MB teacher "
        f"{row['teacher_peak_bytes'] / 2**20:.0f}, student "
        f"{row['student_peak_bytes'] / 2**20:.0f}"
    )
  return lines


def _brief(value: Any) -> str:
  """A measure's value on one line: numbers to 4 places, a dict's single numbers by name."""
  if isinstance(value, float):
    return f"{value:.4f}"
  if isinstance(value, Mapping):
    return ", ".join(f"{k} {_brief(v)}" for k, v in value.items() if isinstance(v, (int, float)))
  if isinstance(value, (list, tuple)) and all(isinstance(v, (int, float)) for v in value):
    return ", ".join(_brief(v) for v in value)
  return str(value)


# What run.py's timing_s keys measure, in words (a stage's key is its name).
_TIMING_LABELS = {
    "convert_and_evaluate": "surgery and first scoring",
    "speed_resolution_plots": "speed, resolutions and plots",
    "knn": "k-NN check",
}


def _logged_median(history: Sequence[Mapping[str, Any]], key: str) -> float | None:
  """The median of a stage's logged positive `key` values (a rate), the first row left out: it
  holds the compilation (and, after a resume, the restart), which the teacher's timed forward
  excludes."""
  values = [
      float(r[key]) for r in history[1:] if isinstance(r.get(key), (int, float)) and r[key] > 0
  ]
  return float(np.median(values)) if values else None


def format_timing(results: results_lib.Results | Mapping[str, Any]) -> list[str]:
  """Where a run's time went (its timing_s): minutes and share of the total per part, and each
  training stage's step cost beside the teacher's forward. What an older results.json or a run
  without teacher or histories lacks leaves its rows or columns out."""
  r = results_lib.as_record(results)
  timing = {k: v for k, v in (r.timing_s or {}).items() if isinstance(v, (int, float))}
  if not timing:
    return ["", "where the time went: not recorded"]
  config = r.config or {}
  stage_names = [n for n in config.get("stages") or () if n in timing]
  named = (
      [k for k in ("convert_and_evaluate",) if k in timing]
      + stage_names
      + [k for k in timing if k not in stage_names and k not in ("convert_and_evaluate", "total")]
  )
  total = float(timing.get("total", sum(timing[k] for k in named)))
  rest = total - sum(timing[k] for k in named)
  # run.py times these parts; the rest of the total is loading the teacher and the student,
  # scoring after each stage, k-NN and the held-out view (the export comes after the total).
  rest_what = ["loading", "scoring after each stage"]
  if r.knn and "knn" not in timing:
    rest_what.append("k-NN")
  rows = [
      (f"stage {k}" if k in stage_names else _TIMING_LABELS.get(k, k), timing[k]) for k in named
  ]
  rows.append((f"the rest: {', '.join(rest_what)}", rest))
  width = max(34, max(len(label) for label, _ in rows) + 2)
  share = lambda s: f"{100 * s / total:6.1f} %" if total > 0 else "     -"  # noqa: E731
  lines = ["", f"{'where the time went':<{width}s}{'minutes':>9s}{'share':>9s}"]
  lines += [f"  {label:<{width - 2}s}{s / 60:9.1f}{share(s):>9s}" for label, s in rows]
  lines.append(f"  {'total':<{width - 2}s}{total / 60:9.1f}{share(total):>9s}   ({total:.0f} s)")
  return lines + _step_cost(r, stage_names, timing)


def _step_cost(
    r: results_lib.Results, stage_names: Sequence[str], timing: Mapping[str, float]
) -> list[str]:
  """Each training stage's step cost beside the teacher's forward, per image: how many of the
  teacher's forward passes one image of training costs (the `align` step runs the teacher, the
  student and the student's backward); and, where the run counted its steps' FLOPs (XLA's cost
  analysis, in the logged rows) and timed the machine's matmul, the GFLOP/s a step achieves and
  its share of that rate."""
  config = r.config or {}
  histories = r.histories or {}
  teacher = r.teacher_images_per_s
  width = max([5] + [len(n) for n in stage_names]) + 4
  rows, any_flops = [], False
  for name in stage_names:
    stage = config.get(name) or {}
    steps, batch = stage.get("steps"), stage.get("batch_size")
    if not steps or not batch:
      continue
    logged = _logged_median(histories.get(name) or [], "steps_per_sec")
    images_per_s = batch * (logged or steps / max(timing[name], 1e-9))
    gflops = _logged_median(histories.get(name) or [], "gflops_per_sec")
    any_flops |= gflops is not None
    rows.append((name, steps, batch, timing[name] / steps, images_per_s, gflops))
  if not rows:
    return []
  matmul = r.matmul_gflops
  lines = []
  for name, steps, batch, s_step, images_per_s, gflops in rows:
    ratio = f"{teacher / images_per_s:.1f}×" if teacher else "-"
    line = f"  {name:<{width - 2}s}{steps:>7d}{batch:>7d}{s_step:>9.2f}{images_per_s:>10.2f}{ratio:>11s}"
    if any_flops:
      share = f"{100 * gflops / matmul:.0f} %" if gflops and matmul else "-"
      line += f"{gflops:>9.1f}" if gflops else f"{'-':>9s}"
      line += f"{share:>10s}"
    lines.append(line)
  title = "training step cost"
  if teacher:
    at = (config.get("eval") or {}).get("throughput_batch")
    title += (
        f" beside the teacher's forward ({teacher:.2f} images/s{f' at batch {at}' if at else ''})"
    )
  head = (
      f"{'stage':<{width}s}{'steps':>7s}{'batch':>7s}{'s/step':>9s}{'images/s':>10s}"
      f"{'÷ teacher':>11s}"
  )
  notes = [
      "  s/step: the stage's wall time / steps (compiling, curves and checkpoints included);",
      "  images/s: the median logged rate (compiling excluded); ÷ teacher: the teacher's forward",
      "  passes one training image costs",
  ]
  if any_flops:
    head += f"{'GFLOP/s':>9s}{'÷ matmul':>10s}"
    rate = f"{matmul:.0f} GFLOP/s" if matmul else "not timed"
    notes += [
        "  GFLOP/s: XLA's count of a step × the logged rate; ÷ matmul: its share of this",
        f"  machine's float32 matmul rate ({rate}, timed after training)",
    ]
  return ["", title, head, *lines, *notes]


def format_where_exported(workdir: str) -> str:
  """Where a run's student went and the two lines of Python that load it (the CLI's last lines).

  A local workdir is named by its absolute path, so that the lines work from any directory."""
  folder = workdir if gfile.is_remote(workdir) else os.path.abspath(workdir)
  return "\n".join(
      [
          f"student exported to {folder}; load it in Python with:",
          "  import linvit_jax",
          f"  student = linvit_jax.load_student({json.dumps(folder)})",  # a Python literal too
      ]
  )
