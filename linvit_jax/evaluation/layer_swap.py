"""One layer's attention swapped between two models of the same depth, and what the swap does to
the final tokens: the intervention behind studies/compounding.py and behind a hybrid that puts
its softmax layers where they recover the most (student.softmax_pick="sensitivity").

A hybrid is a model whose per-layer attention specs differ (vit.layer_specs); swapping is a new
spec tuple and one attention subtree, no patching, so every swap is an ordinary jitted forward."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from linvit_jax.models import layout
from linvit_jax.models import probe
from linvit_jax.models import vit
from linvit_jax.runtime.errors import ConfigError


def swap_attention(
    model: Any, params: Mapping[str, Any], donor: Any, donor_params: Mapping[str, Any], layer: int
) -> tuple[Any, dict]:
  """(`model` whose layer `layer` attention is `donor`'s operator, params whose layer `layer`
  attention subtree is `donor_params`'): a hybrid through the model's per-layer attention specs;
  every other leaf is `params`' own (shared, not copied)."""
  for m, p in ((model, params), (donor, donor_params)):
    if m.scan or layout.is_scanned(p):
      raise ConfigError(
          "one layer's attention can only be swapped in a per-block (scan=False) model"
      )
  specs = list(vit.layer_specs(model))
  specs[layer] = vit.layer_specs(donor)[layer]
  name = layout.block_name(layer)
  out = dict(params)
  out["Transformer"] = dict(out["Transformer"])
  out["Transformer"][name] = {
      **out["Transformer"][name],
      layout.ATTN: donor_params["Transformer"][name][layout.ATTN],
  }
  return model.clone(attention=tuple(specs)), out


@functools.partial(jax.jit, static_argnums=(0,))
def final_tokens(model: Any, params: Any, images: jax.Array) -> dict[str, jax.Array]:
  """The final pooled feature ("cls", when the model pools) and patch tokens ("patch")."""
  _, out = model.apply({"params": params}, images, train=False)
  finals = {"patch": out["encoded"][:, model.num_prefix_tokens :]}
  if model.pool_type != "none":
    finals["cls"] = out["head_input"]
  return finals


@functools.partial(jax.jit, static_argnums=(0,))
def cosines_to(model: Any, params: Any, images: jax.Array, reference: dict) -> dict[str, jax.Array]:
  """Per image: the pooled feature's cosine and the patch tokens' mean cosine to `reference`
  (`final_tokens` of another model on the same images)."""
  finals = final_tokens(model, params, images)
  out = {"patch": jnp.mean(probe.cosine(finals["patch"], reference["patch"]), axis=1)}
  if "cls" in reference:
    out["cls"] = probe.cosine(finals["cls"], reference["cls"])
  return out


def swapped_cosines(
    model: Any,
    params: Any,
    donor: Any,
    donor_params: Any,
    images: jax.Array,
    reference: dict,
) -> list[dict[str, np.ndarray]]:
  """Per layer l, `cosines_to` `reference` of `model` with its layer l attention `donor`'s
  (`swap_attention`), acting on `model`'s own stream: with the student as model and the teacher
  as donor, the compounding study's "fix l"; the other way round, its "break l"."""
  return [
      jax.device_get(
          cosines_to(*swap_attention(model, params, donor, donor_params, l), images, reference)
      )
      for l in range(model.depth)
  ]


# The share of held-out images whose gains rank the layers under softmax_pick="sensitivity_worst":
# the quarter the student is furthest from its teacher on. A layer whose softmax matters on the
# few images the student gets most wrong (on cross-source photos, those with one small subject)
# can rank low on the mean over all of them, where most images are near 1 already.
WORST_SHARE = 0.25


def per_image_fix_gains(
    teacher: Any, teacher_params: Any, student: Any, student_params: Any, images: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
  """(baseline [B], gains [L, B]): per image, the student's cosine to the teacher's final tokens
  (the mean of cls and patch), and per layer l how much closer it gets with its layer l attention
  replaced by the teacher's (operator and params), acting on the student's own stream."""
  if student.depth != teacher.depth:
    raise ConfigError(f"student depth {student.depth} != teacher depth {teacher.depth}")
  images = jnp.asarray(images, jnp.float32)
  reference = final_tokens(teacher, teacher_params, images)

  per_image = lambda cos: np.mean([np.asarray(v) for v in cos.values()], axis=0)  # noqa: E731
  baseline = per_image(jax.device_get(cosines_to(student, student_params, images, reference)))
  fixed = swapped_cosines(student, student_params, teacher, teacher_params, images, reference)
  return baseline, np.stack([per_image(f) - baseline for f in fixed])


def fix_gains(
    teacher: Any,
    teacher_params: Any,
    student: Any,
    student_params: Any,
    images: np.ndarray,
    worst_share: float = 1.0,
) -> list[float]:
  """Per layer l: how much closer to the teacher's final tokens the student gets with its layer
  l attention replaced by the teacher's (operator and params), acting on the student's own
  stream: the cosine gain, averaged over cls / patch and over the images, or over the
  `worst_share` of them (at least one) where the student is furthest from its teacher. End to
  end, so a layer whose error grows through the stack scores high even when its teacher-forced
  cosine is good: what a hybrid should spend its softmax layers on."""
  if not 0 < worst_share <= 1:
    raise ConfigError(f"worst_share must be in (0, 1], got {worst_share}")
  baseline, gains = per_image_fix_gains(teacher, teacher_params, student, student_params, images)
  return mean_gains(baseline, gains, worst_share)


def mean_gains(baseline: np.ndarray, gains: np.ndarray, worst_share: float = 1.0) -> list[float]:
  """Per layer, `per_image_fix_gains`' gains [L, B] averaged over the `worst_share` of the images
  (at least one) of lowest `baseline` [B]; 1.0: over all of them."""
  keep = np.argsort(baseline, kind="stable")[: max(1, int(np.ceil(worst_share * len(baseline))))]
  return [float(g) for g in gains[:, keep].mean(axis=1)]


def most_sensitive(gains: list[float], k: int) -> list[int]:
  """The k layers of largest `fix_gains`, in layer order."""
  return sorted(int(l) for l in np.argsort(-np.asarray(gains), kind="stable")[:k])
