"""results.py: the run's typed record and its JSON layout (results.json)."""

import dataclasses
import glob
import json
import os
import re

import pytest

from linvit_jax import report
from linvit_jax.artifacts import export_folder
from linvit_jax.artifacts import model_card
from linvit_jax.configuration import config_lib
from linvit_jax.evaluation import results as results_lib
from linvit_jax.evaluation import summary

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMITTED = sorted(glob.glob(os.path.join(ROOT, "docs", "*_results.json")))


def _text(d) -> str:
  return json.dumps(d, indent=1, default=float)  # how run.run writes results.json


def _fid(cos: float) -> dict:
  return {
      "layers": [{"cosine": cos, "nmse": 1 - cos}, {"cosine": cos - 0.1, "nmse": 1.1 - cos}],
      "end_to_end": {"cls_cosine": cos, "patch_cosine": cos - 0.01, "block_cosine": [cos, cos]},
  }


def _hybrid_run() -> dict:
  """A labelled hybrid run's results.json as run.run wrote it before the record (key order too)."""
  config = {"stages": ["distill_attention", "align", "finetune"], "eval": {"throughput_batch": 4}}
  d = {"config": config, "timing_s": {"total": 9.0}}
  d |= {"labelled": True, "teacher_top1": 0.9, "student_top1_converted": 0.1}
  d |= {"fidelity_converted": _fid(0.5)["layers"], "end_to_end_converted": _fid(0.5)["end_to_end"]}
  d |= {"student_top1_after_distill_attention": 0.6}
  d |= {"fidelity_after_distill_attention": _fid(0.8)["layers"]}
  d |= {"end_to_end_after_distill_attention": _fid(0.8)["end_to_end"], "softmax_layers": [1]}
  d |= {"softmax_layers_fix_gains": [0.01, 0.02]}  # picked by sensitivity
  d |= {"fidelity_hybrid_after_distill_attention": _fid(0.85)["layers"]}
  d |= {"end_to_end_hybrid_after_distill_attention": _fid(0.85)["end_to_end"]}
  d |= {"student_top1_before_finetune": 0.7, "student_top1_after_align": 0.7}
  d |= {
      "fidelity_after_align": _fid(0.9)["layers"],
      "end_to_end_after_align": _fid(0.9)["end_to_end"],
  }
  d |= {"student_top1_after_finetune": 0.8, "fidelity_after_finetune": _fid(0.95)["layers"]}
  d |= {"end_to_end_after_finetune": _fid(0.95)["end_to_end"], "student_top1": 0.8}
  d |= {"histories": {"distill_attention": [], "align": [], "finetune": []}, "images_seen": 64}
  d |= {"student_attention": "elu1", "student_images_per_s": 10.0, "teacher_images_per_s": 5.0}
  return d | {"student_logits_sample": [[0.0, 1.0]]}


@pytest.mark.parametrize("path", COMMITTED, ids=os.path.basename)
def test_committed_results_round_trip(path):
  """Every committed results.json (layout 1, no version key) loads and writes back the same text;
  a key the record does not know (window_share, a retired measure) is kept, after the known ones."""
  with open(path) as f:
    data = json.load(f)
  record = results_lib.Results.from_json(data)
  assert record.version == 1 and "version" not in record.to_json()
  if record.extra:
    assert record.to_json() == data and list(record.extra) == ["window_share"]
  else:
    assert record.dumps() == _text(data)
  assert record.final() is not None and record.converted is not None


def test_a_hybrid_run_reads_by_stage_and_writes_back_its_key_order():
  data = _hybrid_run()
  r = results_lib.Results.from_json(data)
  assert r.dumps() == _text(data)
  assert [s.name for s in r.stages] == ["distill_attention", "align", "finetune"]
  assert r.after("distill_attention").softmax_layers == r.softmax_layers == [1]
  assert r.after("distill_attention").softmax_gains == [0.01, 0.02]
  assert r.fidelity("distill_attention").layers[0]["cosine"] == 0.8  # before the swap
  assert r.after("distill_attention").hybrid.layers[0]["cosine"] == 0.85
  assert r.fidelity(results_lib.CONVERTED).end_to_end["cls_cosine"] == 0.5
  assert r.top1_after("align") == 0.7 and r.top1_before_finetune == 0.7
  assert r.after("align").top1_before == 0.7 and r.after("finetune").top1_before is None
  assert [t for t, _ in r.scorings()] == [
      "converted",
      "after_distill_attention",
      "hybrid_after_distill_attention",
      "after_align",
      "after_finetune",
  ]
  tag, final = r.final()
  assert tag == "after_finetune" and final.scalars() == {"cls_cosine": 0.95, "patch_cosine": 0.94}
  assert r.teacher_scored and r.teacher_top1 == 0.9 and r.after("missing") is None
  # As a Mapping it reads as its results.json (code that checks the file's content).
  assert r["end_to_end_after_align"] == data["end_to_end_after_align"] and dict(r) == data


