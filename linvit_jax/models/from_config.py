"""Teacher and student models from a config's `model` block (and the architecture read from
`teacher.init` when the config asks for it)."""

from __future__ import annotations

import re
from typing import Any

import ml_collections as mlc

from linvit_jax import checkpoints
from linvit_jax import config_lib
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


# The pp fields whose `init_norm` op resolve_from_init replaces (and every stage's own pp_train).
_PP_FIELDS = (("data", "pp_train"), ("data", "pp_eval"), ("eval", "sample_pp"))


def _pp_fields(config: mlc.ConfigDict) -> list[tuple[str, str]]:
  stages = config_lib.stage_blocks(config)
  return [*_PP_FIELDS, *((name, "pp_train") for name in stages if "pp_train" in config[name])]


_INIT_NORM = re.compile(r"init_norm(\(\s*required\s*=\s*True\s*\))?")


def resolve_from_init(config: mlc.ConfigDict) -> mlc.ConfigDict:
  """config with what it asks to read from teacher.init filled in (a copy; config itself when it
  asks nothing): the model block with `teacher.architecture="init"` (vit_checkpoint.
  model_config_from_init, except `teacher.config_fields`), and each pp string's `init_norm` op."""
  if config.teacher.architecture not in ("config", "init"):
    raise ConfigError(
        f"config.teacher.architecture={config.teacher.architecture!r}: expected 'config' or 'init'"
    )
  pp_fields = _pp_fields(config)
  wants_norm = any(_INIT_NORM.search(config[b][f] or "") for b, f in pp_fields)
  if config.teacher.architecture == "config" and not wants_norm:
    return config
  if not config.teacher.init:
    what = "the pp op init_norm" if wants_norm else "teacher.architecture='init'"
    raise ConfigError(f"config: {what} needs config.teacher.init")
  resolved = config.copy_and_resolve_references()
  with resolved.unlocked():
    if config.teacher.architecture == "init":
      resolved.model = mlc.ConfigDict(_model_from_init(config))
      resolved.teacher.architecture = "config"  # resolved: config.json says what ran
    if wants_norm:
      source = vit_checkpoint.infer_vit_config(config.teacher.init).get("preprocessing")
      for block, field in pp_fields:
        resolved[block][field] = _INIT_NORM.sub(
            lambda m: _norm_op(source, bool(m.group(1)), config.teacher.init),
            config[block][field],
        )
  return resolved


def _model_from_init(config: mlc.ConfigDict) -> dict[str, Any]:
  model = vit_checkpoint.model_config_from_init(
      config.model.to_dict(), config.teacher.init, teacher_head_skipped(config)
  )
  for name in config.teacher.config_fields:
    if name not in model:
      raise ConfigError(f"config.teacher.config_fields: {name!r} is not a model field")
    if name == "pool_type" and model[name] in ("tok", "map") and model[name] != config.model[name]:
      raise ConfigError(
          f"config.model.pool_type={config.model.pool_type!r}: the checkpoint's pool type is "
          f"{model[name]!r} (it has a cls token / MAP head)"
      )
    model[name] = config.model[name]
  return model


def _norm_op(preprocessing: dict[str, Any] | None, required: bool, init: str) -> str:
  """The pp op normalising 0..255 pixels as the source declares (its mean/std on 0..1 pixels)."""
  if preprocessing is None:
    if required:
      raise ConfigError(
          f"init_norm(required=True) (norm=source): {init!r} does not say how its inputs are "
          "normalised"
      )
    return "vgg_value_range"  # ImageNet's mean/std
  mean = ", ".join(f"{255 * m:.6g}" for m in preprocessing["mean"])
  std = ", ".join(f"{255 * s:.6g}" for s in preprocessing["std"])
  return f"vgg_value_range(mean=({mean}), std=({std}))"
