"""An exported student at any resolution, on every kind of input, in batch buckets
(linvit_jax/artifacts/student.py's Student), on a tiny export built here in a second."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import linvit_jax
from linvit_jax.artifacts import export_format
from linvit_jax.artifacts import model_card
from linvit_jax.data import sample_photos
from linvit_jax.models import posemb
from tests.helpers.student_export import make_export

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
  return make_export(tmp_path_factory.mktemp("student"))


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
  return sample_photos.write_sample_photos(str(tmp_path_factory.mktemp("photos")))


def test_runs_at_any_multiple_of_the_patch(folder, photos, tmp_path):
  student = linvit_jax.load_student(folder)
  assert student.image_size == student.training_size == (16, 16)
  assert student.encode(photos[:2]).shape == (2, 32)
  # 32 px: an 8x8 grid, the position table resampled by big_vision's rule (bilinear), the cls
  # and register tokens kept as they are
  tokens = student.tokens(photos[:2], image_size=32)
  assert tokens.shape == (2, 1 + 1 + 8 * 8, 32) and np.all(np.isfinite(tokens))
  pe = np.asarray(student.params["pos_embedding"])
  np.testing.assert_array_equal(
      np.asarray(student._params_at((32, 32))["pos_embedding"]),
      posemb.resample_posemb(pe, (1, 64, 32)),
  )
  # non-square sizes (not with a convolution on values: it needs a square grid), and a size
  # chosen at load time
  with pytest.raises(export_format.ExportError, match="conv_v.*needs a square patch grid"):
    student.encode(photos[:1], image_size=(24, 32))
  plain = linvit_jax.load_student(make_export(tmp_path, attention="hedgehog"))
  assert plain.encode(photos[:1], image_size=(24, 32)).shape == (1, 32)
  # a hybrid whose softmax layer pools its keys: a 6×8 grid would be pooled as if square
  hybrid = ["hedgehog", {"kind": "softmax", "key_grid": 2}]
  pooled = linvit_jax.load_student(make_export(tmp_path / "pooled", attention=hybrid))
  with pytest.raises(export_format.ExportError, match=r"pooled softmax keys \(key_grid\) needs"):
    pooled.encode(photos[:1], image_size=(24, 32))
  assert pooled.encode(photos[:1], image_size=32).shape == (1, 32)
  at_32 = linvit_jax.load_student(folder, image_size=32)
  assert at_32.image_size == (32, 32) and at_32.training_size == (16, 16)
  np.testing.assert_allclose(at_32.tokens(photos[:2]), tokens, rtol=1e-5, atol=1e-5)
  # raw images at 32 px are the photo resized and cropped at twice the sizes, not upsampled
  x = at_32.preprocess(photos[:1])
  assert x.shape == (1, 32, 32, 3)
  assert not np.allclose(
      x, np.asarray(jax.image.resize(student.preprocess(photos[:1]), x.shape, "bilinear"))
  )


def test_inputs_of_every_kind(folder, photos):
  student = linvit_jax.load_student(folder)
  from PIL import Image

  pixels = np.asarray(Image.open(photos[0]).convert("RGB"))
  with open(photos[0], "rb") as f:
    encoded = f.read()
  by_path = student.encode(photos[0])
  for same in (student.encode([pixels]), student.encode(pixels), student.encode([encoded])):
    np.testing.assert_allclose(same, by_path, rtol=1e-6)
  # a uint8 batch [B, H, W, C] is raw images; a float batch is preprocessed, its size decides
  np.testing.assert_allclose(student.encode(pixels[None]), by_path, rtol=1e-6)
  x = student.preprocess(photos[:3], image_size=24)
  ref = student.encode(x)
  assert ref.shape == (3, 32)
  np.testing.assert_allclose(student.encode(photos[:3], image_size=24), ref, rtol=1e-6)
  np.testing.assert_allclose(student.encode(x.astype(np.float64)), ref, rtol=1e-6)
  np.testing.assert_allclose(student.encode(jnp.asarray(x)), ref, rtol=1e-6)
  for bf16 in (x.astype(ml_dtypes.bfloat16), jnp.asarray(x, jnp.bfloat16)):
    out = student.encode(bf16)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, ref, atol=0.05 * np.abs(ref).max())


def test_bad_sizes_name_the_size_the_patch_and_the_nearest(folder, photos):
  student = linvit_jax.load_student(folder)
  with pytest.raises(export_format.ExportError, match=r"30 is not a positive multiple of the patch 4 "
                     r"\(nearest valid: 28 or 32\)"):  # fmt: skip
    student.encode(photos[:1], image_size=30)
  with pytest.raises(
      export_format.ExportError, match="18 is not a positive multiple of the patch 4"
  ):
    student.encode(np.zeros((1, 18, 16, 3), np.float32))
  with pytest.raises(export_format.ExportError, match="image size 30×30"):
    linvit_jax.load_student(folder, image_size=30)
  with pytest.raises(export_format.ExportError, match=r"preprocessed batch \[B, H, W, 3\]"):
    student.encode(np.zeros((16, 16, 3), np.float32))


def test_one_compile_per_bucket_and_padding_changes_nothing(folder, photos):
  student = linvit_jax.load_student(folder)
  three = student.encode(photos[:3])
  five = student.encode(photos[:5])
  assert student.traces == 1  # 3 and 5 images share the bucket of 8
  np.testing.assert_allclose(five[:3], three, rtol=1e-5, atol=1e-6)
  student.encode(photos[:2], image_size=24)
  assert student.traces == 2  # a new image size: a new shape
  # a long list in batches of 8 (buckets 8 and 8, then 8 for the last 5): the same numbers
  everything = student.encode(photos, batch_size=8)
  assert everything.shape == (len(photos), 32) and student.traces == 2
  np.testing.assert_allclose(everything[:5], five, rtol=1e-5, atol=1e-6)


def test_progress_only_for_long_lists(folder, photos, capsys):
  student = linvit_jax.load_student(folder)
  student.encode(photos[:4], batch_size=8)
  assert "encode" not in capsys.readouterr().err
  student.encode(photos[:12], batch_size=8)
  assert "encode" in capsys.readouterr().err


def test_empty_input_is_an_empty_array(folder):
  student = linvit_jax.load_student(folder)
  assert student.encode([]).shape == (0, 32)
  assert student.tokens([]).shape == (0, 1 + 1 + 16, 32)
  assert student.encode(np.zeros((0, 16, 16, 3), np.float32)).shape == (0, 32)
  assert student.traces == 0


def test_bfloat16(folder, photos):
  f32 = linvit_jax.load_student(folder).encode(photos[:4])
  student = linvit_jax.load_student(folder, dtype=jnp.bfloat16)
  assert {np.asarray(a).dtype for a in jax.tree.leaves(student.params)} == {np.dtype(jnp.bfloat16)}
  out = student.encode(photos[:4])
  assert out.dtype == np.float32
  cosine = np.sum(out * f32, -1) / np.linalg.norm(out, axis=-1) / np.linalg.norm(f32, axis=-1)
  assert cosine.min() > 0.99, cosine


def test_repr_is_short_and_says_what_it_is(folder):
  text = repr(linvit_jax.load_student(folder))
  assert len(text) < 400 and "\n" not in text, text
  for part in ("width 32", "depth 2", "hedgehog feature map", "centred keys", "16×16", "M params"):
    assert part in text, (part, text)


def test_load_and_encode_a_path_import_no_tensorflow(folder, photos):
  code = (
      "import sys, linvit_jax\n"
      f"s = linvit_jax.load_student({folder!r})\n"
      f"out = s.encode([{photos[0]!r}], image_size=24)\n"
      "assert out.shape == (1, 32), out.shape\n"
      "assert 'tensorflow' not in sys.modules, 'tensorflow imported'\n"
  )
  r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
  assert r.returncode == 0, r.stderr[-2000:]


def test_old_exports_still_load(folder, tmp_path):
  """Format 2 without this version's keys (teacher name, protocol), and format 1."""
  with open(os.path.join(folder, "student_config.json")) as f:
    cfg = json.load(f)
  x = np.random.RandomState(0).randn(2, 16, 16, 3).astype(np.float32)
  ref = linvit_jax.load_student(folder).encode(x)
  old = dict(cfg, teacher={"init": "/somewhere/teacher.npz", "attention": "softmax"})
  del old["fidelity"]["protocol"]
  for name, content in (("v2", old), ("v1", cfg["model"])):
    (tmp_path / name).mkdir()
    (tmp_path / name / "student.npz").write_bytes(
        open(os.path.join(folder, "student.npz"), "rb").read()
    )
    (tmp_path / name / "student_config.json").write_text(json.dumps(content))
    student = linvit_jax.load_student(str(tmp_path / name))
    np.testing.assert_allclose(student.encode(x), ref, rtol=1e-6)
  assert "/somewhere" not in model_card.model_card(old)
