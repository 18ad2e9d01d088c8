"""The export folder's format: its file names, the format number of student_config.json, that
file's model fields, and `ExportError` (a folder that cannot be read). Below the writer
(export_folder.py), the reader (student_loader.py) and a later run that starts from an exported
student (build.student_attention reads the attention it was exported with)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from linvit_jax.runtime import gfile
from linvit_jax.runtime.errors import UserError

CONFIG_FILE = "student_config.json"
NPZ_FILE = "student.npz"
SAFETENSORS_FILE = "student.safetensors"
CARD_FILE = "README.md"
FORMAT = 2


class ExportError(UserError, ValueError):
  """An export folder that cannot be read; the message names the folder and what is missing."""


def model_fields(student_config: Mapping[str, Any]) -> dict[str, Any]:
  """The `vit.Model` fields of a student_config.json (format 2's "model", or format 1 whole)."""
  if "model" in student_config and isinstance(student_config["model"], Mapping):
    return dict(student_config["model"])
  return dict(student_config)


def exported_model_fields(params_path: str) -> dict[str, Any] | None:
  """The model fields of the student_config.json beside `params_path` (an exported student's
  params file); None when there is none (params alone, e.g. a big_vision checkpoint)."""
  text = gfile.read_text(os.path.join(os.path.dirname(params_path), CONFIG_FILE))
  return None if text is None else model_fields(json.loads(text))
