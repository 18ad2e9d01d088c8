"""Stage kinds → (pure loss function, trainable mask) for `train.run_stage`.

  train              labels only, every parameter (training a model from scratch, e.g. the teacher)
  distill_attention  teacher-forced attention-output matching (+ routing, lookahead, feature
                     losses per config.distill); only attention and feature-map parameters train
  finetune           labels + optional teacher-logit KD + optional end-to-end feature alignment;
                     every parameter trains. With w_label=0 it reads no label (headless teachers,
                     unlabelled data).
  align              label-free: the student's own (not teacher-forced) residual stream after every
                     block (w_blocks) and its final tokens (w_feature) matched to the teacher's,
                     plus the teacher-forced attention-output term (w_attn_tf) that keeps each
                     layer's own fidelity; `trainable` chooses the parameters ("all" by default,
                     or "attention", or a path regex)

Each kind's block has exactly the fields it reads (config_lib.stage_losses).

Every loss_fn has the runner's signature `loss_fn(params, frozen, batch, rng)`, where `frozen` is
the teacher's params (or None), so the step stays a pure function of explicit pytrees.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections as mlc

from linvit_jax.configuration import config_lib
from linvit_jax.conversion import distill
from linvit_jax.conversion import distill_stage
from linvit_jax.conversion import optim
from linvit_jax.models import probe
from linvit_jax.runtime import metrics as metrics_lib


def _label_loss(name: str) -> Callable[[jax.Array, jax.Array], jax.Array]:
  if name not in distill.LABEL_LOSSES:
    raise ValueError(f"unknown label_loss {name!r}; known: {sorted(distill.LABEL_LOSSES)}")
  return distill.LABEL_LOSSES[name]


class _Terms(NamedTuple):
  """A supervised stage's term weights (0: the term is off and costs nothing) and settings."""

  label: float
  logit_kd: float
  kd_temperature: float
  feature: float
  blocks: float
  blocks_top_weight: float  # checked by preflight (and by depth_weights)
  attn_tf: float
  structure: float

  @property
  def needs_teacher(self) -> bool:
    return bool(self.logit_kd or self.feature or self.blocks or self.attn_tf or self.structure)


def _supervised(
    stage_cfg: mlc.ConfigDict, config: mlc.ConfigDict, teacher_model, student_model, w_label: float
):
  """Labels (w_label), teacher logits (w_logit_kd), and the teacher's features: final tokens
  (w_feature), every block's output (w_blocks), teacher-forced attention outputs (w_attn_tf), the
  final patch tokens' deviations from their image's mean (w_structure).
  Terms with weight 0 cost nothing; with w_label=0 no label is read."""
  key = config.data.label_key
  w = _Terms(
      label=w_label,
      logit_kd=stage_cfg.w_logit_kd,
      kd_temperature=stage_cfg.kd_temperature,
      feature=stage_cfg.w_feature,
      blocks=stage_cfg.w_blocks,
      blocks_top_weight=stage_cfg.blocks_top_weight,
      attn_tf=stage_cfg.w_attn_tf,
      structure=stage_cfg.get("w_structure", 0.0),  # configs recorded before the field: off
  )
  label_loss = _label_loss(stage_cfg.label_loss) if w_label else None
  has_head = bool(student_model.num_classes)
  if w_label and not has_head:
    raise ValueError(
        "w_label > 0 needs a classification head (model.num_classes); set "
        "w_label=0 for a headless backbone"
    )
  if w.logit_kd and not has_head:
    raise ValueError("w_logit_kd > 0 needs a classification head (model.num_classes)")

  def loss_fn(params, frozen, batch, rng):
    images = batch["image"]
    logits, out = student_model.apply({"params": params}, images, train=True, rngs={"dropout": rng})
    metrics = {}
    loss = jnp.zeros((), jnp.float32)
    if w.label:
      if key not in batch:
        raise ValueError(
            f"w_label > 0 but the batch has no {key!r} (keys: {sorted(batch)}); "
            "set w_label=0 to train without labels"
        )
      metrics["label_loss"] = l = label_loss(logits, batch[key])
      loss = loss + w.label * l
      metrics["accuracy"] = jnp.mean(metrics_lib.top1_hits(logits, batch[key]))
    if w.needs_teacher:
      if frozen is None:
        raise ValueError(
            "w_logit_kd / w_feature / w_blocks / w_attn_tf / w_structure need a teacher "
            "(config.teacher.init)"
        )
      targets = _teacher_targets(teacher_model, frozen, images, per_layer=w.blocks or w.attn_tf)
      loss = _teacher_terms(loss, w, student_model, params, logits, out, targets, metrics)
    return loss, metrics

  return loss_fn


def _teacher_targets(teacher_model, frozen: Any, images: jax.Array, *, per_layer: bool) -> dict:
  """The teacher's outputs the terms read: with `per_layer`, one forward with the sown
  intermediates (probe.teacher_targets); else logits and final features only, nothing sown."""
  if per_layer:
    return probe.teacher_targets(teacher_model, frozen, images)
  t_logits, t_out = jax.lax.stop_gradient(teacher_model.apply({"params": frozen}, images))
  return {**t_out, "logits": t_logits}


def _teacher_terms(
    loss: jax.Array,
    w: _Terms,
    student_model,
    params: Any,
    logits: jax.Array,
    out: dict,
    targets: dict,
    metrics: dict,
) -> jax.Array:
  """`loss` plus the terms that read the teacher, each when its weight is nonzero; their metrics
  go to `metrics`."""
  if w.logit_kd:
    metrics["logit_kd"] = l = distill.logit_kd_loss(logits, targets["logits"], w.kd_temperature)
    loss = loss + w.logit_kd * l
  if w.feature:
    l, feat_metrics = distill.feature_alignment_loss(out, targets)
    metrics.update({f"feature/{k}": v for k, v in feat_metrics.items()})
    loss = loss + w.feature * l
  if w.structure:
    l, m = distill.token_structure_loss(
        out["encoded"], targets["encoded"], student_model.num_prefix_tokens
    )
    metrics.update(m)
    loss = loss + w.structure * l
  if w.blocks:
    l, block_metrics = distill.block_alignment_loss(out, targets, top_weight=w.blocks_top_weight)
    metrics.update(block_metrics)
    loss = loss + w.blocks * l
  if w.attn_tf:
    sa = probe.student_attention_outputs(student_model, params, targets["attn_input"])
    l, _ = distill.attention_output_loss(sa, targets["sa"], "nmse")
    metrics["attn_nmse"] = l
    loss = loss + w.attn_tf * l
  return loss


def build(
    kind: str,
    stage_cfg: mlc.ConfigDict,
    config: mlc.ConfigDict,
    teacher_model: Any,
    student_model: Any,
    student_params: Any,
) -> tuple[Callable, Any]:
  """The stage's loss function and trainable mask (None = every parameter)."""
  if kind in ("train", "finetune"):
    return _supervised(stage_cfg, config, teacher_model, student_model, stage_cfg.w_label), None
  if kind == "align":  # label-free
    return (
        _supervised(stage_cfg, config, teacher_model, student_model, w_label=0.0),
        optim.trainable_mask(student_params, stage_cfg.trainable),
    )
  if kind == "distill_attention":
    d = config.distill
    loss_fn = distill_stage.make_distill_loss(teacher_model, student_model, d)
    return loss_fn, optim.trainable_mask(student_params, stage_cfg.trainable)
  raise ValueError(f"unknown stage kind {kind!r}; known: {config_lib.STAGE_KINDS}")
