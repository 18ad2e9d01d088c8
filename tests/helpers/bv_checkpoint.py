"""The real big_vision checkpoint shipped in tests/data (see its .json), for several test modules."""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")
FIXTURE = "vit_w192_d4_p16_i64_tok_learn"


def meta() -> dict[str, Any]:
  """The checkpoint's .json: how big_vision made it, its model_config among them."""
  with open(os.path.join(DATA, FIXTURE + ".json")) as f:
    return json.load(f)


def model_config() -> dict[str, Any]:
  """The checkpoint's big_vision ViT fields, patch_size a tuple as a config holds it."""
  config = meta()["model_config"]
  return dict(config, patch_size=tuple(config["patch_size"]))


def load() -> tuple[dict[str, Any], dict[str, np.ndarray], dict[str, np.ndarray]]:
  """(meta with the model_config, flat params, reference outputs) of the big_vision checkpoint."""
  params = dict(np.load(os.path.join(DATA, FIXTURE + ".npz")))
  ref = dict(np.load(os.path.join(DATA, FIXTURE + ".ref.npz")))
  return meta(), params, ref


def unflatten(flat: dict[str, Any]) -> dict[str, Any]:
  """'/'-joined names → nested dicts (the project's own checkpoint helper)."""
  from linvit_jax.models import checkpoints

  return checkpoints.unflatten(flat)
