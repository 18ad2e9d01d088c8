"""Configs whose one stage is what a test varies: the base config with a 2-step fine-tune alone."""

from __future__ import annotations

from typing import Any

import ml_collections as mlc

from linvit_jax.configuration import config_lib


def finetune_only(**stage_fields: Any) -> mlc.ConfigDict:
  """config_lib's base config that runs only a 2-step, batch-2, lr 1e-4 `finetune` stage with
  `stage_fields` (stage or optimizer fields, as config_lib.stage takes them)."""
  config = config_lib.base_config()
  config.finetune = config_lib.stage("finetune", steps=2, batch_size=2, lr=1e-4, **stage_fields)
  config.stages = ("finetune",)
  return config
