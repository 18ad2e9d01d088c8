"""Distill the difference: losses that teach a linear-attention student its teacher's attention.

Everything here is a pure, jit-friendly function of params, arrays and a model. A "model" argument
is a `vit.Model(...)` instance or the config dict it was built from (`vit.Model(**cfg)`).

Every loss reads its teacher and student through `probe` (the per-layer reads that evaluation
shares): one teacher forward gives every layer's input and target (`probe.teacher_targets`: attn_input,
q, k, sa, +sa, +mlp stacked on a leading layer axis L, and encoded, pre_logits, logits), and
teacher forcing (`probe.student_attention_outputs`) runs each student attention layer on the
teacher's own `attn_input`, so all layers train in one pass and errors do not compound.

Losses (each a function below; formulas in their docstrings):
    attention_output_loss   per-layer MSE/Var(teacher) ("nmse") or 1 - cosine
    routing_loss            xent/KL between softmax(QKᵀ/(τ√d)) and φ(q)φ(k)ᵀ/Σ on s sampled queries
    lookahead_loss          the student's attention error pushed through k frozen teacher sublayers
    feature_alignment_loss  the student's own (not teacher-forced) encoded tokens / pre_logits
    logit_kd_loss           Hinton KD with temperature;  softmax_xent / sigmoid_xent for labels

The attention-distillation stage weights these into one loss (distill_stage.py); fine-tuning
combines `softmax_xent` / `sigmoid_xent`, `logit_kd_loss` and `feature_alignment_loss`
(stages.py).

Argument order is model before params throughout (as in `model.apply(params, ...)`).

Which parameters train: optim.trainable_mask(params, "distill_attention" | "finetune" | regex)
and optim.masked_optimizer(tx, mask) (frozen leaves get exactly zero updates and no state).

A freshly initialised student attention should first go through `calibrate.calibrate` (one batch;
an initialisation, so it lives in calibrate.py, not among the losses).

All losses are computed in float32; every variance and norm in a denominator is guarded by `eps`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from linvit_jax.configuration import config_lib
from linvit_jax.models import attention as attn_lib
from linvit_jax.models import attention_ops
from linvit_jax.models import layout
from linvit_jax.models import probe
from linvit_jax.models import vit

Array = jax.Array
Params = Mapping[str, Any]
ModelLike = probe.ModelLike

EPS = probe.EPS  # guards variances and norms in denominators (absolute: outputs can be tiny)
LOG_EPS = 1e-9  # guards log() of attention weights that a feature map can make exactly zero

# The `cfg.distill` fields and their defaults: the config's, read once.
_DEFAULTS = config_lib.distill()
FEATURE_KEYS = _DEFAULTS["feature_keys"]


def layer_metrics(metrics: dict, name: str, per_layer: Array) -> None:
  """Adds `per_layer`'s entries to `metrics` as "<name>/layer_00", "<name>/layer_01", ..."""
  for l in range(per_layer.shape[0]):
    metrics[f"{name}/layer_{l:02d}"] = per_layer[l]


# ------------------------------------------------------------------------------------------------
# Attention-output matching.


def attention_output_loss(
    student_out: Array | Sequence[Array],
    teacher_out: Array | Sequence[Array],
    metric: str = "nmse",
    eps: float = EPS,
) -> tuple[Array, Array]:
  """Teacher-forced attention-output matching, averaged over layers.

    metric="nmse":   loss_l = mean((s_l - t_l)²) / (Var(t_l) + eps)
    metric="cosine": loss_l = 1 - mean_tokens cos(s_l, t_l)

  Args: [L,B,N,D] stacked outputs (or per-layer lists) after the out projection.
  Returns: (mean over layers, per-layer losses [L]).
  """
  if metric not in ("nmse", "cosine"):
    raise ValueError(f"unknown attention-output metric {metric!r}; known: nmse, cosine")
  m = probe.output_metrics(
      jnp.stack(student_out) if isinstance(student_out, (list, tuple)) else student_out,
      jnp.stack(teacher_out) if isinstance(teacher_out, (list, tuple)) else teacher_out,
      eps,
  )
  per_layer = m["nmse"] if metric == "nmse" else 1.0 - m["cosine"]
  return jnp.mean(per_layer), per_layer


