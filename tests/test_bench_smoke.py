"""The benchmark scripts at toy size, so they cannot rot: every code path on a depth-1, width-32
ViT ("mu/16"); no timing claims (bench/RESULTS.md holds the real numbers). Compiling is most of
its time (~1 min on 2 idle cores)."""

import json

import pytest

from bench import bench_speed
from bench import bench_steps
from bench import common
from bench import report
from linvit_jax.models import attention as attn_lib


def test_flop_counts_follow_the_shapes():
  soft, lin = attn_lib.AttentionSpec(), attn_lib.parse_spec("elu1")
  # ViT-S/16 at 224 px: 4.25 G multiply-adds per image with linear attention (4.6 with softmax).
  assert 8.0e9 < common.vit_flops(lin, 224) < 9.0e9
  # Softmax's extra work is quadratic in tokens, linear attention's is not.
  extra = lambda n: (
      common.attention_core_flops(soft, n, 6, 64)  # noqa: E731
      / common.attention_core_flops(lin, n, 6, 64)
  )
  assert extra(4 * 197) == pytest.approx(4 * extra(197), rel=1e-6)
  assert common.tokens_for(1792) == 12545


def test_speed_steps_and_report_at_toy_size(tmp_path):
  results = tmp_path / "results"
  speed = bench_speed.main(["--plan", "smoke", "--out", str(results / "cpu_speed.json")])
  rows = {(r["what"], r["size"], r["mode"], r["op"]): r for r in speed["rows"]}
  timed = [r for r in speed["rows"] if r["status"] == "ok"]
  assert len(timed) == 5 and all(
      len(r["times_s"]) == 2 and r["ms"] > 0 and r["pct_matmul"] > 0 for r in timed
  )
  assert rows[("layer", 64, "fwd", "favor")]["status"].startswith("memory only")
  # The chunked operator exists for memory: its backward must not keep the [N, N] scores.
  soft, chunked = (
      rows[("layer", 1024, "fwdbwd", op)]["memory"]["temp"] for op in ("softmax", "chunked_softmax")
  )
  assert chunked < 0.5 * soft
  assert [p for p in speed["probes"] if "error" in p] == [] and speed["probes"][-1]["peak_rss"] > 0

  steps = bench_steps.main(["--plan", "smoke", "--out", str(results / "cpu_steps.json")])
  assert steps["implementation"].startswith("project"), steps["implementation"]
  names = [r["name"] for r in steps["rows"]]
  assert names == ["student_fwdbwd", "teacher_fwd", "distill_step", "finetune_step"]

  path = report.write(str(results), str(tmp_path))
  text = open(path).read()
  assert "## Targets (CPU" in text and "distillation step" in text
  assert (tmp_path / "cpu_speed.png").exists() and (tmp_path / "cpu_memory.png").exists()
  json.loads((results / "cpu_speed.json").read_text())  # complete, valid JSON


def test_distill_real_bench_on_a_small_checkpoint(tmp_path):
  # The real-ViT step benchmark's code path on the 4-layer big_vision fixture (64 px, batch 2).
  from bench import bench_distill_real

  out = tmp_path / "distill_real.json"
  result = bench_distill_real.main(
      [
          "--init",
          "tests/data/vit_w192_d4_p16_i64_tok_learn.npz",
          "--batch",
          "2",
          "--res",
          "64",
          "--reps",
          "1",
          "--only",
          "teacher_fwd,distill_step,no_routing",
          "--out",
          str(out),
      ]
  )
  by = {r["name"]: r for r in result["rows"]}
  assert set(by) == {"teacher_fwd", "distill_step", "no_routing"}
  assert all(r["images_per_s"] > 0 for r in by.values())
  assert 0 < result["shares"]["teacher forward (of distill_step)"] < 1
  assert json.loads(out.read_text())["batch"] == 2


def test_gpu_script_runs_its_plan_into_the_named_folder(tmp_path):
  # bench/gpu.sh is run once when a GPU is lent: the same script at toy size on CPU must work.
  import os
  import subprocess
  import sys

  out = tmp_path / "gpu_out"
  env = dict(os.environ, PLAN="smoke", PY=sys.executable, BUDGET_S="300")
  done = subprocess.run(
      ["bash", "bench/gpu.sh", str(out)], env=env, capture_output=True, text=True, timeout=600
  )
  assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
  assert json.loads((out / "gpu_speed.json").read_text())["rows"]
  assert json.loads((out / "gpu_steps.json").read_text())["rows"]
  assert "## GPU (bench/gpu.sh)" in (out / "RESULTS.md").read_text()
  no_dir = subprocess.run(["bash", "bench/gpu.sh"], env=env, capture_output=True, text=True)
  assert no_dir.returncode != 0 and "usage" in no_dir.stderr


