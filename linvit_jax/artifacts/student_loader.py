"""`load_student(folder)`: an export folder (a run's workdir, or a folder `save` wrote) read back
into a `Student`, each file opened once (student_config.json, then student.npz or, without it,
student.safetensors); every problem is one `ExportError` line naming the file."""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import re
from typing import Any

import jax
import numpy as np

from linvit_jax.artifacts import safetensors_file
from linvit_jax.artifacts.export_format import CONFIG_FILE
from linvit_jax.artifacts.export_format import NPZ_FILE
from linvit_jax.artifacts.export_format import SAFETENSORS_FILE
from linvit_jax.artifacts.export_format import ExportError
from linvit_jax.artifacts.export_format import model_fields
from linvit_jax.artifacts.student import Student
from linvit_jax.models import attention as attn_lib
from linvit_jax.models import checkpoints
from linvit_jax.models import vit
from linvit_jax.runtime import gfile
from linvit_jax.runtime.errors import UserError


def load_student(folder: str, image_size: Any = None, dtype: Any = None) -> Student:
  """The student exported into `folder` (a run's workdir, or an export made by `save`).

  `image_size`: the size (an int or (H, W), a multiple of the patch) raw images run at by
  default; None: the training size. `dtype` (e.g. jnp.bfloat16): params and compute in it."""
  cfg = _read_config(folder)
  fields = model_fields(cfg)
  if "preprocessing" not in cfg:  # format 1: model fields only
    cfg = {"format": 1, "model": fields, "preprocessing": None}
  model = _model(os.path.join(folder, CONFIG_FILE), fields)
  flat, source = _read_params(folder)
  params = _checked_params(model, checkpoints.unflatten(flat), source, cfg)
  return Student(
      model=model,
      params=jax.tree.map(np.asarray, params),
      config=cfg,
      folder=folder,
      image_size=image_size,
      dtype=dtype,
  )


def _read_config(folder: str) -> dict[str, Any]:
  path = os.path.join(folder, CONFIG_FILE)
  text = gfile.read_text(path)
  if text is None:
    raise ExportError(f"'{folder}': no {CONFIG_FILE} (not a linvit_jax export folder)")
  try:
    cfg = json.loads(text)
  except ValueError as e:
    raise ExportError(f"'{path}': not valid JSON ({e})") from None
  if not isinstance(cfg, dict):
    raise ExportError(
        f"'{path}': expected a JSON object (the student's config), got a {type(cfg).__name__}"
    )
  if not model_fields(cfg):
    # `{}` (or a config without its model) would otherwise be read as a default ViT and then be
    # reported as a mismatch with the params: say what is missing instead.
    raise ExportError(
        f"'{path}': holds no model fields (width, depth, ...): the file is empty or damaged; "
        "export the student again"
    )
  return cfg


def _model(path: str, fields: dict[str, Any]) -> Any:
  """vit.Model(**fields), each problem one line naming the config file."""
  known = {f.name for f in dataclasses.fields(vit._Model)} - {"parent", "name"} | {"variant"}
  unknown = sorted(set(fields) - known)
  if unknown:
    close = difflib.get_close_matches(unknown[0], sorted(known), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else f" (known: {', '.join(sorted(known))})"
    raise ExportError(f"'{path}': unknown model field {unknown[0]!r}{hint}")
  try:
    attn_lib.parse_layer_specs(fields.get("attention", "softmax"), int(fields.get("depth", 12)))
    return vit.Model(**fields)
  except (ValueError, TypeError) as e:
    what = "attention" if "attention" in str(e) or "feature map" in str(e) else "model"
    raise ExportError(f"'{path}': {what}: {str(e).splitlines()[0]}") from None


def _read_params(folder: str) -> tuple[dict[str, Any], str]:
  """('/'-joined name -> array, the file read): student.npz, else student.safetensors."""
  npz = os.path.join(folder, NPZ_FILE)
  st = os.path.join(folder, SAFETENSORS_FILE)
  if gfile.exists(npz):
    try:
      return checkpoints.flatten(checkpoints.load_npz(npz)), npz
    except UserError as e:  # load_npz's own message names the file and the problem
      raise ExportError(str(e).strip().splitlines()[0]) from None
    except Exception as e:  # noqa: BLE001  (zip, pickle and numpy errors: all mean unreadable)
      raise ExportError(f"'{npz}': cannot read it ({_first_line(e)})") from None
  if gfile.exists(st):
    try:
      return safetensors_file.read(st), st
    except Exception as e:  # noqa: BLE001  (safetensors raises its own SafetensorError)
      raise ExportError(
          f"'{st}': cannot read it, corrupt or truncated ({_first_line(e)})"
      ) from None
  raise ExportError(f"'{folder}': neither {NPZ_FILE} nor {SAFETENSORS_FILE}")


def _first_line(e: BaseException) -> str:
  text = str(e).strip().splitlines()
  return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def _checked_params(model: Any, stored: dict[str, Any], source: str, cfg: dict[str, Any]) -> Any:
  """`stored` checked against the model the config describes (names, shapes) at the stored
  position grid; a mismatch is one line naming `source` and the config file."""
  emb = np.shape(stored.get("embedding", {}).get("kernel", ()))
  if len(emb) != 4:
    raise ExportError(f"'{source}': no embedding/kernel [ph, pw, C, D] (not a ViT's params)")
  if emb[3] != model.width or tuple(emb[:2]) != tuple(model.patch_size):
    what, theirs, ours = (
        ("width", emb[3], model.width)
        if emb[3] != model.width
        else ("patch", list(emb[:2]), list(model.patch_size))
    )
    raise ExportError(
        f"'{source}' holds {what} {theirs}, {CONFIG_FILE} says {ours}: the two files are from "
        "different students"
    )
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), _probe(stored, emb, cfg))["params"]
  try:
    return checkpoints.merge_params(stored, shapes, source=source)
  except UserError as e:  # merge_params lists every problem on its own line: keep the first
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    first = lines[1] if len(lines) > 1 else re.sub(r"^checkpoint '[^']*': ", "", lines[0])
    more = f" (+{len(lines) - 2} more)" if len(lines) > 2 else ""
    raise ExportError(f"'{source}' does not match {CONFIG_FILE}: {first[:200]}{more}") from None


def _probe(stored: dict[str, Any], emb: tuple[int, ...], cfg: dict[str, Any]) -> np.ndarray:
  """An input whose patch grid is the stored position table's: the training grid when the
  config's input size fits the table, else a square grid of it."""
  has_table = "pos_embedding" in stored
  table = np.shape(stored["pos_embedding"])[1] if has_table else 0
  side = int(round(np.sqrt(table))) if has_table else 1
  grid = (cfg.get("preprocessing") or {}).get("image_size")
  if grid and has_table:
    gh, gw = grid[0] // emb[0], grid[1] // emb[1]
    if gh * gw == table:
      return np.zeros((1, gh * emb[0], gw * emb[1], emb[2]), np.float32)
  return np.zeros((1, side * emb[0], side * emb[1], emb[2]), np.float32)
