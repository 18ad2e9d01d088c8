"""Surgery of the shared big_vision checkpoint into linear students, per policy and layout."""

import json
import re

import jax
import numpy as np
import pytest

from linvit_jax.conversion import surgery
from linvit_jax.models import vit
from linvit_jax.models import vit_checkpoint
from linvit_jax.runtime import tree as tree_lib
from tests.helpers import robust_common as robust
from tests.helpers.bv_checkpoint import unflatten

ATTN_PROJ = re.compile(
    r"Transformer/encoderblock_\d+/MultiHeadDotProductAttention_0/" r"(query|key|value|out)/.*"
)
FMAP = re.compile(r".*/feature_map_[qk]/.*")


def _student_init(model_config, images, seed=1, **kw):
  """A student's init: the real tree of `vit.Model(..., **kw)` (from eval_shape), values drawn
  with numpy. (XLA compiles a ViT's init in ~20 s on a loaded 2-core machine; surgery does not
  care how the init values were drawn.)"""
  model = vit.Model(**model_config, **kw)
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), images[:1])["params"]
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda s: rng.normal(0, 0.02, s.shape).astype(s.dtype), shapes)


@pytest.fixture(scope="module")
def teacher_and_student(bv_fixture):
  meta, flat, ref = bv_fixture
  student = _student_init(meta["model_config"], ref["images"], attention="hedgehog")
  return meta, unflatten(flat), student


def _expected_action(policy, path):
  if FMAP.fullmatch(path):
    return "keep"
  attn = bool(ATTN_PROJ.fullmatch(path))
  return {
      "copy_same": "keep" if attn else "copy",
      "copy_all": "copy",
      "copy_attention_only": "copy" if attn else "keep",
      "copy_none": "keep",
  }[policy]


@pytest.mark.parametrize("policy", ["copy_same", "copy_all", "copy_attention_only", "copy_none"])
def test_named_policies_copy_and_keep_bitwise(teacher_and_student, policy, tmp_path):
  meta, teacher, student = teacher_and_student
  params, report = surgery.transplant(teacher, student, policy)
  t, s, out = robust.flat(teacher), robust.flat(student), robust.flat(params)
  assert out.keys() == s.keys()
  assert [r.path for r in report.rows] == sorted(s, key=surgery._natural_key)  # complete
  n_fmap = 0
  for path, value in out.items():
    want = _expected_action(policy, path)
    assert report.action_of(path) == want, path
    src = t[path] if want == "copy" else s[path]
    assert value.dtype == src.dtype and value.shape == src.shape, path
    assert value.tobytes() == src.tobytes(), path  # bitwise
    n_fmap += bool(FMAP.fullmatch(path))
  assert n_fmap == 4 * meta["model_config"]["depth"]  # kernel+bias, q and k maps, per block
  counts = report.counts()
  assert counts["copy"] + counts["keep"] == len(s)
  assert counts["copy_params"] + counts["keep_params"] == sum(v.size for v in s.values())
  assert report.unused_teacher == sorted(
      (p for p in t if report.action_of(p) == "keep"), key=surgery._natural_key
  )
  # The copy_same arm copies everything but q/k/v/out: 4 blocks x 8 attention leaves stay.
  if policy == "copy_same":
    assert counts["copy"] == len(t) - 8 * 4
  assert report.copied_attention() == (policy in ("copy_all", "copy_attention_only"))

  table = report.table()
  assert "Transformer/encoderblock_3/MultiHeadDotProductAttention_0/feature_map_k/kernel" in table
  assert table.splitlines()[0].split() == ["path", "action", "shape", "rule"]
  report.to_json(str(tmp_path / "surgery.json"))
  with open(tmp_path / "surgery.json") as f:
    saved = json.load(f)
  assert len(saved["rows"]) == len(s) and saved["counts"] == counts
  assert saved["rows"][0].keys() >= {"path", "action", "shape", "rule"}