def test_the_record_the_driver_fills_writes_the_same_layout():
  """Built field by field (as run.run does), the record writes the keys the old driver wrote."""
  data = _hybrid_run()
  fid = lambda key: results_lib.Fidelity(**_fid(key))  # noqa: E731
  r = results_lib.Results(data["config"], timing_s={"total": 9.0}, labelled=True)
  r.teacher_scored, r.teacher_top1 = True, 0.9
  r.converted = results_lib.Stage(results_lib.CONVERTED, top1=0.1, fidelity=fid(0.5))
  distill = results_lib.Stage("distill_attention", top1=0.6, fidelity=fid(0.8))
  distill.softmax_layers, distill.hybrid = [1], fid(0.85)
  distill.softmax_gains = [0.01, 0.02]
  align = results_lib.Stage("align", top1=0.7, fidelity=fid(0.9), top1_before=0.6)
  finetune = results_lib.Stage("finetune", top1=0.8, fidelity=fid(0.95), top1_before=0.7)
  r.stages, r.top1_before_finetune = [distill, align, finetune], 0.7
  r.student_top1, r.histories, r.images_seen = 0.8, data["histories"], 64
  r.student_attention, r.student_images_per_s, r.teacher_images_per_s = "elu1", 10.0, 5.0
  r.student_logits_sample = [[0.0, 1.0]]
  assert r.dumps() == _text(data)  # one key for the before-fine-tune top-1: the last, first place


def test_missing_keys_read_as_not_measured_and_a_newer_layout_is_refused():
  r = results_lib.Results.from_json({})
  assert r.final() is None and r.stages == [] and r.knn is None and not r.teacher_scored
  assert r.softmax_layers == [] and r.top1_before_finetune is None and r.measures() == []
  assert "where the time went: not recorded" in summary.format_summary(r)
  # The keys a run always writes, even when not labelled (None).
  assert set(r.to_json()) == {"config", "timing_s", "labelled", "student_top1"}
  # An unlabelled run: the teacher scored (None), unlike a run that did not score it at all.
  unlabelled = results_lib.Results.from_json({"teacher_top1": None, "student_top1_converted": None})
  assert unlabelled.teacher_scored and unlabelled.converted.top1 is None
  assert list(unlabelled.to_json())[3:5] == ["teacher_top1", "student_top1_converted"]
  with pytest.raises(ValueError, match="layout version 2: this code reads up to 1"):
    results_lib.Results.from_json({"version": 2})


def test_an_unknown_key_is_kept_and_written_back():
  data = _hybrid_run() | {"depth_rmse": 0.3}
  r = results_lib.Results.from_json(data)
  assert r.extra == {"depth_rmse": 0.3} and r.to_json() == data
  assert results_lib.Results.from_json(r.to_json()).extra == {"depth_rmse": 0.3}


def test_read_and_as_record(tmp_path):
  path = tmp_path / "results.json"
  path.write_text(_text(_hybrid_run()))
  r = results_lib.read(str(path))
  assert results_lib.as_record(r) is r and results_lib.as_record(_hybrid_run()) == r


def test_json_schema_names_every_key_of_the_committed_runs():
  schema = results_lib.json_schema()
  patterns = [re.compile(p) for p in schema["patternProperties"]]
  for path in COMMITTED + [None]:
    if path is None:
      data = _hybrid_run()
    else:
      with open(path) as f:
        data = json.load(f)
    unknown = [
        k for k in data if k not in schema["properties"] and not any(p.match(k) for p in patterns)
    ]
    assert unknown in ([], ["window_share"]), (path, unknown)
    assert set(schema["required"]) <= set(data)


def test_every_measure_has_its_evaluator_and_every_evaluator_its_field():
  """report.MEASURES (what the driver runs after the stages) and the record's measure fields are
  one list: a field without an evaluator, or an evaluator without a field, fails here."""
  fields = [f.name for f in results_lib.Results.measure_fields()]
  assert [m.field for m in report.MEASURES] == fields


@dataclasses.dataclass(eq=False)
class _WithDepth(results_lib.Results):
  """The record as it would be with one more measure (the closing note's example)."""

  depth_rmse: float | None = results_lib.measure("depth RMSE (drop-in)", card="depth_rmse")


def test_a_new_measure_needs_only_its_field_and_its_evaluator():
  """The summary, results.json and the export's card iterate the record's measure fields: a new
  one shows up in each without a change to them."""
  r = _WithDepth.from_json(_hybrid_run())
  r.depth_rmse = 0.25
  assert r.to_json()["depth_rmse"] == 0.25
  assert _WithDepth.from_json(r.to_json()).depth_rmse == 0.25
  assert "depth RMSE (drop-in): 0.2500" in summary.format_summary(r).splitlines()
  c = config_lib.base_config()
  with c.unlocked():
    c.stages = ()
  cfg = export_folder.student_config({"width": 8, "depth": 2}, "elu1", c, r)
  assert cfg["fidelity"]["depth_rmse"] == 0.25
  assert cfg["fidelity"]["end_to_end"]["measured"] == "after_finetune"
  assert "- depth rmse: 0.2500" in model_card.model_card(cfg).splitlines()
