"""summary.format_summary's time table: where a run's time went (minutes, share of the total) and
each training stage's step cost beside the teacher's forward, from results dicts old and new."""

import json
import os
import re

import numpy as np
import pytest

from linvit_jax import report
from linvit_jax.evaluation import results as results_lib
from linvit_jax.evaluation import summary

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _history(rates):
  return [{"step": 1 + 10 * i, "steps_per_sec": r} for i, r in enumerate(rates)]


def _results(**extra):
  results = {
      "config": {
          "stages": ["distill", "align"],
          "distill": {"steps": 100, "batch_size": 4},
          "align": {"steps": 50, "batch_size": 8},
          "eval": {"throughput_batch": 8},
      },
      "timing_s": {
          "convert_and_evaluate": 60.0,
          "distill": 600.0,
          "align": 1200.0,
          "speed_resolution_plots": 120.0,
          "total": 2400.0,
      },
      "histories": {
          # the first row holds the compilation: left out of the median
          "distill": _history([0.01, 1.0, 2.0, 1.0]),
          "align": _history([0.01, 0.25, 0.25]),
      },
      "teacher_images_per_s": 10.0,
      "student_images_per_s": 12.0,
  }
  results.update(extra)
  return results


def _row(lines, label):
  """The numbers of the table row that starts with `label`."""
  (line,) = [line for line in lines if line.strip().startswith(label)]
  return [float(x) for x in re.findall(r"-?\d+\.\d+", line[len(label) + 2 :])]


def test_where_the_time_went():
  lines = summary.format_summary(_results()).splitlines()
  assert _row(lines, "surgery and first scoring") == [1.0, 2.5]
  assert _row(lines, "stage distill") == [10.0, 25.0]
  assert _row(lines, "stage align") == [20.0, 50.0]
  assert _row(lines, "speed, resolutions and plots") == [2.0, 5.0]
  # 2400 - 60 - 600 - 1200 - 120: loading, scoring after the stages (and k-NN when measured)
  assert _row(lines, "the rest: loading, scoring after each stage") == [7.0, 17.5]
  assert _row(lines, "total") == [40.0, 100.0]
  assert "(2400 s)" in next(line for line in lines if line.strip().startswith("total"))


def test_step_cost_beside_the_teachers_forward():
  lines = summary.format_summary(_results()).splitlines()
  assert "training step cost beside the teacher's forward (10.00 images/s at batch 8)" in lines
  # distill: 600 s / 100 steps; median logged rate 1 step/s × batch 4 = 4 images/s: 2.5 teacher
  # forwards per training image. align: 24 s/step, 0.25 × 8 = 2 images/s: 5 forwards.
  distill = next(line for line in lines if line.startswith("  distill "))
  assert distill.split() == ["distill", "100", "4", "6.00", "4.00", "2.5×"]
  align = next(line for line in lines if line.startswith("  align "))
  assert align.split() == ["align", "50", "8", "24.00", "2.00", "5.0×"]


def test_step_cost_as_a_share_of_the_matmul_rate():
  results = _results(matmul_gflops=100.0)
  for name, gflops in (("distill", [1.0, 40.0, 50.0, 60.0]), ("align", [1.0, 25.0, 25.0])):
    for row, g in zip(results["histories"][name], gflops):
      row["gflops_per_sec"] = g
  lines = summary.format_summary(results).splitlines()
  # The first row (the compile) left out: medians 50 and 25 GFLOP/s of a 100 GFLOP/s matmul.
  distill = next(line for line in lines if line.startswith("  distill "))
  assert distill.split() == ["distill", "100", "4", "6.00", "4.00", "2.5×", "50.0", "50", "%"]
  align = next(line for line in lines if line.startswith("  align "))
  assert align.split()[-3:] == ["25.0", "25", "%"]
  assert "  machine's float32 matmul rate (100 GFLOP/s, timed after training)" in lines
  # Without the machine's rate the GFLOP/s stay, the share is a dash.
  del results["matmul_gflops"]
  lines = summary.format_summary(results).splitlines()
  assert next(line for line in lines if line.startswith("  align ")).split()[-2:] == ["25.0", "-"]


def test_the_matmul_rate_is_timed_only_after_training():
  trained = results_lib.Results(histories={"align": [{"step": 1}]})
  assert report._matmul_rate(None, None, None, trained) > 0
  assert report._matmul_rate(None, None, None, results_lib.Results()) is None