# ------------------------------------------------------------------------------------------------
# Routing: the attention weights themselves.


def _sample_queries(n: int, num_queries: int, rng: Array | None) -> Array | None:
  if not num_queries or num_queries >= n:
    return None
  if rng is None:
    raise ValueError(f"routing loss samples {num_queries} of {n} queries: it needs an rng")
  # The s largest of n uniform draws: a uniform subset without replacement, cheaper to compile
  # and run than jax.random.choice(replace=False) (which shuffles by repeated sorts).
  return jax.lax.top_k(jax.random.uniform(rng, (n,)), num_queries)[1]


def routing_loss(
    teacher_q: Array,
    teacher_k: Array,
    student_q: Array,
    student_k: Array,
    spec: attn_lib.AttentionSpec,
    fmap_params: Params | None = None,
    num_queries: int = _DEFAULTS["routing_queries"],
    rng: Array | None = None,
    temperature: float = 1.0,
    kind: str = "xent",
    student_phi: tuple[Array, Array] | None = None,
) -> Array:
  """Cross-entropy / KL from the teacher's attention probabilities to the student's weights.

    P = softmax(q_t k_tᵀ / (τ √d))                           teacher, [B,H,s,N]
    W = φ(q_s) φ(k_s)ᵀ / (Σ_keys φ(q_s) φ(k_s)ᵀ + ε_spec)     linear student (softmax(q_s k_sᵀ/√d)
                                                              for a softmax student)
    xent = -Σ_keys P log(W + 1e-9);   kl = Σ_keys P (log P - log(W + 1e-9))

  averaged over batch, heads and s query tokens sampled uniformly without replacement (the same
  for the whole batch), so the cost is O(N·s), not O(N²). Only q/k projections and feature maps
  get a gradient. One layer: q/k are [B,N,H,Dh]; `fmap_params` is the layer's attention subtree
  (or just its feature_map_q/feature_map_k entries). `student_phi`: the (φ(q), φ(k)) the
  student's forward already computed (sown by `Attention`); then φ is not recomputed from q/k.
  """
  if kind not in ("xent", "kl"):
    raise ValueError(f"unknown routing loss kind {kind!r}; known: xent, kl")
  teacher_q, teacher_k, student_q, student_k = map(
      jnp.asarray, (teacher_q, teacher_k, student_q, student_k)
  )
  idx = _sample_queries(teacher_q.shape[1], num_queries, rng)
  if idx is not None:
    teacher_q, student_q = teacher_q[:, idx], student_q[:, idx]
  p = attention_ops.softmax_weights(teacher_q, teacher_k, temperature)
  if spec.kind == "linear" and student_phi is not None:
    phi_q, phi_k = student_phi
    phi_q = phi_q if idx is None else phi_q[:, idx]
    w = attention_ops.linear_weights(phi_q, phi_k, spec.eps)
  elif spec.kind == "linear":
    phi_q, phi_k = attn_lib.feature_maps_of(spec, student_q, student_k, fmap_params)
    w = attention_ops.linear_weights(phi_q, phi_k, spec.eps)
  else:
    w = attention_ops.softmax_weights(student_q, student_k, 1.0)
  xent = -jnp.sum(p * jnp.log(w + LOG_EPS), axis=-1)
  if kind == "kl":
    xent = xent + jnp.sum(jax.scipy.special.xlogy(p, p), axis=-1)
  return jnp.mean(xent)


