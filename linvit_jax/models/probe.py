"""Per-layer reads of a teacher and a student: what both the losses and the evaluation look at.

One teacher forward (no gradient) gives every layer's input and target, stacked on a leading layer
axis L (`teacher_targets`):

    attn_input [L,B,N,D]  the LayerNorm_0 output = each attention sublayer's input
    q, k       [L,B,N,H,Dh] post-projection queries/keys (for the routing loss)
    sa         [L,B,N,D]  each attention sublayer's output (after the out projection)
    +sa, +mlp  [L,B,N,D]  the residual stream after the attention / MLP sublayer of each block
    encoded    [B,N,D]    after encoder_norm;  pre_logits [B,D];  logits [B,C] (if a head)

Teacher forcing (`student_attention_outputs`) runs each student attention layer on the teacher's
own `attn_input`: distill.py trains on it, evaluate.py measures it. A "model" argument is a
`vit.Model(...)` instance or the config dict it was built from.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from linvit_jax.models import layout
from linvit_jax.models import vit
from linvit_jax.runtime import tree as tree_lib

Array = jax.Array
Params = Mapping[str, Any]
ModelLike = nn.Module | Mapping[str, Any]

EPS = 1e-12  # guards norms and variances in denominators (absolute: outputs can be tiny)


def as_model(model: ModelLike) -> nn.Module:
  """A vit model instance, or one built from its config dict / ConfigDict."""
  if isinstance(model, nn.Module):
    return model
  if not isinstance(model, Mapping) and not hasattr(model, "to_dict"):
    raise TypeError(f"expected a vit.Model or its config dict, got {type(model).__name__}")
  return vit.Model(**tree_lib.as_dict(model))


def f32(x: Array) -> Array:
  return jnp.asarray(x, jnp.float32)


def cosine(a: Array, b: Array, eps: float = EPS) -> Array:
  """Cosine of a and b along the last axis, in float32, the norm product guarded by eps."""
  a, b = f32(a), f32(b)
  return jnp.sum(a * b, -1) / jnp.maximum(
      jnp.linalg.norm(a, axis=-1) * jnp.linalg.norm(b, axis=-1), eps
  )


def sown_per_layer(intermediates: Mapping[str, Any]) -> dict[str, Array]:
  """What each encoder block sows, stacked on a leading layer axis L.

  `intermediates` is the 'intermediates' collection of one `model.apply(..., mutable=
  ["intermediates"])`, per-block or scanned. Returns attn_input [L,B,N,D] (each attention
  sublayer's input, the LayerNorm_0 output) and the post-projection q, k [L,B,N,H,Dh].
  """
  enc = intermediates["Transformer"]
  attn = layout.ATTN
  if layout.is_scanned(intermediates):  # nn.scan already stacked every sown value on the layer axis
    blk = enc[layout.SCANNED_BLOCK]
    return {"attn_input": blk["attn_input"][0], "q": blk[attn]["q"][0], "k": blk[attn]["k"][0]}
  blocks = [enc[name] for name in layout.block_names(intermediates)]
  return {
      "attn_input": jnp.stack([b["attn_input"][0] for b in blocks]),
      "q": jnp.stack([b[attn]["q"][0] for b in blocks]),
      "k": jnp.stack([b[attn]["k"][0] for b in blocks]),
  }


def intermediates(model: nn.Module, params: Any, images: Array) -> tuple[Any, dict, dict]:
  """(logits, out, per-block {attn_input, q, k}) of one forward pass."""
  (logits, out), state = model.apply({"params": params}, images, mutable=["intermediates"])
  sown = sown_per_layer(state["intermediates"])
  blocks = {
      layout.block_name(i): {k: v[i] for k, v in sown.items()}
      for i in range(sown["attn_input"].shape[0])
  }
  return logits, out, blocks


def teacher_targets(teacher_model: ModelLike, teacher_params: Params, images: Array) -> dict:
  """One teacher forward (eval mode, stop_gradient): every layer's input and targets.

  Returns a dict with attn_input, q, k, sa, +sa, +mlp stacked on a leading layer axis, and
  encoded, pre_logits, logits (when the model has a head); see the module docstring for shapes.
  """
  model = as_model(teacher_model)
  (logits, out), state = model.apply(
      {"params": teacher_params}, images, train=False, mutable=["intermediates"]
  )
  enc = [out["encoder"][f"block{l:02d}"] for l in range(model.depth)]
  targets = {
      **sown_per_layer(state["intermediates"]),  # attn_input, q, k
      "sa": jnp.stack([e["sa"] for e in enc]),
      "+sa": jnp.stack([e["+sa"] for e in enc]),
      "+mlp": jnp.stack([e["+mlp"] for e in enc]),
      "encoded": out["encoded"],
      "pre_logits": out["pre_logits"],
  }
  if model.num_classes:
    targets["logits"] = logits
  return jax.tree.map(jax.lax.stop_gradient, targets)


def student_attention_outputs(
    student_model: ModelLike,
    student_params: Params,
    attn_inputs: Array,
    *,
    rng: Array | None = None,
    with_qk: bool = False,
    with_phi: bool = False,
):
  """Teacher-forced student attention: layer l's attention applied to `attn_inputs[l]`.

  Args:
    student_model: the student vit model (or its config): gives each layer's AttentionSpec.
    student_params: the student's params (per-block or scanned).
    attn_inputs: [L,B,N,D], the teacher's attention inputs (`teacher_targets(...)["attn_input"]`).
    rng: only for FAVOR+ with redraw (one key per layer is folded in).
    with_qk: also return the student's q and k, each [L,B,N,H,Dh].
    with_phi: (with `with_qk`) also return per layer the (φ(q), φ(k)) the layer's linear operator
      used, each [B,N,H,F], or None for a softmax layer.

  Returns:
    outputs [L,B,N,D] (after the out projection), or (outputs, q, k) with `with_qk`, or
    (outputs, q, k, phis) with both.
  """
  model = as_model(student_model)
  specs = vit.layer_specs(model)
  depth = len(specs)
  if attn_inputs.shape[0] != depth:
    raise ValueError(f"attn_inputs has {attn_inputs.shape[0]} layers, the student has {depth}")

  def apply_one(spec, p, x, key):
    rngs = {"favor": key} if (spec.favor_redraw and key is not None) else None
    y, state = layout.attention_module(model, spec).apply(
        {"params": p}, x, rngs=rngs, mutable=["intermediates"]
    )
    inter = state["intermediates"]
    phi = (inter["phi_q"][0], inter["phi_k"][0]) if "phi_q" in inter else None
    return y, inter["q"][0], inter["k"][0], phi

  keys = None if rng is None else jax.random.split(rng, depth)
  if layout.is_scanned(student_params):
    if len(set(specs)) != 1:
      raise ValueError("a scanned student must use one attention operator in every layer")
    stacked = student_params["Transformer"][layout.SCANNED_BLOCK][layout.ATTN]
    if keys is None:
      ys, qs, ks, phi = jax.vmap(lambda p, x: apply_one(specs[0], p, x, None))(stacked, attn_inputs)
    else:
      ys, qs, ks, phi = jax.vmap(functools.partial(apply_one, specs[0]))(stacked, attn_inputs, keys)
    phis = [None if phi is None else (phi[0][l], phi[1][l]) for l in range(depth)]
  else:
    outs = [
        apply_one(
            specs[l],
            layout.block_params(student_params, l)[layout.ATTN],
            attn_inputs[l],
            None if keys is None else keys[l],
        )
        for l in range(depth)
    ]
    ys, qs, ks = (jnp.stack(t) for t in list(zip(*outs))[:3])
    phis = [o[3] for o in outs]
  if with_qk and with_phi:
    return ys, qs, ks, phis
  return (ys, qs, ks) if with_qk else ys


def output_metrics(student_out: Array, teacher_out: Array, eps: float = EPS) -> dict[str, Array]:
  """Per-layer nmse and cosine of [L, ..., D] outputs (float32).

  nmse_l   = mean((s_l - t_l)²) / (Var(t_l) + eps)       (Var over all of layer l's elements)
  cosine_l = mean over tokens of ⟨s, t⟩ / max(|s|·|t|, eps)
  """
  s, t = f32(student_out), f32(teacher_out)
  axes = tuple(range(1, s.ndim))
  mse = jnp.mean(jnp.square(s - t), axis=axes)
  nmse = mse / (jnp.var(t, axis=axes) + eps)
  cos = cosine(s, t, eps)
  return {"nmse": nmse, "cosine": jnp.mean(cos, axis=tuple(range(1, cos.ndim)))}
