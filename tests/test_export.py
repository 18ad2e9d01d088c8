"""Export and reload of a student (linvit_jax/artifacts/: export_folder, model_card, safetensors_file,
student_loader) and the Python API (linvit_jax.convert, linvit_jax.load_student), on the tiny Hugging Face conversion shared with test_import_weights.
"""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import linvit_jax
from linvit_jax.artifacts import export_folder
from linvit_jax.artifacts import export_format
from linvit_jax.artifacts import model_card
from linvit_jax.artifacts import provenance
from linvit_jax.artifacts import safetensors_file
from linvit_jax.data import pp_spec
from linvit_jax.models import checkpoints

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_export_folder_carries_what_a_user_needs(tiny_hf_conversion):
  _, workdir = tiny_hf_conversion
  for name in ("student.npz", "student.safetensors", "student_config.json", "README.md"):
    assert (workdir / name).exists(), name
  cfg = json.loads((workdir / "student_config.json").read_text())
  assert cfg["format"] == 2
  # the default hybrid: one layer softmax, the others the linear operator
  kinds = [a["kind"] for a in cfg["model"]["attention"]]
  assert kinds.count("softmax") == 1 and kinds.count("linear") == len(kinds) - 1
  assert cfg["recipe"]["softmax_layers"] == [kinds.index("softmax")] == [1]  # softmax_pick="1"
  linear = next(a for a in cfg["model"]["attention"] if a["kind"] == "linear")
  assert linear["feature_map"] == "hedgehog_exp" and linear["conv_v"] and linear["center_keys"]
  pre = cfg["preprocessing"]
  assert pre["image_size"] == [28, 28] and pre["gelu"] == "exact" and pre["patch_size"] == [7, 7]
  assert pre["pp"].startswith("decode|") and pre["pp"].endswith('keep("image")')
  assert "flip_lr" not in pre["pp"] and "inception_crop" not in pre["pp"]
  assert cfg["teacher"]["init"].endswith("hf_dinov2_registers")
  assert [s["kind"] for s in cfg["recipe"]["stages"]] == ["distill_attention", "align"]
  e2e = cfg["fidelity"]["end_to_end"]
  assert e2e["measured"] == "after_align" and 0 < e2e["cls_cosine"] <= 1.0001
  card = (workdir / "README.md").read_text()
  assert f"cls cosine {e2e['cls_cosine']:.4f}" in card and "load_student" in card
  assert _front_matter(card)["base_model"] == "hf_dinov2_registers"
  assert ROOT not in card and str(workdir) not in card  # no local paths in a published card


def test_safetensors_holds_the_same_params_and_the_config(tiny_hf_conversion):
  from safetensors import numpy as st_numpy
  from safetensors import safe_open

  _, workdir = tiny_hf_conversion
  npz = checkpoints.flatten(checkpoints.load_npz(str(workdir / "student.npz")))
  st = st_numpy.load_file(str(workdir / "student.safetensors"))
  assert sorted(st) == sorted(npz)
  for k in npz:
    np.testing.assert_array_equal(st[k], npz[k])
  with safe_open(str(workdir / "student.safetensors"), framework="numpy") as f:
    meta = json.loads(f.metadata()["student_config"])
  assert meta == json.loads((workdir / "student_config.json").read_text())