def test_lever_table_runs_an_arm_and_writes_its_row(tmp_path):
  """One lever arm (exact prefix rows) on the tiny Hugging Face DINOv2 with registers."""
  import os

  import numpy as np
  from PIL import Image

  from tools import lever_table

  photos = tmp_path / "photos"
  photos.mkdir()
  rs = np.random.RandomState(0)
  for i in range(6):
    Image.fromarray((rs.rand(40, 40, 3) * 255).astype(np.uint8)).save(photos / f"{i}.png")
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  rows = lever_table.main(
      [
          "--init",
          os.path.join(root, "tests", "data", "foreign", "hf_dinov2_registers"),
          "--images",
          str(photos),
          "--out",
          str(tmp_path / "out"),
          "--res",
          "28",
          "--max_images",
          "16",
          "--knn",
          "none",
          "--arms",
          "exact_prefix",
      ]
  )
  assert rows[0]["arm"] == "exact_prefix" and 0 < rows[0]["cls_cosine"] <= 1.0001
  assert rows[0]["speedup_56px"] > 0 and rows[0]["knn_retention"] is None
  saved = json.loads((tmp_path / "out" / "levers.json").read_text())
  assert saved["rows"] == json.loads(json.dumps(rows))
  assert "| exact_prefix |" in (tmp_path / "out" / "levers.md").read_text()


def test_lever_table_arms_are_pinned_and_build_a_config(tmp_path):
  """Arms start from the table's own base recipe, not from convert_folder's moving defaults, and
  every arm's options are ones convert_folder takes."""
  import argparse

  from linvit_jax import api
  from tools import lever_table

  args = argparse.Namespace(
      res=112, max_images=2000, batch=8, knn="none", knn_train=500, knn_eval=250
  )
  base = lever_table.arm_options("baseline", args)
  assert not (base["center_keys"] or base["conv_v"] or base["exact_prefix"] or base["align_lora"])
  assert base["distill_fraction"] == 1.0 and base["max_images"] == 2000
  lora = lever_table.arm_options("center_conv_align_mixup_lora8", args)
  assert (lora["align_lora"], lora["align_start_weight"], lora["align_mixup"]) == (8, 0.0, 1.0)
  assert (lora["distill_fraction"], lora["max_images"]) == (0.5, 4000) and "align_extra" not in lora
  assert lever_table.arm_options("center_conv_align_mixup_mid", args)["align_start_weight"] == 0.5
  for name in lever_table.ARMS:
    config = api.load_config(
        "convert_folder",
        init="unread.npz",
        images=str(tmp_path),
        **lever_table.arm_options(name, args),
    )
    assert config.data.image_size == 112, name
    assert ("align" in config.stages) == (
        lever_table.arm_options(name, args)["distill_fraction"] < 1
    )


def test_feature_map_layer_bench_runs_every_case_and_restores_the_map(tmp_path):
  from bench import bench_feature_map_layer as bench
  from linvit_jax.models import feature_maps

  original = feature_maps.HedgehogExp.__dict__["features"]
  out = tmp_path / "layer.json"
  result = bench.main(
      ["--batch", "1", "--tokens", "17", "--width", "32", "--heads", "2", "--reps", "1"]
      + ["--out", str(out)]
  )
  assert [r["case"] for r in result["rows"]] == list(bench.CASES)
  assert all(r["fwd_ms"] > 0 and r["fwd_bwd_ms"] > 0 for r in result["rows"])
  assert feature_maps.HedgehogExp.__dict__["features"] is original  # put back after each case
  assert json.loads(out.read_text())["shape"]["tokens"] == 17
  with pytest.raises(SystemExit, match="unknown case"):
    bench.main(["--cases", "hedgehog"])