def routing_losses(
    targets: Mapping[str, Array],
    student_q: Array,
    student_k: Array,
    student_model: ModelLike,
    student_params: Params,
    rng: Array | None,
    *,
    num_queries: int = _DEFAULTS["routing_queries"],
    temperature: float = 1.0,
    kind: str = "xent",
    student_phi: Sequence[tuple[Array, Array] | None] | None = None,
) -> tuple[Array, Array]:
  """`routing_loss` for every layer (one query sample per layer). Returns (mean, per-layer [L]).
  `student_phi`: per layer the forward's (φ(q), φ(k)) or None (`student_attention_outputs`)."""
  specs = vit.layer_specs(probe.as_model(student_model))
  keys = [None] * len(specs) if rng is None else list(jax.random.split(rng, len(specs)))
  per_layer = jnp.stack(
      [
          routing_loss(
              targets["q"][l],
              targets["k"][l],
              student_q[l],
              student_k[l],
              spec,
              layout.block_params(student_params, l)[layout.ATTN],
              num_queries,
              keys[l],
              temperature,
              kind,
              None if student_phi is None else student_phi[l],
          )
          for l, spec in enumerate(specs)
      ]
  )
  return jnp.mean(per_layer), per_layer


# ------------------------------------------------------------------------------------------------
# Lookahead: how the attention error grows through the next frozen teacher sublayers.


def _teacher_sublayer(
    model: nn.Module, spec: attn_lib.AttentionSpec, bp: Params, kind: str, h: Array
) -> Array:
  """h + sublayer(LayerNorm(h)) for one pre-LN sublayer of a block (eval mode)."""
  if kind == "mlp":
    y = nn.LayerNorm().apply({"params": bp["LayerNorm_1"]}, h)
    return h + vit.MlpBlock(
        mlp_dim=model.mlp_dim, dtype_mm=model.dtype_mm, gelu_approximate=model.gelu_approximate
    ).apply({"params": bp["MlpBlock_0"]}, y, True)
  y = nn.LayerNorm().apply({"params": bp["LayerNorm_0"]}, h)
  return h + layout.attention_module(model, spec).apply({"params": bp[layout.ATTN]}, y)


def lookahead_loss(
    teacher_model: ModelLike,
    teacher_params: Params,
    targets: Mapping[str, Array],
    student_out: Array,
    k: int,
    metric: str = "nmse",
    eps: float = EPS,
) -> tuple[Array, Array]:
  """The student's attention output at layer l, pushed through the next k teacher sublayers.

  With x_l the teacher's block input and T_{l,k} the next k frozen teacher sublayers after
  attention l (MLP l, attention l+1, MLP l+1, …; fewer near the top of the network):

    h_t = x_l + sa_t(l),   h_s = x_l + sa_s(l)      (teacher-forced student output at layer l)
    Δ_t = T_{l,k}(h_t) − x_l,   Δ_s = T_{l,k}(h_s) − x_l
    nmse_l = mean((Δ_s − Δ_t)²) / (Var(Δ_t) + eps)          cosine_l = 1 − cos(Δ_s, Δ_t)

  i.e. the student is matched to the teacher's representation at depth l+k (the stored +mlp/+sa
  stream: T_{l,k}(h_t) is not recomputed), measured as the update the window adds to x_l. k = 0 is
  exactly plain matching (Δ = the attention outputs). Gradients reach only the student's
  attention (the teacher params are stop_gradient'ed). Costs about k/2 teacher blocks per layer.

  Returns: (mean over layers, per-layer [L]).
  """
  if metric not in ("nmse", "cosine"):
    raise ValueError(f"unknown lookahead metric {metric!r}; known: nmse, cosine")
  if k < 0:
    raise ValueError(f"lookahead depth must be >= 0, got {k}")
  model = probe.as_model(teacher_model)
  specs = vit.layer_specs(model)
  depth = len(specs)
  tparams = jax.lax.stop_gradient(teacher_params)
  sa_t, plus_sa, plus_mlp = targets["sa"], targets["+sa"], targets["+mlp"]
  per_layer = []
  for l in range(depth):
    if k == 0:
      d_s, d_t = student_out[l], sa_t[l]
    else:
      # x_l: the previous block's output; the first block's input by subtraction (≤ 1 ulp off).
      x_l = plus_mlp[l - 1] if l else plus_sa[0] - sa_t[0]
      h = plus_sa[l] + (student_out[l] - sa_t[l])
      j, kind, target = l, "mlp", plus_sa[l]
      for _ in range(min(k, 2 * (depth - 1 - l) + 1)):
        h = _teacher_sublayer(model, specs[j], layout.block_params(tparams, j), kind, h)
        if kind == "mlp":
          target, kind, j = plus_mlp[j], "attn", j + 1
        else:
          target, kind = plus_sa[j], "mlp"
      d_t = target - x_l
      d_s = d_t + (h - target)  # exact zero error when h == target
    m = probe.output_metrics(d_s[None], d_t[None], eps)
    per_layer.append(m["nmse"][0] if metric == "nmse" else 1.0 - m["cosine"][0])
  per_layer = jnp.stack(per_layer)
  return jnp.mean(per_layer), per_layer


