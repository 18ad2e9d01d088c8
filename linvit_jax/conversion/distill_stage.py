"""The attention-distillation stage's loss: the losses of distill.py, weighted into one.

`distill_config` checks the `cfg.distill` ml_collections block (its fields and defaults are
config_lib.distill()'s) and `make_distill_loss` binds it and the models to `distill_loss`, the
loss called inside a jitted train step:

    loss_fn = make_distill_loss(teacher_model, student_model, config.distill)
    (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        student_params, teacher_params, batch, rng)

Metrics are flat dicts of scalars: loss, attn_nmse, attn_cosine, attn_nmse/layer_00, ...,
attn_cosine/layer_00, ..., routing, routing/layer_00, ..., lookahead, lookahead/layer_00, ...,
feature_nmse/<key>, feature_cosine/<key>, logit_kd.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from linvit_jax.configuration import config_lib
from linvit_jax.conversion import distill
from linvit_jax.models import probe
from linvit_jax.runtime import tree as tree_lib

Array = jax.Array
Params = Mapping[str, Any]
ModelLike = probe.ModelLike

# The `cfg.distill` fields and their defaults: the config's, read once.
_DEFAULTS = config_lib.distill()


def distill_config(cfg: Any = None, **overrides: Any) -> ml_collections.ConfigDict:
  """The `cfg.distill` block with every field (`cfg`: a whole config, the block itself, a dict or
  None; then `overrides`), checked: an unknown field, metric or routing_kind is an error."""
  if cfg is not None and (
      hasattr(cfg, "distill") or (isinstance(cfg, Mapping) and "distill" in cfg)
  ):
    cfg = cfg["distill"] if isinstance(cfg, Mapping) else cfg.distill
  given = {**tree_lib.as_dict(cfg), **overrides}
  unknown = sorted(set(given) - set(_DEFAULTS))
  if unknown:
    raise ValueError(f"unknown distill config field(s) {unknown}; known: {sorted(_DEFAULTS)}")
  block = ml_collections.ConfigDict({**_DEFAULTS, **given})
  if block.metric not in ("nmse", "cosine"):
    raise ValueError(f"distill.metric must be nmse or cosine, got {block.metric!r}")
  if block.routing_kind not in ("xent", "kl"):
    raise ValueError(f"distill.routing_kind must be xent or kl, got {block.routing_kind!r}")
  for field in ("teacher_dtype_mm", "student_dtype_mm"):
    if block[field] not in ("float32", "bfloat16"):
      raise ValueError(f"distill.{field} must be float32 or bfloat16, got {block[field]!r}")
  return block


def _feature_terms(
    student_out: Mapping[str, Array],
    targets: Mapping[str, Array],
    keys: Sequence[str],
    metrics: dict,
) -> Array:
  loss, m = distill.feature_alignment_loss(student_out, targets, keys=tuple(keys))
  metrics.update({f"feature_{k}": v for k, v in m.items()})
  return loss


def _at_matmul_dtypes(
    c: ml_collections.ConfigDict, student_model: ModelLike, teacher_model: ModelLike
) -> tuple[Any, Any]:
  """(student, teacher) as models, cloned to the block's matmul dtypes where those differ."""
  student, teacher = probe.as_model(student_model), probe.as_model(teacher_model)
  if c.teacher_dtype_mm != teacher.dtype_mm:  # the targets' forward only
    teacher = teacher.clone(dtype_mm=c.teacher_dtype_mm)
  if c.student_dtype_mm != student.dtype_mm:
    student = student.clone(dtype_mm=c.student_dtype_mm)
  return student, teacher


def _attention_terms(sa: Array, targets: Mapping[str, Array], metric: str, metrics: dict) -> Array:
  """The teacher-forced attention outputs' loss; their nmse and cosine (mean and per layer) go to
  `metrics` whichever `metric` trains."""
  m = probe.output_metrics(sa, targets["sa"])
  metrics["attn_nmse"] = jnp.mean(m["nmse"])
  metrics["attn_cosine"] = jnp.mean(m["cosine"])
  distill.layer_metrics(metrics, "attn_nmse", m["nmse"])
  distill.layer_metrics(metrics, "attn_cosine", m["cosine"])
  attn, _ = distill.attention_output_loss(sa, targets["sa"], metric)
  return attn


