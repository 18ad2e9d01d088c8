"""Data-dependent init of a fresh student attention: its out projection scaled to the teacher's.

An initialisation, not a loss: one batch, before any stage trains (run.py, on attention that was
not copied). Checkpoints with LayerScale folded into each out projection have small attention
outputs, and a standard init can be ~170x too large in variance there. Scaling out/kernel and
out/bias by α_l = sqrt(Var(teacher sa_l) / Var(student sa_l)) makes each layer's teacher-forced
output variance equal the teacher's on that batch (y = W z + b → α y has variance α² Var(y)).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from linvit_jax.models import layout
from linvit_jax.models import probe

Array = jax.Array
Params = Mapping[str, Any]
ModelLike = probe.ModelLike

EPS = probe.EPS  # guards both variances (absolute: attention outputs can be tiny)


def calibrate(
    teacher_model: Any,
    teacher_params: Params,
    student_model: Any,
    student_params: Params,
    images: Array,
) -> Params:
  """The student's params with each layer's out projection calibrated on `images` (one batch):
  the teacher's targets and `calibrate_out_projection`, as one compiled program."""
  return _calibrated(teacher_model, teacher_params, student_model, student_params, images)


# One compiled program (op by op, the teacher pass and the scales compiled op after op: ~2x the
# time); the models are static (hashable flax modules), so a second call reuses it.
@functools.partial(jax.jit, static_argnums=(0, 2))
def _calibrated(teacher_model, teacher_params, student_model, student_params, images):
  targets = probe.teacher_targets(teacher_model, teacher_params, images)
  return calibrate_out_projection(targets, student_model, student_params)


def out_projection_scales(
    targets: Mapping[str, Array],
    student_model: ModelLike,
    student_params: Params,
    *,
    rng: Array | None = None,
    eps: float = EPS,
) -> Array:
  """α_l = sqrt((Var(teacher sa_l) + eps) / (Var(student teacher-forced sa_l) + eps)), [L]."""
  ys = probe.student_attention_outputs(
      student_model, student_params, targets["attn_input"], rng=rng
  )
  axes = tuple(range(1, ys.ndim))
  return jnp.sqrt(
      (jnp.var(probe.f32(targets["sa"]), axis=axes) + eps)
      / (jnp.var(probe.f32(ys), axis=axes) + eps)
  )


def calibrate_out_projection(
    targets: Mapping[str, Array],
    student_model: ModelLike,
    student_params: Params,
    *,
    layers: Sequence[int] | None = None,
    rng: Array | None = None,
    eps: float = EPS,
) -> Params:
  """Rescale each layer's out/kernel and out/bias by α_l so the student's teacher-forced output
  variance equals the teacher's on this batch (`targets` = `probe.teacher_targets(...)` of one batch).

  y = W z + b → α y has variance α² Var(y), so this is exact for the batch. Use it on freshly
  initialised attention (copy_same / copy_none arms) before distilling; `layers` limits it to some
  layers. A zero-initialised out kernel cannot be calibrated (α stays finite but useless).
  Returns new params in the student's layout (inputs untouched).
  """
  alpha = out_projection_scales(targets, student_model, student_params, rng=rng, eps=eps)
  depth = alpha.shape[0]
  use = np.zeros(depth, bool)
  use[list(range(depth)) if layers is None else list(layers)] = True
  alpha = jnp.where(jnp.asarray(use), alpha, 1.0)

  def scale(x, a):
    return (probe.f32(x) * a).astype(x.dtype)

  params = dict(student_params)  # fresh containers along the edited paths; other leaves shared
  params["Transformer"] = dict(params["Transformer"])
  if layout.is_scanned(student_params):
    blk = dict(params["Transformer"][layout.SCANNED_BLOCK])
    att = dict(blk[layout.ATTN])
    out = att["out"]
    att["out"] = {
        "kernel": scale(out["kernel"], alpha[:, None, None, None]),
        "bias": scale(out["bias"], alpha[:, None]),
    }
    blk[layout.ATTN] = att
    params["Transformer"][layout.SCANNED_BLOCK] = blk
  else:
    for l in range(depth):
      if not use[l]:
        continue
      name = layout.block_name(l)
      blk = dict(params["Transformer"][name])
      att = dict(blk[layout.ATTN])
      att["out"] = {key: scale(v, alpha[l]) for key, v in att["out"].items()}
      blk[layout.ATTN] = att
      params["Transformer"][name] = blk
  return params
