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
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections as mlc

from linvit_jax.configuration import config_lib
from linvit_jax.conversion import distill
from linvit_jax.conversion import optim
from linvit_jax.models import probe
from linvit_jax.runtime import metrics as metrics_lib


def _label_loss(name: str) -> Callable[[jax.Array, jax.Array], jax.Array]:
  if name not in distill.LABEL_LOSSES:
    raise ValueError(f"unknown label_loss {name!r}; known: {sorted(distill.LABEL_LOSSES)}")
  return distill.LABEL_LOSSES[name]


def _supervised(
    stage_cfg: mlc.ConfigDict, config: mlc.ConfigDict, teacher_model, student_model, w_label: float
):
  """Labels (w_label), teacher logits (w_logit_kd), and the teacher's features: final tokens
  (w_feature), every block's output (w_blocks), teacher-forced attention outputs (w_attn_tf), the
  final patch tokens' deviations from their image's mean (w_structure).
  Terms with weight 0 cost nothing; with w_label=0 no label is read."""
  key = config.data.label_key
  w_kd, w_feat = stage_cfg.w_logit_kd, stage_cfg.w_feature
  w_blocks, w_attn_tf = stage_cfg.w_blocks, stage_cfg.w_attn_tf
  top_weight = stage_cfg.blocks_top_weight  # checked by preflight (and by depth_weights)
  w_structure = stage_cfg.get("w_structure", 0.0)  # configs recorded before the field: off
  label_loss = _label_loss(stage_cfg.label_loss) if w_label else None
  kd_t = stage_cfg.kd_temperature
  needs_teacher = bool(w_kd or w_feat or w_blocks or w_attn_tf or w_structure)
  has_head = bool(student_model.num_classes)
  if w_label and not has_head:
    raise ValueError(
        "w_label > 0 needs a classification head (model.num_classes); set "
        "w_label=0 for a headless backbone"
    )
  if w_kd and not has_head:
    raise ValueError("w_logit_kd > 0 needs a classification head (model.num_classes)")

  def loss_fn(params, frozen, batch, rng):
    images = batch["image"]
    logits, out = student_model.apply({"params": params}, images, train=True, rngs={"dropout": rng})
    metrics = {}
    loss = jnp.zeros((), jnp.float32)
    if w_label:
      if key not in batch:
        raise ValueError(
            f"w_label > 0 but the batch has no {key!r} (keys: {sorted(batch)}); "
            "set w_label=0 to train without labels"
        )
      metrics["label_loss"] = l = label_loss(logits, batch[key])
      loss = loss + w_label * l
      metrics["accuracy"] = jnp.mean(metrics_lib.top1_hits(logits, batch[key]))
    if needs_teacher:
      if frozen is None:
        raise ValueError(
            "w_logit_kd / w_feature / w_blocks / w_attn_tf / w_structure need a teacher "
            "(config.teacher.init)"
        )
      if w_blocks or w_attn_tf:  # per-layer targets: one forward with the sown intermediates
        targets = probe.teacher_targets(teacher_model, frozen, images)
      else:  # logits and final features only: the plain forward, nothing sown
        t_logits, t_out = jax.lax.stop_gradient(teacher_model.apply({"params": frozen}, images))
        targets = {**t_out, "logits": t_logits}
      if w_kd:
        metrics["logit_kd"] = l = distill.logit_kd_loss(logits, targets["logits"], kd_t)
        loss = loss + w_kd * l
      if w_feat:
        l, feat_metrics = distill.feature_alignment_loss(out, targets)
        metrics.update({f"feature/{k}": v for k, v in feat_metrics.items()})
        loss = loss + w_feat * l
      if w_structure:
        l, m = distill.token_structure_loss(
            out["encoded"], targets["encoded"], student_model.num_prefix_tokens
        )
        metrics.update(m)
        loss = loss + w_structure * l
      if w_blocks:
        l, block_metrics = distill.block_alignment_loss(out, targets, top_weight=top_weight)
        metrics.update(block_metrics)
        loss = loss + w_blocks * l
      if w_attn_tf:
        sa = probe.student_attention_outputs(student_model, params, targets["attn_input"])
        l, _ = distill.attention_output_loss(sa, targets["sa"], "nmse")
        metrics["attn_nmse"] = l
        loss = loss + w_attn_tf * l
    return loss, metrics

  return loss_fn


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
    loss_fn = distill.make_distill_loss(teacher_model, student_model, d)
    return loss_fn, optim.trainable_mask(student_params, stage_cfg.trainable)
  raise ValueError(f"unknown stage kind {kind!r}; known: {config_lib.STAGE_KINDS}")
