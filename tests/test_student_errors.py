"""Every broken export folder or bad input ends in one line that names the file and the problem
(load_student, Student.encode), never a traceback from json, safetensors, numpy or flax."""

import json
import os
import shutil

import numpy as np
import pytest

import linvit_jax
from linvit_jax.artifacts import export_format
from linvit_jax.runtime.errors import UserError
from tests.helpers.student_export import make_export


@pytest.fixture(scope="module")
def good(tmp_path_factory):
  return make_export(tmp_path_factory.mktemp("good"))


def _copy(good, tmp_path, drop=()):
  out = tmp_path / "student"
  shutil.copytree(good, out)
  for name in drop:
    os.remove(out / name)
  return out


def _config(folder):
  return json.loads((folder / "student_config.json").read_text())


def _one_line(excinfo, *parts):
  text = str(excinfo.value)
  assert isinstance(excinfo.value, UserError) and "\n" not in text, text
  for part in parts:
    assert part in text, (part, text)


def test_invalid_json(good, tmp_path):
  folder = _copy(good, tmp_path)
  (folder / "student_config.json").write_text('{"format": 2, "model": {')
  with pytest.raises(export_format.ExportError) as e:
    linvit_jax.load_student(str(folder))
  _one_line(e, "student_config.json", "not valid JSON")


def test_json_that_is_a_list(good, tmp_path):
  folder = _copy(good, tmp_path)
  (folder / "student_config.json").write_text("[1, 2]")
  with pytest.raises(export_format.ExportError) as e:
    linvit_jax.load_student(str(folder))
  _one_line(e, "student_config.json", "expected a JSON object", "list")


def test_truncated_safetensors(good, tmp_path):
  folder = _copy(good, tmp_path, drop=("student.npz",))
  data = (folder / "student.safetensors").read_bytes()
  (folder / "student.safetensors").write_bytes(data[: len(data) // 2])
  with pytest.raises(export_format.ExportError) as e:
    linvit_jax.load_student(str(folder))
  _one_line(e, "student.safetensors", "cannot read it")


def test_corrupt_npz(good, tmp_path):
  folder = _copy(good, tmp_path)
  (folder / "student.npz").write_bytes(b"PK\x03\x04 not a zip at all")
  with pytest.raises(export_format.ExportError) as e:
    linvit_jax.load_student(str(folder))
  _one_line(e, "student.npz", "truncated or corrupt")


def _rename_width(model):
  model["widht"] = model.pop("width")


@pytest.mark.parametrize(
    "edit, fragments",
    [
        (
            lambda model: model.update(attention="hedgehgo"),
            ("student_config.json", "attention", "unknown attention kind 'hedgehgo'"),
        ),
        (
            _rename_width,
            ("student_config.json", "unknown model field 'widht'", "did you mean 'width'?"),
        ),
        (
            lambda model: model.update(width=16),
            ("student.npz' holds width 32, student_config.json says 16",),
        ),
        (
            lambda model: model.update(mlp_dim=48),
            ("student.npz", "does not match student_config.json", "MlpBlock"),
        ),
    ],
    ids=[
        "unknown_attention_kind",
        "unknown_model_field_suggests_the_nearest",
        "width_mismatch_is_one_short_line",
        "other_shape_mismatch_is_one_line",
    ],
)
def test_a_wrong_model_field_is_one_line(good, tmp_path, edit, fragments):
  folder = _copy(good, tmp_path)
  cfg = _config(folder)
  edit(cfg["model"])
  (folder / "student_config.json").write_text(json.dumps(cfg))
  with pytest.raises(export_format.ExportError) as e:
    linvit_jax.load_student(str(folder))
  _one_line(e, *fragments)
  assert len(str(e.value)) < 300  # short as well as one line


def test_missing_image_path(good, tmp_path):
  student = linvit_jax.load_student(good)
  with pytest.raises(UserError) as e:
    student.encode([str(tmp_path / "nope.jpg")])
  _one_line(e, "nope.jpg", "cannot read the image")


def test_non_image_file(good, tmp_path):
  student = linvit_jax.load_student(good)
  (tmp_path / "notes.jpg").write_text("not a photo")
  with pytest.raises(UserError) as e:
    student.encode([str(tmp_path / "notes.jpg")])
  _one_line(e, "notes.jpg", "not an image file")
  from PIL import Image

  Image.fromarray(np.full((40, 40, 3), 128, np.uint8)).save(tmp_path / "whole.png")
  (tmp_path / "cut.png").write_bytes((tmp_path / "whole.png").read_bytes()[:60])  # truncated
  with pytest.raises(UserError) as e:
    student.encode([str(tmp_path / "cut.png")])
  _one_line(e, "cut.png")


def test_inputs_that_are_not_images(good):
  student = linvit_jax.load_student(good)
  with pytest.raises(UserError) as e:
    student.encode([np.zeros((16, 16, 3), np.int64)])
  _one_line(e, "uint8")
  with pytest.raises(UserError) as e:
    student.encode(np.zeros((2, 16, 16, 5), np.float32))
  _one_line(e, "[B, H, W, 3]")