def test_window_speed_bench_at_a_tiny_grid(tmp_path):
  # Every row of the window-hybrid layer bench on a 3×3 patch grid (width 32, 2 heads).
  from bench import window_speed

  out = tmp_path / "window_speed.json"
  argv = ["--px", "42", "--width", "32", "--heads", "2", "--reps", "1", "--out", str(out)]
  result = window_speed.main(argv)
  assert [r["tokens"] for r in result["rows"]] == [10] * 10
  assert {r["case"] for r in result["rows"]} == set(window_speed.CASES)
  assert all(r["ms"] > 0 and r["x_hedgehog_exp"] > 0 for r in result["rows"])
  assert json.loads(out.read_text())["commit"]
  text = window_speed.table(result)
  assert text.count("| window3 |") == 1 and "fwd+bwd × hedgehog_exp" in text


def test_hybrid_speed_bench_at_a_tiny_size(tmp_path):
  # Every whole-model case of the hybrid bench (mu/14 at 56 px: 17 tokens, its one layer the
  # softmax one), timed against the teacher in the same rounds.
  from bench import hybrid_speed

  out = tmp_path / "hybrid_speed.json"
  argv = ["--px", "56", "--variant", "mu/14", "--layer", "0", "--reps", "1", "--out", str(out)]
  result = hybrid_speed.main(argv)
  rows = {r["case"]: r for r in result["rows"]}
  assert list(rows) == list(hybrid_speed.CASES) and rows["teacher"]["speedup"] == 1.0
  assert all(r["s"] > 0 and r["speedup"] > 0 and r["tokens"] == 17 for r in rows.values())
  specs = hybrid_speed.specs("hybrid_keys16", 12, 4)
  assert specs[4].key_grid == 16 and specs[3].kind == "linear" and specs[3].conv_v
  assert "| 56 | 17 | hybrid_keys32 |" in hybrid_speed.table(json.loads(out.read_text()))
  with pytest.raises(SystemExit, match="has 1 layers"):
    hybrid_speed.main(["--variant", "mu/14", "--layer", "1", "--out", str(out)])


def test_run_vs_bench_times_trained_and_random_params(tmp_path):
  # The run's code path (photo_tokens.Tokens) on an exported student and its teacher, trained and
  # random params, a photo and noise, in the same rounds.
  from bench import run_vs_bench
  from tests.test_photo_eval import HF
  from tests.test_photo_eval import _hf_export
  from tests.test_photo_eval import write_photos

  student = _hf_export(tmp_path / "student")
  write_photos(str(tmp_path / "photos"), 1)
  photo = str(next((tmp_path / "photos").iterdir()))
  out = tmp_path / "run_vs_bench.json"
  argv = ["--student", student, "--teacher", HF, "--photo", photo, "--px", "28", "--reps", "1"]
  result = run_vs_bench.main([*argv, "--out", str(out)])
  cases = [r["case"] for r in result["rows"]]
  assert cases == ["teacher", "student", "teacher_random", "student_random", "student_noise"]
  assert all(r["s"] > 0 for r in result["rows"]) and result["ratio_trained"] > 0
  assert "| student_noise |" in run_vs_bench.table(json.loads(out.read_text()))
  # --batch: seconds per image of a batch of copies, the batch recorded and in the table
  batched = run_vs_bench.main([*argv, "--batch", "2"])
  assert batched["batch"] == 2 and all(len(r["times_s"]) == 1 for r in batched["rows"])
  assert "batch 2" in run_vs_bench.table(batched)
  with pytest.raises(SystemExit):
    run_vs_bench.main([*argv, "--batch", "0"])


def test_run_vs_bench_reports_seconds_per_image_of_a_batch(tmp_path, monkeypatch):
  from bench import run_vs_bench
  from tests.test_photo_eval import HF
  from tests.test_photo_eval import _hf_export
  from tests.test_photo_eval import write_photos

  seen = {}

  def fake_timings(cases, reps):
    seen["batch"] = {name: len(fn()) for name, fn in cases.items()}  # the images per forward
    return common.Timings({n: [3.0] for n in cases}, {}, {}, {})

  monkeypatch.setattr(common, "time_interleaved", fake_timings)
  student = _hf_export(tmp_path / "student")
  photo = write_photos(str(tmp_path / "photos"), 1)[0]
  argv = ["--student", student, "--teacher", HF, "--photo", photo, "--px", "28", "--batch", "2"]
  result = run_vs_bench.main(argv)
  assert set(seen["batch"].values()) == {2}
  assert all(r["s"] == 1.5 and r["times_s"] == [1.5] for r in result["rows"])