def test_safetensors_file_round_trip_bfloat16_included(tmp_path):
  """safetensors_file writes what safetensors' own save_file writes, and reads it back, bfloat16
  included, from a local file (safe_open) and from its bytes (a remote file's path)."""
  import ml_dtypes
  from safetensors import numpy as st_numpy
  from safetensors import safe_open

  rng = np.random.default_rng(0)
  flat = {
      "embedding/kernel": rng.normal(size=(4, 4, 3, 8)).astype(np.float32),
      "Transformer/encoder_norm/scale": rng.normal(size=(8,)).astype(ml_dtypes.bfloat16),
      "steps": np.arange(3, dtype=np.int32),
  }
  cfg = {"format": 2, "model": {"width": 8}}
  path = str(tmp_path / "student.safetensors")
  safetensors_file.write(path, flat, cfg)
  st_numpy.save_file(flat, str(tmp_path / "ref.safetensors"), {"student_config": json.dumps(cfg)})
  assert (tmp_path / "ref.safetensors").read_bytes() == (
      tmp_path / "student.safetensors"
  ).read_bytes()
  with safe_open(path, framework="numpy") as f:
    assert json.loads(f.metadata()["student_config"]) == cfg
  with open(path, "rb") as f:
    data = f.read()
  for read in (safetensors_file.read(path), safetensors_file.from_bytes(data)):
    assert sorted(read) == sorted(flat)
    for name, a in flat.items():
      assert read[name].dtype == a.dtype and read[name].shape == a.shape, name
      np.testing.assert_array_equal(read[name].view(np.uint8), a.view(np.uint8))


def test_a_bfloat16_student_loads_from_safetensors_alone(tiny_hf_conversion, tmp_path):
  student, _ = tiny_hf_conversion
  bf16 = jax.tree.map(lambda a: np.asarray(a).astype(jnp.bfloat16), student.params)
  export_folder.save(str(tmp_path / "bf16"), bf16, student.config, npz=False)
  again = linvit_jax.load_student(str(tmp_path / "bf16"))
  for a, b in zip(jax.tree.leaves(again.params), jax.tree.leaves(bf16)):
    assert a.dtype == jnp.bfloat16
    np.testing.assert_array_equal(a.view(np.uint16), b.view(np.uint16))


def test_student_api(tiny_hf_conversion, tmp_path):
  student, workdir = tiny_hf_conversion
  photo = sorted((workdir.parent / "photos").iterdir())[0]
  from PIL import Image

  pixels = np.asarray(Image.open(photo).convert("RGB"))
  by_path, by_array = student.preprocess([str(photo)]), student.preprocess(pixels)
  assert by_path.shape == (1, 28, 28, 3) and by_path.dtype == np.float32
  np.testing.assert_array_equal(by_path, by_array)  # a PNG's pixels: the same input
  assert abs(float(by_path.mean())) < 3  # ImageNet-normalised, not 0..255
  feats = student.encode([str(photo)])
  np.testing.assert_allclose(feats, student.encode(by_path), rtol=1e-6)
  assert feats.shape == (1, 32) and student.tokens(by_path).shape == (1, 1 + 3 + 16, 32)
  with pytest.raises(export_format.ExportError, match="no head"):
    student.predict(by_path)
  # save() and load_student() round trip, also from safetensors alone
  student.save(str(tmp_path / "copy"))
  os.remove(tmp_path / "copy" / "student.npz")
  again = linvit_jax.load_student(str(tmp_path / "copy"))
  np.testing.assert_allclose(again.encode(by_path), student.encode(by_path), rtol=1e-6)


def test_load_student_imports_no_tensorflow(tiny_hf_conversion):
  _, workdir = tiny_hf_conversion
  code = (
      "import sys, numpy as np, linvit_jax\n"
      f"s = linvit_jax.load_student({str(workdir)!r})\n"
      "out = s.encode(np.zeros((2, 28, 28, 3), np.float32))\n"
      "assert out.shape == (2, 32), out.shape\n"
      "assert 'tensorflow' not in sys.modules, 'tensorflow imported'\n"
  )
  r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
  assert r.returncode == 0, r.stderr[-2000:]


