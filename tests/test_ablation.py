"""The ablation in parts (runs merged across invocations) and the token-count study's report."""

import json
import os

import pytest

from configs import ablation as ablation_config
from linvit_jax.studies import ablation
from linvit_jax.studies import token_study
from tools import update_token_study_readme


def _fake_run(workdir, config, arm, seed, top1, *, teacher=None, before=0.5):
  """A finished run as run.run leaves it: results.json with the arm's config and numbers."""
  a = config.ablation
  cfg = ablation.arm_config(config, arm, seed, a.finetune_steps, a.distill_steps, a.eval_every)
  r = {
      "config": cfg.to_dict(),
      "student_top1": top1,
      "student_top1_before_finetune": before,
      "timing_s": {"total": 60.0},
      "histories": {
          "finetune": [
              {"step": s, "eval/top1": top1 - 0.01 * (2 - i)} for i, s in enumerate((2, 4))
          ]
      },
  }
  if teacher is not None:
    r["teacher_top1"] = teacher
  d = os.path.join(workdir, arm, f"seed{seed}")
  os.makedirs(d, exist_ok=True)
  with open(os.path.join(d, "results.json"), "w") as f:
    json.dump(r, f)


def test_seed_list_and_seeds_args():
  assert ablation_config.get_config("seeds=2").ablation.seeds == (0, 1)
  assert ablation_config.get_config("seed_list=3+5").ablation.seeds == (3, 5)
  assert ablation_config.get_config("seed_list=4").ablation.seeds == (4,)


def test_report_merges_runs_of_several_invocations_and_ignores_another_budget(tmp_path):
  config = ablation_config.get_config("tiny=True")
  wd = str(tmp_path)
  _fake_run(wd, config, "copy_same", 0, 0.70, teacher=0.86)
  _fake_run(wd, config, "copy_same", 2, 0.72)  # a later invocation, seed_list=2
  _fake_run(wd, config, "random", 1, 0.30)
  other = ablation_config.get_config("tiny=True,feature_map=elu1")  # another model: not merged
  _fake_run(wd, other, "random", 5, 0.99)
  out = ablation.write_report(config, wd)
  assert [len(v) for v in out["results"].values()] == [1, 2]  # ARMS order: random, copy_same
  md = (tmp_path / "ablation.md").read_text()
  assert "- `copy_same`: seeds [0, 2]" in md and "- `random`: seeds [1]" in md
  assert "ignored (another model or budget): random/seed5" in md
  assert "| copy_same | 50.00 ± 0.00 | 71.00 ± 1.41 | -15.00 |" in md
  assert (tmp_path / "ablation.png").stat().st_size > 1000


def test_ablation_skips_finished_runs_and_runs_the_rest(tmp_path):
  config = ablation_config.get_config("tiny=True,arms=copy_same,seed_list=0+1")
  wd = str(tmp_path)
  _fake_run(wd, config, "copy_same", 0, 0.123, teacher=0.5)  # "finished earlier"
  out = ablation.run_ablation(config, wd)
  runs = out["results"]["copy_same"]
  assert runs[0]["student_top1"] == 0.123  # not rerun
  assert runs[1]["config"]["seed"] == 1 and 0.0 <= runs[1]["student_top1"] <= 1.0
  assert os.path.exists(tmp_path / "copy_same" / "seed1" / "student.npz")


def test_unknown_arm_is_named(tmp_path):
  config = ablation_config.get_config("tiny=True,arms=copy_sam")
  with pytest.raises(Exception, match="copy_sam"):
    ablation.run_ablation(config, str(tmp_path))


def _study(tmp_path, name, patch, teacher, arms):
  config = ablation_config.get_config(f"tiny=True,patch={patch}")
  wd = str(tmp_path / name)
  first = True
  for arm, values in arms.items():
    for seed, v in enumerate(values):
      _fake_run(wd, config, arm, seed, v, teacher=teacher if first else None)
      first = False
  ablation.write_report(config, wd)
  return wd


def test_token_study_verdicts_plot_and_readme_block(tmp_path):
  p7 = _study(
      tmp_path,
      "p7",
      7,
      0.80,
      {
          "random": [0.60, 0.61, 0.62],
          "copy_attention": [0.50, 0.51, 0.52],  # claim 1 holds
          "copy_same": [0.62, 0.63, 0.64],  # claim 2 holds: +2 points
          "copy_same_distill": [0.70, 0.71, 0.72],  # claim 3 fails by 9 points
      },
  )
  p4 = _study(
      tmp_path,
      "p4",
      4,
      0.86,
      {
          "random": [0.30, 0.31, 0.32],
          "copy_attention": [0.80, 0.81, 0.82],  # claim 1 fails
          "copy_same": [0.70, 0.71, 0.72],  # +40 points: more than ~3
          "copy_same_distill": [0.85, 0.87, 0.86],  # 86 vs 86: not resolved
      },
  )
  readme = tmp_path / "README.md"
  readme.write_text("intro\n<!-- ablation:begin -->\nold numbers\n<!-- ablation:end -->\nrest\n")
  out = tmp_path / "docs"
  md = token_study.main([p7, p4, "--out", str(out)])
  assert update_token_study_readme.main([p7, p4, "--readme", str(readme)]) == md
  rows = [
      line for line in md.splitlines() if line.startswith("| 17 |") or line.startswith("| 50 |")
  ]
  verdict = {(r.split("|")[1].strip(), r.split("|")[2].strip()[0]): r.split("|")[4] for r in rows}
  assert verdict[("17", "1")].strip() == "holds"
  assert verdict[("17", "2")].strip() == "holds"
  assert verdict[("17", "3")].strip() == "does not hold"
  assert verdict[("50", "1")].strip() == "does not hold"
  assert "more than 3 points" in verdict[("50", "2")]
  assert verdict[("50", "3")].strip() == "not resolved"
  text = readme.read_text()
  assert "old numbers" not in text and text.startswith("intro\n") and text.endswith("rest\n")
  assert "| 17 tokens | 50 tokens |" in text
  assert (out / "ablation_tokens.png").stat().st_size > 1000
  assert (out / "ablation_17tokens.png").exists() and (out / "ablation_50tokens.png").exists()
  assert "## 17 tokens" in (out / "ablation.md").read_text()


def test_readme_without_the_block_is_an_error():
  with pytest.raises(ValueError, match="ablation:begin"):
    update_token_study_readme.replace_block("no markers here", "x")
