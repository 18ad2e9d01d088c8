"""Shared test fixtures: the real big_vision checkpoint shipped in tests/data."""

import json
import os

import numpy as np
import pytest

DATA = os.path.join(os.path.dirname(__file__), "data")
FIXTURE = "vit_w192_d4_p16_i64_tok_learn"


@pytest.fixture(scope="session")
def bv_fixture():
  """(model_config, flat params, reference outputs) of the big_vision-made checkpoint."""
  with open(os.path.join(DATA, FIXTURE + ".json")) as f:
    meta = json.load(f)
  params = dict(np.load(os.path.join(DATA, FIXTURE + ".npz")))
  ref = dict(np.load(os.path.join(DATA, FIXTURE + ".ref.npz")))
  return meta, params, ref


def unflatten(flat):
  """'/'-joined names → nested dicts (the project's own checkpoint helper)."""
  from linvit_jax import checkpoints
  return checkpoints.unflatten(flat)
