"""Export and reload of a student (linvit_jax/export.py) and the Python API (linvit_jax.convert,
linvit_jax.load_student), on the tiny Hugging Face conversion shared with test_import_weights."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import linvit_jax
from linvit_jax import checkpoints
from linvit_jax import export
from linvit_jax.data import pp_spec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_export_folder_carries_what_a_user_needs(tiny_hf_conversion):
  _, workdir = tiny_hf_conversion
  for name in ("student.npz", "student.safetensors", "student_config.json", "README.md"):
    assert (workdir / name).exists(), name
  cfg = json.loads((workdir / "student_config.json").read_text())
  assert cfg["format"] == 2 and cfg["model"]["attention"]["feature_map"] == "hedgehog_exp"
  assert cfg["model"]["attention"]["conv_v"] and cfg["model"]["attention"]["center_keys"]
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
  with pytest.raises(export.ExportError, match="no head"):
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
  with pytest.raises(export.ExportError, match="no student_config.json"):
    linvit_jax.load_student(str(tmp_path))
  with pytest.raises(linvit_jax.api.UserError, match="no shipped config"):
    linvit_jax.load_config("nope")
  with pytest.raises(ValueError, match="unknown config arg 'max_imgs'"):
    linvit_jax.load_config("demo", max_imgs=3)


def test_inference_pp_drops_augmentation_and_labels():
  pp = 'decode(1)|flip_lr|value_range(-1,1)|onehot(10,key="label",key_result="labels")|keep("image","labels")'
  assert pp_spec.inference_pp(pp) == 'decode(1)|value_range(-1,1)|keep("image")'