def test_format_1_export_and_bad_folders(tiny_hf_conversion, tmp_path):
  student, workdir = tiny_hf_conversion
  old = tmp_path / "old"
  old.mkdir()
  (old / "student.npz").write_bytes((workdir / "student.npz").read_bytes())
  (old / "student_config.json").write_text(json.dumps(student.config["model"]))  # format 1
  x = np.zeros((1, 28, 28, 3), np.float32)
  np.testing.assert_allclose(linvit_jax.load_student(str(old)).encode(x), student.encode(x))
  with pytest.raises(export_format.ExportError, match="no student_config.json"):
    linvit_jax.load_student(str(tmp_path))
  with pytest.raises(linvit_jax.api.UserError, match="no shipped config"):
    linvit_jax.load_config("nope")
  with pytest.raises(ValueError, match="unknown config arg 'max_imgs'"):
    linvit_jax.load_config("demo", max_imgs=3)


def test_inference_pp_drops_augmentation_and_labels():
  pp = 'decode(1)|flip_lr|value_range(-1,1)|onehot(10,key="label",key_result="labels")|keep("image","labels")'
  assert pp_spec.inference_pp(pp) == 'decode(1)|value_range(-1,1)|keep("image")'


# ------------------------------------------------------------------------------------------------
# The model card (model_card.model_card), on tiny exports built in a second.


def _front_matter(card):
  import yaml

  assert card.startswith("---\n"), card[:200]
  return yaml.safe_load(card.split("\n---\n", 1)[0][4:])


def test_card_front_matter_licence_and_no_local_paths(tmp_path):
  from tests.helpers.student_export import make_export

  teachers = tmp_path / "my_teachers"
  teachers.mkdir()
  (teachers / "vit_teacher.json").write_text(
      json.dumps({"licence": "MIT (as declared by its package). Upstream weights: Apache-2.0."})
  )
  folder = make_export(tmp_path / "export", **{"teacher.init": str(teachers / "vit_teacher.npz")})
  card = (tmp_path / "export" / "README.md").read_text()
  meta = _front_matter(card)
  assert meta == {
      "license": "mit",
      "base_model": "vit_teacher",
      "library_name": "linvit_jax",
      "tags": ["vision", "vit", "linear-attention", "feature-extraction"],
      "pipeline_tag": "image-feature-extraction",
  }
  assert str(tmp_path) not in card and "my_teachers" not in card and "THIS_FOLDER" not in card
  assert "/tmp" not in card and ROOT not in card
  assert "MIT (as declared by its package)" in card  # the teacher's own words beside the id
  assert (
      "linear attention with the hedgehog feature map, centred keys and a depthwise convolution "
      "on values" in card
  )
  assert "kind, feature_map" not in card
  assert "## Limitations" in card and "attention distilled on its outputs" in card
  # the protocol of the numbers: which images, how many, at which resolution
  assert "held-out images of `fashion_mnist_local, split test`" in card and "16×16 px" in card
  cfg = json.loads((tmp_path / "export" / "student_config.json").read_text())
  assert cfg["teacher"]["init"] == "vit_teacher" and cfg["teacher"]["license"] == "mit"
  assert str(tmp_path) not in json.dumps(cfg)
  assert linvit_jax.load_student(folder).encode(np.zeros((1, 16, 16, 3), np.float32)).shape == (
      1,
      32,
  )


def test_card_licence_from_a_hugging_face_folder_or_other(tmp_path):
  import shutil

  hf = tmp_path / "dinov2"
  shutil.copytree(os.path.join(ROOT, "tests", "data", "foreign", "hf_dinov2"), hf)
  info = provenance.teacher_info(str(hf))
  assert info["name"] == "dinov2" and info["license"] is None
  conf = json.loads((hf / "config.json").read_text())
  (hf / "config.json").write_text(json.dumps({**conf, "_name_or_path": "facebook/dinov2-small"}))
  (hf / "README.md").write_text("---\nlicense: apache-2.0\ntags:\n- dino\n---\n# DINOv2\n")
  info = provenance.teacher_info(str(hf))
  assert info["name"] == "facebook/dinov2-small" and info["license"] == "apache-2.0"
  # nothing recorded: license other, and the card says the teacher's licence applies
  from tests.helpers.student_export import make_export

  make_export(tmp_path / "export", **{"teacher.init": str(tmp_path / "plain.npz")})
  card = (tmp_path / "export" / "README.md").read_text()
  assert _front_matter(card)["license"] == "other" and _front_matter(card)["base_model"] == "plain"
  assert "the teacher's licence applies" in card


