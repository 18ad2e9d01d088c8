"""Shared test fixtures: the real big_vision checkpoint shipped in tests/data."""

import pytest

from tests.helpers import bv_checkpoint


@pytest.fixture(scope="session")
def bv_fixture():
  """(model_config, flat params, reference outputs) of the big_vision-made checkpoint."""
  return bv_checkpoint.load()
