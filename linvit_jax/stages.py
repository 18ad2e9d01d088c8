"""Stage kinds → (pure loss function, trainable mask) for `train.run_stage`.

  train              labels only, every parameter (training a model from scratch, e.g. the teacher)
  distill_attention  teacher-forced attention-output matching (+ routing, lookahead, feature
                     losses per config.distill); only attention and feature-map parameters train
  finetune           labels + optional teacher-logit KD + optional end-to-end feature alignment;
                     every parameter trains

Every loss_fn has the runner's signature `loss_fn(params, frozen, batch, rng)`, where `frozen` is
the teacher's params (or None), so the step stays a pure function of explicit pytrees.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections as mlc

from linvit_jax import distill

LABEL_LOSSES = {"softmax_xent": distill.softmax_xent, "sigmoid_xent": distill.sigmoid_xent}


def _label_loss(name: str) -> Callable[[jax.Array, jax.Array], jax.Array]:
  if name not in LABEL_LOSSES:
    raise ValueError(f"unknown label_loss {name!r}; known: {sorted(LABEL_LOSSES)}")
  return LABEL_LOSSES[name]


def _supervised(stage_cfg: mlc.ConfigDict, config: mlc.ConfigDict, teacher_model, student_model):
  label_loss = _label_loss(stage_cfg.label_loss)
  key = config.data.label_key
  w_label, w_kd, w_feat = stage_cfg.w_label, stage_cfg.w_logit_kd, stage_cfg.w_feature
  kd_t = stage_cfg.kd_temperature
  needs_teacher = w_kd > 0 or w_feat > 0

  def loss_fn(params, frozen, batch, rng):
    images = batch["image"]
    logits, out = student_model.apply({"params": params}, images, train=True,
                                      rngs={"dropout": rng})
    metrics = {}
    loss = jnp.zeros((), jnp.float32)
    if w_label:
      metrics["label_loss"] = l = label_loss(logits, batch[key])
      loss = loss + w_label * l
    if needs_teacher:
      if frozen is None:
        raise ValueError("w_logit_kd / w_feature need a teacher (config.teacher.init)")
      t_logits, t_out = teacher_model.apply({"params": frozen}, images)
      t_logits, t_out = jax.lax.stop_gradient((t_logits, t_out))
      if w_kd:
        metrics["logit_kd"] = l = distill.logit_kd_loss(logits, t_logits, kd_t)
        loss = loss + w_kd * l
      if w_feat:
        l, feat_metrics = distill.feature_alignment_loss(out, t_out)
        metrics.update({f"feature/{k}": v for k, v in feat_metrics.items()})
        loss = loss + w_feat * l
    metrics["accuracy"] = _accuracy(logits, batch[key])
    return loss, metrics

  return loss_fn


def _accuracy(logits: jax.Array, labels: jax.Array) -> jax.Array:
  pred = jnp.argmax(logits, -1)
  if labels.ndim == 2:
    return jnp.mean(jnp.take_along_axis(labels, pred[:, None], -1)[:, 0] > 0)
  return jnp.mean(pred == labels)


def build(kind: str, stage_cfg: mlc.ConfigDict, config: mlc.ConfigDict, teacher_model: Any,
          student_model: Any, student_params: Any) -> tuple[Callable, Any]:
  """The stage's loss function and trainable mask (None = every parameter)."""
  if kind in ("train", "finetune"):
    return _supervised(stage_cfg, config, teacher_model, student_model), None
  if kind == "distill_attention":
    d = config.distill
    loss_fn = distill.make_distill_loss(teacher_model, student_model, d)
    return loss_fn, distill.trainable_mask(student_params, "distill_attention")
  raise ValueError(f"unknown stage kind {kind!r}; known: train, distill_attention, finetune")


def calibrate(teacher_model, teacher_params, student_model, student_params, images) -> Any:
  """Data-dependent init of fresh attention (see distill.calibrate_out_projection)."""
  targets = distill.teacher_targets(teacher_model, teacher_params, images)
  return distill.calibrate_out_projection(targets, student_model, student_params)