@pytest.mark.parametrize("teacher_scan,student_scan", [(False, True), (True, False), (True, True)])
def test_scanned_and_per_block_trees_mix(teacher_and_student, teacher_scan, student_scan):
  _, teacher, student = teacher_and_student
  t_in = vit_checkpoint.pyloop_to_scan(teacher) if teacher_scan else teacher
  s_in = vit_checkpoint.pyloop_to_scan(student) if student_scan else student
  ref_params, ref_report = surgery.transplant(teacher, student, "copy_same")
  params, report = surgery.transplant(t_in, s_in, "copy_same")
  # The output keeps the student's layout ...
  assert ("encoderblock" in params["Transformer"]) == student_scan
  assert {k: np.shape(v) for k, v in tree_lib.flatten(params).items()} == {
      k: np.shape(v) for k, v in tree_lib.flatten(s_in).items()
  }
  # ... and per block holds exactly what the per-block surgery gives.
  got = robust.flat(vit_checkpoint.scan_to_pyloop(params))
  want = robust.flat(ref_params)
  assert got.keys() == want.keys()
  for k in want:
    assert got[k].tobytes() == want[k].tobytes(), k
  assert report.rows == ref_report.rows


def test_scanned_copy_passes_teacher_leaf_through(teacher_and_student):
  _, teacher, student = teacher_and_student
  t, s = vit_checkpoint.pyloop_to_scan(teacher), vit_checkpoint.pyloop_to_scan(student)
  params, _ = surgery.transplant(t, s, "copy_same")
  blk = params["Transformer"]["encoderblock"]
  assert (
      blk["MlpBlock_0"]["Dense_0"]["kernel"]
      is t["Transformer"]["encoderblock"]["MlpBlock_0"]["Dense_0"]["kernel"]
  )
  assert (
      blk["MultiHeadDotProductAttention_0"]["query"]["kernel"]
      is s["Transformer"]["encoderblock"]["MultiHeadDotProductAttention_0"]["query"]["kernel"]
  )


def test_mixed_rules_within_scanned_leaf_and_inputs_untouched(teacher_and_student):
  _, teacher, student = teacher_and_student
  s = vit_checkpoint.pyloop_to_scan(student)
  before = robust.flat(s)
  rules = surgery.get_policy(
      "copy_same",
      prepend=[
          (
              r"Transformer/encoderblock_2/MultiHeadDotProductAttention_0/"
              r"(query|key|value|out)/.*",
              "copy",
          )
      ],
  )
  params, report = surgery.transplant(teacher, s, rules)
  attn = "MultiHeadDotProductAttention_0"
  q = params["Transformer"]["encoderblock"][attn]["query"]["kernel"]
  teacher_q2 = teacher["Transformer"]["encoderblock_2"][attn]["query"]["kernel"]
  np.testing.assert_array_equal(q[2], teacher_q2)
  np.testing.assert_array_equal(q[1], before[f"Transformer/encoderblock/{attn}/query/kernel"][1])
  assert (
      report.action_of("Transformer/encoderblock_2/MultiHeadDotProductAttention_0/out/bias")
      == "copy"
  )
  after = robust.flat(s)
  assert all(after[k].tobytes() == before[k].tobytes() for k in before)


def test_copy_casts_to_student_dtype(teacher_and_student):
  _, teacher, student = teacher_and_student
  t16 = jax.tree.map(lambda x: np.asarray(x).astype(jax.numpy.bfloat16), teacher)
  params, report = surgery.transplant(t16, student, "copy_same")
  k = params["Transformer"]["encoderblock_0"]["MlpBlock_0"]["Dense_0"]["kernel"]
  assert k.dtype == np.float32
  np.testing.assert_array_equal(
      k,
      np.asarray(
          t16["Transformer"]["encoderblock_0"]["MlpBlock_0"]["Dense_0"]["kernel"], np.float32
      ),
  )
  assert "cast bfloat16 -> float32" in report.table()