# ------------------------------------------------------------------------------------------------
# End-to-end alignment, logits, labels.


def feature_alignment_loss(
    student_out: Array | Mapping[str, Array],
    teacher_out: Array | Mapping[str, Array],
    *,
    keys: Sequence[str] = FEATURE_KEYS,
    w_nmse: float = 1.0,
    w_cosine: float = 1.0,
    eps: float = EPS,
) -> tuple[Array, dict[str, Array]]:
  """Match the student's own (not teacher-forced) features to the frozen teacher's.

    loss = w_nmse · mean((s − t)²)/(Var(t) + eps) + w_cosine · (1 − mean cos(s, t))

  on encoded tokens [B,N,D] or pre_logits [B,D] (cosine over the last axis). Teacher-forced
  per-layer matching does not make the network match end to end (errors compound over depth);
  this loss trains on the compounded error, and needs no classification head.

  Arrays give (loss, {"nmse", "cosine"}). The models' `out` dicts give the mean loss over `keys`
  and metrics {"nmse/<key>", "cosine/<key>"}.
  """
  if isinstance(student_out, Mapping) or isinstance(teacher_out, Mapping):
    if not (isinstance(student_out, Mapping) and isinstance(teacher_out, Mapping)):
      raise TypeError("feature_alignment_loss: pass two arrays or two `out` dicts")
    losses, metrics = [], {}
    for key in keys:
      if key not in student_out or key not in teacher_out:
        raise ValueError(
            f"feature alignment on {key!r}: not an output of both models (student "
            f"has {sorted(student_out)}, teacher {sorted(teacher_out)})"
        )
      loss, m = feature_alignment_loss(
          student_out[key], teacher_out[key], w_nmse=w_nmse, w_cosine=w_cosine, eps=eps
      )
      metrics[f"nmse/{key}"], metrics[f"cosine/{key}"] = m["nmse"], m["cosine"]
      losses.append(loss)
    return jnp.mean(jnp.stack(losses)), metrics
  m = probe.output_metrics(probe.f32(student_out)[None], probe.f32(teacher_out)[None], eps)
  nmse, cos = m["nmse"][0], m["cosine"][0]
  return w_nmse * nmse + w_cosine * (1.0 - cos), {"nmse": nmse, "cosine": cos}


def token_structure_loss(
    student_tokens: Array, teacher_tokens: Array, prefix: int, eps: float = EPS
) -> tuple[Array, dict[str, Array]]:
  """1 − mean cosine of each patch token's deviation from its image's mean patch token, the
  student's [B,N,D] final tokens vs the teacher's (the first `prefix` tokens, cls and registers,
  left out).

  A real ViT's patch tokens share a large per-image component (the shared DINOv2-style ViT-S/14:
  the mean patch token is ~0.8 of a token's norm), so a final-token cosine of 0.91 can hide a
  cosine of 0.85 on what tells one patch from another: the parts a dense head reads. This term
  weighs that deviation alone. Returns (loss, {"structure_cosine"})."""
  s, t = probe.f32(student_tokens[:, prefix:]), probe.f32(teacher_tokens[:, prefix:])
  s = s - jnp.mean(s, axis=1, keepdims=True)
  t = t - jnp.mean(t, axis=1, keepdims=True)
  cos = jnp.mean(probe.cosine(s, t, eps))
  return 1.0 - cos, {"structure_cosine": cos}