def test_card_snippet_runs_in_the_export_folder(tmp_path):
  from tests.helpers.student_export import make_export

  folder = make_export(tmp_path / "export")
  card = (tmp_path / "export" / "README.md").read_text()
  snippet = card.split("```python\n", 1)[1].split("```", 1)[0]
  assert 'load_student(".")' in snippet
  env = {**os.environ, "PYTHONPATH": ROOT}
  r = subprocess.run(
      [sys.executable, "-c", snippet], cwd=folder, capture_output=True, text=True, env=env
  )
  assert r.returncode == 0, r.stderr[-2000:]
  assert "Student(" in r.stdout and "(1, 32)" in r.stdout


def test_card_of_a_surgery_only_export_and_knn_skipped(tmp_path):
  from tests.helpers.student_export import make_export

  why = "no labelled set: set eval.knn.dataset to measure it"
  resolution = [{"factor": 1, "image_size": 16}, {"factor": 2, "image_size": 32, "cls_cosine": 0.5}]
  make_export(
      tmp_path / "export", stages=(), results={"knn_skipped": why, "resolution": resolution}
  )
  card = (tmp_path / "export" / "README.md").read_text()
  assert "surgery only: attention not distilled" in card
  assert "attention distilled on its outputs" not in card
  assert f"k-NN: not measured ({why})" in card and "Nothing was measured" not in card
  assert "- at 32×32 px (up to 16 of those images" in card and "cls cosine 0.5000" in card
  cfg = json.loads((tmp_path / "export" / "student_config.json").read_text())
  assert cfg["fidelity"]["knn_skipped"] == why and cfg["recipe"]["stages"] == []


def test_attention_json_of_a_hybrid_with_and_without_pooled_keys():
  """What student_config.json records per layer: a plain softmax layer as the bare name, a pooled
  one with its key_grid; either parses back to the same specs."""
  from linvit_jax.models import attention as attn_lib
  from linvit_jax.models import vit

  linear = attn_lib.AttentionSpec(kind="linear", feature_map="hedgehog", conv_v=True)
  for softmax, recorded in (
      (attn_lib.AttentionSpec(kind="softmax"), "softmax"),
      (attn_lib.AttentionSpec(kind="softmax", key_grid=16), {"key_grid": 16}),
  ):
    model = vit.Model(num_classes=None, depth=2, attention=(softmax, linear))
    got = export_folder.attention_json(model)
    first = got[0] if recorded == "softmax" else {k: got[0][k] for k in recorded}
    assert first == recorded and got[1]["conv_v"] is True
    assert attn_lib.parse_layer_specs(got, 2) == (softmax, linear)


def test_card_of_a_classifier_and_a_hybrid():
  assert (
      model_card.describe_attention(["softmax", "hedgehog", "hedgehog"], 3)
      == "layer 0: softmax attention; layers 1–2: linear attention with the hedgehog feature map"
  )
  pooled = {"kind": "softmax", "key_grid": 16}
  assert model_card.describe_attention([pooled, "hedgehog", "hedgehog"], 3).startswith(
      "layer 0: softmax attention, its patch keys pooled to 16×16 blocks on wider grids; "
  )
  cfg = {
      "model": {"num_classes": 10, "depth": 3, "attention": ["softmax", "elu1", "elu1"]},
      "teacher": {"init": "/home/someone/teacher.npz"},
  }
  card = model_card.model_card(cfg)
  assert _front_matter(card)["pipeline_tag"] == "image-classification"
  assert "/home/someone" not in card and "`teacher.npz`" in card