def _student_stream_terms(
    loss: Array,
    student: Any,
    student_params: Params,
    images: Array,
    targets: Mapping[str, Array],
    c: ml_collections.ConfigDict,
    metrics: dict,
) -> Array:
  """`loss` plus the terms read from the student's own forward (not teacher-forced): feature
  alignment and logit KD, each when its weight is nonzero."""
  logits, out = student.apply({"params": student_params}, images, train=False)
  if c.w_feature:
    loss += c.w_feature * _feature_terms(out, targets, c.feature_keys, metrics)
  if c.w_logit_kd:
    if "logits" not in targets or not student.num_classes:
      raise ValueError("w_logit_kd > 0 needs a classification head on teacher and student")
    metrics["logit_kd"] = distill.logit_kd_loss(logits, targets["logits"], c.kd_temperature)
    loss += c.w_logit_kd * metrics["logit_kd"]
  return loss


def distill_loss(
    student_params: Params,
    teacher_params: Params,
    batch: Mapping[str, Array],
    rng: Array | None,
    *,
    student_model: ModelLike,
    teacher_model: ModelLike,
    cfg: ml_collections.ConfigDict,
) -> tuple[Array, dict[str, Array]]:
  """The attention-distillation stage's loss (`cfg`: a `distill_config` block, as
  `make_distill_loss` binds it; zero weights cost nothing):

    w_attn·attention_output_loss + w_routing·routing + w_lookahead·lookahead
      + w_feature·feature_alignment (student's own stream) + w_logit_kd·logit_kd

  One teacher forward gives all targets; the attention terms are teacher-forced, so their gradient
  reaches only the student's attention params (feature/logit terms reach everything: use
  optim.trainable_mask to choose what trains). Returns (loss, flat dict of scalar metrics).
  """
  c = cfg  # checked and filled once, by distill_config (not at every trace)
  student, teacher = _at_matmul_dtypes(c, student_model, teacher_model)
  images = batch["image"]
  rng_route, rng_fmap = (None, None) if rng is None else tuple(jax.random.split(rng))
  targets = probe.teacher_targets(teacher, teacher_params, images)
  sa, q, k, phis = probe.student_attention_outputs(
      student, student_params, targets["attn_input"], rng=rng_fmap, with_qk=True, with_phi=True
  )
  metrics: dict[str, Array] = {}
  loss = c.w_attn * _attention_terms(sa, targets, c.metric, metrics)
  if c.w_routing:
    route, route_layers = distill.routing_losses(
        targets,
        q,
        k,
        student,
        student_params,
        rng_route,
        num_queries=c.routing_queries,
        temperature=c.routing_temperature,
        kind=c.routing_kind,
        student_phi=phis,
    )
    metrics["routing"] = route
    distill.layer_metrics(metrics, "routing", route_layers)
    loss += c.w_routing * route
  if c.w_lookahead:
    look, look_layers = distill.lookahead_loss(
        teacher, teacher_params, targets, sa, c.lookahead, c.metric
    )
    metrics["lookahead"] = look
    distill.layer_metrics(metrics, "lookahead", look_layers)
    loss += c.w_lookahead * look
  if c.w_feature or c.w_logit_kd:
    loss = _student_stream_terms(loss, student, student_params, images, targets, c, metrics)
  metrics["loss"] = loss
  return loss, metrics


def make_distill_loss(teacher_model: ModelLike, student_model: ModelLike, cfg: Any = None):
  """`loss_fn(student_params, teacher_params, batch, rng) -> (loss, metrics)`: `distill_loss`
  with the models and the `cfg.distill` block (`distill_config(cfg)`) bound: validated now, not
  at the first step."""
  return functools.partial(
      distill_loss,
      student_model=probe.as_model(student_model),
      teacher_model=probe.as_model(teacher_model),
      cfg=distill_config(cfg),
  )