def block_alignment_loss(
    student_out: Mapping[str, Any],
    targets: Mapping[str, Array],
    *,
    w_nmse: float = 1.0,
    w_cosine: float = 1.0,
    top_weight: float = 1.0,
    eps: float = EPS,
) -> tuple[Array, dict[str, Array]]:
  """Match the student's own residual stream after every block to the teacher's.

    loss = Σ_l ω_l [w_nmse · nmse_l + w_cosine · (1 − mean_tokens cos_l)]

  with ω_l a linear ramp over depth from 1 (first block) to `top_weight` (last), normalised to
  sum to 1 (top_weight=1: the plain mean). Weighting the top blocks up puts the gradient where the
  compounded error is largest and the final features are read.

  on `student_out["encoder"]["blockLL"]["+mlp"]` vs `targets["+mlp"][l]` ([B,N,D] each). Per-block
  targets give every layer a gradient signal from its own depth, not only through the final norm
  (ViT-AdaLA's blockwise alignment); the cosine term keeps the few high-norm tokens of real
  checkpoints (DINOv2's artifact tokens) from dominating the nmse. Returns (loss, metrics with
  the mean cosine and nmse and the per-block cosine).
  """
  depth = targets["+mlp"].shape[0]
  s = jnp.stack([student_out["encoder"][f"block{l:02d}"]["+mlp"] for l in range(depth)])
  m = probe.output_metrics(s, targets["+mlp"], eps)
  per_layer = w_nmse * m["nmse"] + w_cosine * (1.0 - m["cosine"])
  metrics = {"block_nmse": jnp.mean(m["nmse"]), "block_cosine": jnp.mean(m["cosine"])}
  layer_metrics(metrics, "block_cosine", m["cosine"])
  return jnp.sum(depth_weights(depth, top_weight) * per_layer), metrics


def depth_weights(depth: int, top_weight: float = 1.0) -> Array:
  """A linear ramp from 1 (first block) to `top_weight` (last), summing to 1."""
  if top_weight <= 0:
    raise ValueError(f"blocks_top_weight={top_weight}: must be > 0 (1 = every block alike)")
  ramp = jnp.linspace(1.0, top_weight, depth) if depth > 1 else jnp.ones((1,))
  return ramp / jnp.sum(ramp)


def logit_kd_loss(student_logits: Array, teacher_logits: Array, temperature: float = 1.0) -> Array:
  """Hinton KD: T² · mean_batch KL(softmax(t/T) ‖ softmax(s/T)); 0 iff the logits agree up to a
  per-example shift. The T² keeps gradient magnitudes comparable across temperatures."""
  t = probe.f32(teacher_logits) / temperature
  s = probe.f32(student_logits) / temperature
  p = jax.nn.softmax(t, axis=-1)
  kl = jnp.sum(p * (jax.nn.log_softmax(t, axis=-1) - jax.nn.log_softmax(s, axis=-1)), axis=-1)
  return temperature**2 * jnp.mean(kl)


def _dense_labels(logits: Array, labels: Array) -> Array:
  if labels.ndim == logits.ndim - 1 and jnp.issubdtype(labels.dtype, jnp.integer):
    return jax.nn.one_hot(labels, logits.shape[-1], dtype=jnp.float32)
  if labels.shape != logits.shape:
    raise ValueError(
        f"labels {labels.shape} do not fit logits {logits.shape}: expected one-hot/"
        "multi-hot of the same shape or integer class ids"
    )
  return probe.f32(labels)


def softmax_xent(logits: Array, labels: Array) -> Array:
  """mean_batch −Σ_c y_c log softmax(z)_c; labels one-hot/soft [B,C] (big_vision) or ids [B]."""
  y = _dense_labels(logits, labels)
  return jnp.mean(-jnp.sum(y * jax.nn.log_softmax(probe.f32(logits), axis=-1), axis=-1))


def sigmoid_xent(logits: Array, labels: Array) -> Array:
  """mean_batch −Σ_c [y_c log σ(z_c) + (1 − y_c) log σ(−z_c)]: multi-label (JFT-style) data."""
  y, z = _dense_labels(logits, labels), probe.f32(logits)
  return jnp.mean(-jnp.sum(y * jax.nn.log_sigmoid(z) + (1 - y) * jax.nn.log_sigmoid(-z), axis=-1))


LABEL_LOSSES = {"softmax_xent": softmax_xent, "sigmoid_xent": sigmoid_xent}