def test_licence_ids_and_public_names():
  for text, lic in (
      ("MIT (as declared by its package)", "mit"),
      ("Apache 2.0", "apache-2.0"),
      ("CC-BY-NC-4.0", "cc-by-nc-4.0"),
      ("mit-like terms", None),
      ("proprietary", None),
  ):
    assert provenance.hub_license(text) == lic, text
  for name, public in (
      ("image_folder:/home/me/photos", "image_folder:photos"),
      ("facebook/dinov2-small", "facebook/dinov2-small"),
      ("gs://bucket/x/teacher.npz", "teacher.npz"),
      ("/abs/hf_dinov2/", "hf_dinov2"),
  ):
    assert provenance.public_name(name) == public, name


def test_card_on_test_photos(tmp_path):
  from tests.helpers.student_export import make_export

  ci = {"mean": 0.9, "lo": 0.85, "hi": 0.95, "worst": 0.8, "worst_photo": "private/a.jpg", "n": 3}
  dense = {
      "drop_in": {**ci, "mean": 0.7},
      "probe_student": {**ci, "mean": 0.6},
      "probe_teacher": {**ci, "mean": 0.8},
      "probe_ratio": 0.75,
  }
  rows = [
      {"size": 16, "view": "whole", "n": 3, "cls_cosine": ci, "patch_cosine": ci, "dense": dense},
      {"size": 64, "view": "crop", "n": 3, "patch_cosine": ci},
  ]
  test = {
      "n_test": 3,
      "n_val": 2,
      "dense_k": 8,
      "too_few": "test set: 3 photos (< 8)",
      "rows": rows,
      "crop_retrieval": {
          **dict(feature="cls token", size=16, crops_per_photo=8, n_photos=3, n_queries=24),
          **dict(area=[0.1, 0.5], aspect=[0.75, 4 / 3], retention=0.8, chance=1 / 3),
          "teacher_top1": {**ci, "mean": 0.75},
          "student_top1": {**ci, "mean": 0.6, "lo": 0.5, "hi": 0.7},
      },
  }
  make_export(tmp_path / "export", results={"test": test})
  card = (tmp_path / "export" / "README.md").read_text()
  assert "## On test photos" in card and "(3 test photos;" in card
  assert "Note: test set: 3 photos (< 8)." in card
  assert "| 16 px | whole | 3 | 0.900 [0.850, 0.950] | 0.900 [0.850, 0.950] (0.800) | 0.700" in card
  assert "| 0.600 / 0.800 |" in card and "| 64 px | crop | 3 | – |" in card
  assert "private" not in card  # photo names stay in results.json
  cfg = json.loads((tmp_path / "export" / "student_config.json").read_text())
  assert cfg["fidelity"]["test"]["rows"][0]["drop_in"] == [0.7, 0.85, 0.95]
  assert "private" not in json.dumps(cfg)
  assert (
      "top-1 by the cosine of each model's own cls token against the whole photos): student "
      "0.600 [0.500, 0.700], teacher 0.750, retention 0.800 (chance 0.333)." in card
  )
  assert cfg["fidelity"]["test"]["crop_retrieval"]["student_top1"] == [0.6, 0.5, 0.7]
  empty = model_card.model_card({"model": {}, "fidelity": {"test": {"n_test": 0, "rows": []}}})
  assert "No test photo was measured." in empty
  # Results from before crop retrieval: no line; too few photos: the reason.
  old = {k: v for k, v in test.items() if k != "crop_retrieval"}
  summary = export_folder.test_summary(old)
  assert "crop_retrieval" not in summary
  card = model_card.model_card({"model": {}, "fidelity": {"test": summary}})
  assert "| 64 px | crop |" in card and "Crop retrieval" not in card
  absent = {**old, "crop_retrieval": {"absent": "1 test photo: retrieval needs at least 2"}}
  card = model_card.model_card(
      {"model": {}, "fidelity": {"test": export_folder.test_summary(absent)}}
  )
  assert "Crop retrieval: not measured (1 test photo: retrieval needs at least 2)." in card
