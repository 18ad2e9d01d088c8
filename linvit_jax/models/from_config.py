"""Teacher and student models from a config's `model` block (and the architecture read from
`teacher.init` when the config asks for it)."""

from __future__ import annotations

from typing import Any

import ml_collections as mlc

from linvit_jax import checkpoints
from linvit_jax import tree as tree_lib
from linvit_jax.errors import ConfigError
from linvit_jax.models import vit
from linvit_jax.models import vit_checkpoint


def model_kwargs(model_cfg: Any) -> dict[str, Any]:
  """vit.Model's keyword arguments from a `model` block (ConfigDict or dict)."""
  kw = tree_lib.as_dict(model_cfg)
  variant = kw.pop("variant") or None
  if variant:
    # A variant decides width/depth/mlp/heads/patch; explicit fields only override when asked
    # (base_config's small defaults must not shadow 'S/16').
    for k in ("width", "depth", "mlp_dim", "num_heads", "patch_size"):
      kw.pop(k, None)
    kw["variant"] = variant
  kw["patch_size"] = tuple(kw["patch_size"]) if "patch_size" in kw else None
  if kw["patch_size"] is None:
    kw.pop("patch_size")
  return kw


def build_models(model_cfg: Any, student_attention: Any) -> tuple[Any, Any]:
  """(teacher, student): the same ViT, softmax attention and `student_attention`."""
  kw = model_kwargs(model_cfg)
  return vit.Model(**kw, attention="softmax"), vit.Model(**kw, attention=student_attention)


def teacher_head_skipped(config: mlc.ConfigDict) -> bool:
  """Whether teacher.dont_load leaves the teacher's head out (a new head: no teacher logits)."""
  return bool(config.teacher.init) and checkpoints.dont_load_matcher(config.teacher.dont_load)(
      "head/kernel"
  )


def resolve_architecture(config: mlc.ConfigDict) -> mlc.ConfigDict:
  """With `teacher.architecture="init"`, a copy of config whose model block is read from the
  teacher checkpoint (vit_checkpoint.model_config_from_init); otherwise config itself."""
  if config.teacher.architecture == "config":
    return config
  if config.teacher.architecture != "init":
    raise ConfigError(
        f"config.teacher.architecture={config.teacher.architecture!r}: expected 'config' or 'init'"
    )
  if not config.teacher.init:
    raise ConfigError("config.teacher.architecture='init' needs config.teacher.init")
  model = vit_checkpoint.model_config_from_init(
      config.model.to_dict(), config.teacher.init, teacher_head_skipped(config)
  )
  resolved = config.copy_and_resolve_references()
  with resolved.unlocked():
    resolved.model = mlc.ConfigDict(model)
    resolved.teacher.architecture = "config"  # resolved: config.json says what ran
  return resolved
