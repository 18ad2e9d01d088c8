"""A tiny exported student folder (random params, a real student_config.json and card), the
export tests' common input."""

from __future__ import annotations

import jax
import numpy as np

from linvit_jax.artifacts import export_folder
from linvit_jax.configuration import config_lib
from linvit_jax.models import vit
from tests.helpers.tiny_teacher import TINY

# tiny_teacher's architecture at patch 4 with one register (posemb: vit's default, "learn").
FIELDS = {
    **{k: v for k, v in TINY.items() if k != "posemb"},
    "patch_size": (4, 4),
    "reg_tokens": 1,
}
ATTENTION = {"kind": "linear", "feature_map": "hedgehog", "center_keys": True, "conv_v": True}
PP = 'decode|resize_small(18)|central_crop(16)|vgg_value_range|keep("image")'


def make_export(
    folder, *, fields=None, attention=ATTENTION, results=None, params=None, **config_fields
):
  """A 16-px export folder (random params, a real student_config and card); returns its path.
  config_fields: dotted config overrides, e.g. **{"teacher.init": path, "stages": ()}. params:
  the model's (default: its init here, op by op, which compiles every op of a window hybrid)."""
  fields = {**FIELDS, **(fields or {})}
  if params is None:
    model = vit.Model(**fields, attention=attention)
    params = model.init(jax.random.PRNGKey(0), np.zeros((1, 16, 16, 3), np.float32))["params"]
  # Non-zero cls/registers/posemb so that resampling and prefix tokens are visible in the outputs.
  params = jax.tree.map(np.asarray, params)
  params["cls"] = np.full_like(params["cls"], 0.5)
  c = config_lib.base_config()
  with c.unlocked():
    c.data.image_size, c.data.pp_eval = 16, PP
    for key, value in config_fields.items():
      block, _, name = key.rpartition(".")
      (c[block] if block else c)[name] = value
  results = results or {"end_to_end_after_finetune": {"cls_cosine": 0.95, "patch_cosine": 0.9}}
  cfg = export_folder.student_config(fields, attention, c, results)
  export_folder.save(str(folder), params, cfg)
  return str(folder)