def test_shape_mismatch_names_path_and_both_shapes(bv_fixture, teacher_and_student):
  meta, _, ref = bv_fixture
  _, teacher, _ = teacher_and_student
  student = _student_init({**meta["model_config"], "num_classes": 7}, ref["images"])
  with pytest.raises(
      surgery.SurgeryError, match=r"'head/kernel'.*teacher \(192, 10\), student \(192, 7\)"
  ):
    surgery.transplant(teacher, student, "copy_same")
  params, report = surgery.transplant(
      teacher, student, surgery.get_policy("copy_same", prepend=[("head/.*", "keep")])
  )
  assert report.action_of("head/kernel") == "keep"
  assert report.action_of("embedding/kernel") == "copy"
  assert "head/kernel" in report.unused_teacher


def test_copy_of_leaf_absent_in_teacher_and_unmatched_leaf_are_errors(teacher_and_student):
  _, teacher, student = teacher_and_student
  with pytest.raises(
      surgery.SurgeryError,
      match=r"encoderblock_0/MultiHeadDotProductAttention_0/"
      r"feature_map_k/bias'.*teacher has no such leaf",
  ):
    surgery.transplant(teacher, student, [(".*", "copy")])
  with pytest.raises(surgery.SurgeryError, match=r"'cls' is matched by no rule"):
    surgery.transplant(teacher, student, [(r"(?!cls).*", "keep")])
  with pytest.raises(surgery.SurgeryError, match="unknown surgery policy 'copy_some'"):
    surgery.get_policy("copy_some")
  with pytest.raises(surgery.SurgeryError, match="action must be one of"):
    surgery.get_policy([(".*", "take")])
  with pytest.raises(surgery.SurgeryError, match="bad regex"):
    surgery.get_policy([("(", "keep")])


def test_deeper_teacher_fills_a_shallower_student(bv_fixture, teacher_and_student):
  meta, _, ref = bv_fixture
  _, teacher, _ = teacher_and_student
  student = _student_init({**meta["model_config"], "depth": 2}, ref["images"], attention="elu1")
  params, report = surgery.transplant(teacher, student, "copy_all")
  assert all(r.action == "copy" for r in report.rows)
  assert report.copied_attention()
  assert any(p.startswith("Transformer/encoderblock_3/") for p in report.unused_teacher)
  assert {k: np.shape(v) for k, v in tree_lib.flatten(params).items()} == {
      k: np.shape(v) for k, v in tree_lib.flatten(student).items()
  }
  short = report.table(max_rows=6)
  assert "rows ..." in short and len(short.splitlines()) == 1 + 7 + 1


def test_summary_is_one_line_of_counts_and_groups(teacher_and_student):
  _, teacher, student = teacher_and_student
  _, report = surgery.transplant(teacher, student, "copy_same")
  c = report.counts()
  assert report.summary() == f"{c['copy']} tensors copied, {c['keep']} fresh (attention)"
  _, report = surgery.transplant(teacher, student, "copy_none")
  depth = len({r.path.split("/")[1] for r in report.rows if "encoderblock" in r.path})
  assert report.summary() == (  # the largest group first
      f"0 tensors copied, {c['copy'] + c['keep']} fresh ({12 * depth} attention, "
      f"{4 * depth} LayerNorm, {4 * depth} MlpBlock, 2 embedding, 2 encoder_norm, 2 head, "
      "1 cls, 1 pos_embedding)"
  )


def test_run_writes_the_table_to_a_file_and_prints_one_line(teacher_and_student, capsys, tmp_path):
  """The table (one row per tensor, ~270 for a ViT-B) used to go to stdout."""
  import ml_collections as mlc

  from linvit_jax import run as run_lib
  from linvit_jax.evaluation import results as results_lib

  _, teacher, student = teacher_and_student
  config = mlc.ConfigDict({"surgery": {"policy": "copy_same"}, "student": {"dont_load": ()}})
  _, copied = run_lib._transplant(
      config, str(tmp_path), teacher, student, student, results_lib.Results()
  )
  assert not copied  # copy_same leaves the attention fresh: the driver calibrates it
  out = capsys.readouterr().out
  _, report = surgery.transplant(teacher, student, "copy_same")
  table = str(tmp_path / "surgery_report.txt")
  assert out == f"surgery: {report.summary()}, table in {table}\n"
  with open(table) as f:
    assert f.read() == report.table() + "\n"  # every row, none elided
  assert (tmp_path / "surgery_report.json").exists()
