"""tools/collect_test_photos.py: a run's figures copied as they are; --update keeps the others."""

import importlib.util
import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _tool():
  spec = importlib.util.spec_from_file_location(
      "collect", ROOT / "tools" / "collect_test_photos.py"
  )
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _workdir(tmp_path, name, seed, eval_dataset):
  config = {
      "seed": seed,
      "stages": ["distill_attention"],
      "distill_attention": {"steps": 10, "batch_size": 8},
      "data": {"data_dir": f"/photos_{name}", "train_split": "all", "image_size": 224},
  }
  if eval_dataset:
    config["data"]["eval_dataset"] = eval_dataset
  results = {
      "config": config,
      "test": {"rows": [{"size": 224, "view": "whole"}]},
      "timing_s": {"total": 60.0 + seed},
      "histories": {"distill_attention": [{"steps_per_sec": 0.5}, {"steps_per_sec": 0.25}]},
      "knn": {"retention": 0.98, "per_class": [1, 2]},
  }
  workdir = tmp_path / name
  workdir.mkdir()
  (workdir / "results.json").write_text(json.dumps(results))
  return str(workdir)


def test_update_keeps_runs_not_named_and_records_the_eval_folder(tmp_path, capsys):
  tool = _tool()
  out = str(tmp_path / "study.json")
  assert tool.main([out, f"a={_workdir(tmp_path, 'a', 0, '')}"]) == 0
  other = _workdir(tmp_path, "b", 1, "image_folder:/photos_a")
  assert tool.main([out, f"b={other}", "--update"]) == 0
  study = json.loads(pathlib.Path(out).read_text())
  assert sorted(study) == ["a", "b"]
  assert study["a"]["eval_dataset"] == "" and study["b"]["eval_dataset"] == "image_folder:/photos_a"
  assert study["b"]["step_seconds"] == {"distill_attention": 2.0}  # 1 / the median rate
  assert study["b"]["knn"] == {"retention": 0.98}  # lists are left out
  assert tool.main([out, f"b={other}"]) == 0  # without --update: only the named runs
  assert sorted(json.loads(pathlib.Path(out).read_text())) == ["b"]
  assert tool.main([out, "--update"]) == 2  # no run named
  assert "NAME=WORKDIR" in capsys.readouterr().err


def test_compare_jsons_beside_a_run_and_on_their_own(tmp_path):
  tool = _tool()
  out = str(tmp_path / "study.json")
  workdir = pathlib.Path(_workdir(tmp_path, "a", 0, "image_folder:/cross"))
  (workdir / "seen.json").write_text(json.dumps({"n_test": 68, "rows": []}))
  (workdir / "in_source.json").write_text(json.dumps({"n_test": 7, "rows": []}))
  (workdir / "people.json").write_text(json.dumps({"n_test": 15, "rows": []}))
  table = tmp_path / "again.json"
  table.write_text(json.dumps({"n_test": 15, "rows": [{"size": 224}]}))
  assert tool.main([out, f"a={workdir}", f"b={table}"]) == 0
  study = json.loads(pathlib.Path(out).read_text())
  assert study["a"]["seen"]["n_test"] == 68 and study["a"]["in_source"]["n_test"] == 7
  assert study["a"]["people"]["n_test"] == 15
  assert study["b"] == {"compare": "again.json", "test": {"n_test": 15, "rows": [{"size": 224}]}}