def test_missing_keys_leave_rows_out():
  """An older results.json, a run without teacher, histories or stages: no error."""
  no_hist = _results()
  del no_hist["histories"], no_hist["teacher_images_per_s"]
  lines = summary.format_summary(no_hist).splitlines()
  distill = next(line for line in lines if line.startswith("  distill "))
  assert distill.split() == ["distill", "100", "4", "6.00", "0.67", "-"]  # the wall rate
  assert "training step cost" in lines  # no teacher: no "beside" part
  minimal = {"config": {"student": {}}, "timing_s": {"total": 90.0}}
  text = summary.format_summary(minimal)
  assert "training step cost" not in text and "(90 s)" in text
  assert "the rest: loading" in text
  assert "not recorded" in summary.format_summary({"config": {"student": {}}})
  assert "not recorded" in summary.format_summary({"timing_s": {}})
  no_total = _results()
  del no_total["timing_s"]["total"]
  assert "(1980 s)" in summary.format_summary(no_total)  # the sum of the parts


def test_an_unknown_timing_key_is_its_own_row():
  """A part a newer run.py times (e.g. the test photos) is shown by name and leaves the rest."""
  results = _results()
  results["timing_s"]["test_photos"] = 180.0
  lines = summary.format_summary(results).splitlines()
  assert _row(lines, "test_photos") == [3.0, 7.5]
  assert _row(lines, "the rest: loading, scoring after each stage") == [4.0, 10.0]
  results["timing_s"]["knn"] = 60.0  # timed on its own: no longer part of the rest
  lines = summary.format_summary(results | {"knn": {"k": 1, "dataset": "d", "train_examples": 2,
      "eval_examples": 1, "teacher_top1": 1.0, "student_top1": 1.0, "retention": 1.0}}).splitlines()  # fmt: skip
  assert _row(lines, "k-NN check") == [1.0, 2.5]
  assert _row(lines, "the rest: loading, scoring after each stage") == [3.0, 7.5]
  assert not any(line.strip().startswith("the rest") and "k-NN" in line for line in lines)


def test_knn_line_says_when_the_teachers_features_were_cached():
  knn = {"k": 5, "dataset": "d", "train_examples": 10, "eval_examples": 4, "teacher_top1": 1.0,
         "student_top1": 0.5, "retention": 0.5, "teacher_features_cached": True,
         "teacher_features_saved_seconds": 241.0}  # fmt: skip
  text = summary.format_summary(_results(knn=knn))
  assert "came from the feature cache (computing them took 241 s)" in text
  assert "k-NN" in text.split("the rest: ")[1].splitlines()[0]
  knn["teacher_features_cached"] = False
  assert "feature cache" not in summary.format_summary(_results(knn=knn))
  why = "no labelled reference set"
  assert f"k-NN: not measured — {why}" in summary.format_summary(_results(knn_skipped=why))


def test_the_committed_default_run_formats():
  """docs/vits14_lora8_w0_results.json (written before this table existed): the printed total is
  its timing total, and the parts add up to it."""
  with open(os.path.join(ROOT, "docs", "vits14_lora8_w0_results.json")) as f:
    results = json.load(f)
  lines = summary.format_summary(results).splitlines()
  total = results["timing_s"]["total"]
  total_line = next(line for line in lines if line.strip().startswith("total"))
  assert f"({total:.0f} s)" in total_line
  assert _row(lines, "total")[0] == pytest.approx(total / 60, abs=0.05)
  start = lines.index(next(line for line in lines if line.startswith("where the time went")))
  parts = [_row(lines, line.strip().split("  ")[0])[0] for line in lines[start + 1 : start + 6]]
  assert sum(parts) == pytest.approx(total / 60, abs=0.3)  # rounding: 0.05 per row
  assert any(line.split()[:3] == ["align", "500", "8"] for line in lines)


def test_resolution_rows_reuse_the_runs_throughput_at_factor_one(monkeypatch):
  """The factor-1 row is the run's own images/s (same batch, same resolution): not timed twice."""
  from linvit_jax.configuration import config_lib

  config = config_lib.base_config()
  config.data.image_size, config.model.patch_size = 8, (4, 4)
  config.eval.resolution_factors, config.eval.throughput_batch = (1, 2), 2
  timed = []
  ev = report.evaluate
  monkeypatch.setattr(ev, "resample_for_resolution", lambda p, grid: p)
  monkeypatch.setattr(ev, "images_per_second", lambda m, p, x: timed.append(m) or 1.0)
  monkeypatch.setattr(ev, "forward_peak_bytes", lambda m, p, x: 0.0)
  monkeypatch.setattr(ev, "end_to_end_fidelity", lambda *a: {"patch_cosine": 1.0})
  sample = np.zeros((2, 8, 8, 3), np.float32)
  known = {"teacher": 5.0, "student": 7.0}
  args = (config, None, "teacher", {}, "student", {}, False, sample)
  rows = report.resolution_scaling(*args, known=known)
  assert [r["teacher_images_per_s"] for r in rows] == [5.0, 1.0]
  assert [r["student_images_per_s"] for r in rows] == [7.0, 1.0]
  assert timed == ["teacher", "student"]  # the factor-2 row only
  timed.clear()
  assert len(report.resolution_scaling(*args)) == 2 and len(timed) == 4  # nothing known
