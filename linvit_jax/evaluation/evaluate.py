"""Evaluation: masked means over eval batches (top-1), k-NN, per-layer attention fidelity, end-to-end
fidelity, attention maps, speed and memory. Layers are read through `probe` (as the losses read
them); the summary and the plots are summary.py's and plots.py's.

Fidelity is measured teacher-forced: every student attention layer gets the teacher's own input at
that layer, and its output (after the out projection) is compared with the teacher's, so a layer's
number says how well *that* operator imitates softmax, not how errors compound downstream.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from linvit_jax.models import attention as attn_lib
from linvit_jax.models import attention_ops
from linvit_jax.models import layout
from linvit_jax.models import probe
from linvit_jax.models import vit
from linvit_jax.models import vit_checkpoint
from linvit_jax.runtime import metrics as metrics_lib
from linvit_jax.runtime import sharding as sharding_lib

Batch = Mapping[str, Any]


# ----------------------------------------------------------------------------- masked means


@functools.lru_cache(maxsize=32)
def _jitted_eval(eval_fn: Callable, mesh: jax.sharding.Mesh) -> Callable:
  def sums(params, batch):
    values = eval_fn(params, batch)
    mask = batch["_mask"].astype(jnp.float32)
    out = {}
    for k, v in values.items():
      if v.ndim != 1 or v.shape[0] != mask.shape[0]:
        raise ValueError(
            f"eval_fn output {k!r} must be per-example [{mask.shape[0]}], got shape " f"{v.shape}"
        )
      out[k] = jnp.sum(v.astype(jnp.float32) * mask)
    return out, jnp.sum(mask)

  return jax.jit(sums, out_shardings=sharding_lib.replicated(mesh))


def evaluate(
    params: Any,
    eval_fn: Callable[[Any, Batch], Mapping[str, jax.Array]],
    eval_iter: Iterable[Batch],
    mesh: jax.sharding.Mesh,
) -> dict[str, float]:
  """Means over the real examples of `eval_fn`'s per-example values, over the whole iterator.

  `eval_fn(params, batch) -> {name: [B] values}` (e.g. correct = argmax == label). Padding rows
  carry `batch["_mask"] == 0` and are excluded; `params` may be any pytree (pass the teacher
  alongside the student to compare them). Returns {name: mean, "num_examples": count}; every
  process gets the same numbers.
  """
  fn = _jitted_eval(eval_fn, mesh)
  totals: dict[str, float] = {}
  count = 0.0
  with jax.set_mesh(mesh):
    for local in eval_iter:
      local = dict(local)
      if "_mask" not in local:
        first = jax.tree.leaves(local)[0]
        local["_mask"] = np.ones((np.shape(first)[0],), np.bool_)
      sums, n = jax.device_get(fn(params, sharding_lib.make_global_batch(local, mesh)))
      for k, v in sums.items():
        totals[k] = totals.get(k, 0.0) + float(v)
      count += float(n)
  if count == 0:
    raise ValueError("evaluate: the eval iterator held no real examples (all masked or empty)")
  return {**{k: v / count for k, v in totals.items()}, "num_examples": int(count)}


# ----------------------------------------------------------------------------- accuracy


def make_predict_fn(model: nn.Module) -> Callable[[Any, jax.Array], jax.Array]:
  @jax.jit
  def predict(params, images):
    logits, _ = model.apply({"params": params}, images, train=False)
    return logits

  return predict


def correct_fn(model: nn.Module, label_key: str = "labels") -> Callable[[Any, Mapping], dict]:
  """`eval_fn` for `evaluate`: the model's per-example top-1 hits (`top1_hits`) as "top1"."""

  def fn(params, batch):
    logits, _ = model.apply({"params": params}, batch["image"], train=False)
    return {"top1": metrics_lib.top1_hits(logits, batch[label_key])}

  return fn


def top1(
    model: nn.Module,
    params: Any,
    batches: Iterable[Mapping[str, np.ndarray]],
    mesh: jax.sharding.Mesh | None = None,
    label_key: str = "labels",
) -> float:
  """Top-1 accuracy over padded eval batches (rows with `_mask` False are ignored), summed over
  every process's batches on the mesh."""
  mesh = mesh or sharding_lib.make_mesh([("data", -1)])
  return evaluate(params, correct_fn(model, label_key), batches, mesh)["top1"]


# ----------------------------------------------------------------------------- k-NN (downstream)


def pooled_features(
    model: nn.Module, params: Any, batches: Iterable[Mapping[str, np.ndarray]], label_key: str
) -> tuple[np.ndarray, np.ndarray]:
  """The model's pooled final feature (`head_input`: the cls token, MAP or mean pool) and the
  integer labels of every real (unmasked) example: ([N, D] float32, [N] int)."""
  fn = jax.jit(lambda p, x: model.apply({"params": p}, x, train=False)[1]["head_input"])
  feats, labels = [], []
  for batch in batches:
    keep = np.asarray(batch.get("_mask", np.ones(len(batch["image"]), bool)), bool)
    feats.append(np.asarray(fn(params, batch["image"]), np.float32)[keep])
    labels.append(np.asarray(batch[label_key])[keep])
  return np.concatenate(feats), np.concatenate(labels).astype(np.int64)


def row_cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """Cosine similarity of each row of a with the same row of b ([N, D] each → [N]), in float64."""
  a, b = a.astype(np.float64), b.astype(np.float64)
  norms = np.maximum(np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1), 1e-300)
  return np.sum(a * b, axis=-1) / norms


def knn_top1(
    train_feats: np.ndarray,
    train_labels: np.ndarray,
    test_feats: np.ndarray,
    test_labels: np.ndarray,
    k: int = 20,
    temperature: float = 0.07,
    chunk: int = 1024,
) -> float:
  """Weighted k-NN top-1, DINO's protocol: cosine similarity on L2-normalised features, the k
  nearest training features vote for their class with weight exp(similarity / temperature)."""
  if len(train_feats) < k:
    raise ValueError(f"k-NN with k={k} needs at least k training features, got {len(train_feats)}")
  num_classes = int(max(train_labels.max(), test_labels.max())) + 1

  def unit(x):
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)

  bank, hits = unit(train_feats.astype(np.float64)), 0
  for start in range(0, len(test_feats), chunk):
    sims = unit(test_feats[start : start + chunk].astype(np.float64)) @ bank.T
    top = np.argpartition(-sims, k - 1, axis=1)[:, :k]
    weights = np.exp(np.take_along_axis(sims, top, 1) / temperature)
    votes = np.zeros((len(sims), num_classes))
    np.add.at(votes, (np.arange(len(sims))[:, None], train_labels[top]), weights)
    hits += int(np.sum(votes.argmax(1) == test_labels[start : start + chunk]))
  return hits / len(test_feats)


# ----------------------------------------------------------------------------- internals of a model


@functools.partial(jax.jit, static_argnums=(0, 2))
def _attention_fidelity(teacher, teacher_params, student, student_params, images):
  targets = probe.teacher_targets(teacher, teacher_params, images)
  outputs = probe.student_attention_outputs(student, student_params, targets["attn_input"])
  return probe.output_metrics(outputs, targets["sa"])


def attention_fidelity(
    teacher: nn.Module,
    teacher_params: Any,
    student: nn.Module,
    student_params: Any,
    images: jax.Array,
) -> list[dict[str, float]]:
  """Per layer: normalised MSE (MSE / Var(teacher)) and mean token cosine, teacher-forced."""
  m = jax.device_get(
      _attention_fidelity(teacher, teacher_params, student, student_params, jnp.asarray(images))
  )
  return [
      {"layer": i, "nmse": float(m["nmse"][i]), "cosine": float(m["cosine"][i])}
      for i in range(len(m["nmse"]))
  ]


@functools.partial(jax.jit, static_argnums=(0, 2))
def _end_to_end(teacher, teacher_params, student, student_params, images):
  t_logits, t_out = teacher.apply({"params": teacher_params}, images)
  s_logits, s_out = student.apply({"params": student_params}, images)
  t_enc, s_enc = t_out["encoded"], s_out["encoded"]
  has_cls = teacher.pool_type == "tok"
  first_patch = teacher.num_prefix_tokens  # cls and registers are not patches
  tokens = probe.cosine(s_enc[:, first_patch:], t_enc[:, first_patch:])
  m = {
      "patch_cosine": jnp.mean(tokens),
      "patch_cosine_min_image": jnp.min(jnp.mean(tokens, axis=1)),
      "block_cosine": jnp.stack(
          [
              jnp.mean(probe.cosine(s_out["encoder"][k]["+mlp"], t_out["encoder"][k]["+mlp"]))
              for k in sorted(t_out["encoder"])
              if k.startswith("block")
          ]
      ),
  }
  if has_cls:
    cls = probe.cosine(s_enc[:, 0], t_enc[:, 0])
    m["cls_cosine"], m["cls_cosine_min_image"] = jnp.mean(cls), jnp.min(cls)
  if teacher.pool_type != "none":
    m["pre_logits_cosine"] = jnp.mean(probe.cosine(s_out["pre_logits"], t_out["pre_logits"]))
  if teacher.num_classes:
    m["top1_agreement"] = jnp.mean(jnp.argmax(s_logits, -1) == jnp.argmax(t_logits, -1))
  return m


def end_to_end_fidelity(
    teacher: nn.Module,
    teacher_params: Any,
    student: nn.Module,
    student_params: Any,
    images: jax.Array,
    batch_size: int = 32,
) -> dict[str, Any]:
  """How close the student's own forward pass (not teacher-forced) is to the teacher's.

  cls_cosine (pool 'tok'): mean cosine of the final cls token (after encoder_norm);
  patch_cosine: mean cosine of the final image tokens; *_min_image: the worst image's mean;
  pre_logits_cosine: the pooled representation; block_cosine: per block, the residual stream
  after the block; top1_agreement (with a head): argmax agreement of the logits. Needs no label.
  """
  images = np.asarray(images)
  parts = []
  for i in range(0, len(images), batch_size):
    chunk = images[i : i + batch_size]
    parts.append(
        (
            len(chunk),
            jax.device_get(
                _end_to_end(teacher, teacher_params, student, student_params, jnp.asarray(chunk))
            ),
        )
    )
  total = sum(n for n, _ in parts)
  out: dict[str, Any] = {}
  for key in parts[0][1]:
    values = [np.asarray(m[key], np.float64) for _, m in parts]
    if key.endswith("_min_image"):
      out[key] = float(min(np.min(v) for v in values))
    else:
      mean = sum(n * v for (n, _), v in zip(parts, values)) / total
      out[key] = mean.tolist() if np.ndim(mean) else float(mean)
  return out


def cls_attention_maps(model: nn.Module, params: Any, images: jax.Array) -> np.ndarray:
  """Attention of the first token (cls) to the image tokens, [layers, B, heads, h, w].

  Softmax layers give softmax(q·kᵀ/√d); linear layers their normalised φ(q)φ(k)ᵀ weights.
  """
  return np.asarray(_cls_attention_maps(model, params, jnp.asarray(images)))


@functools.partial(jax.jit, static_argnums=(0,))
def _cls_attention_maps(model, params, images):
  # One compiled program (op by op it compiled every einsum and feature map separately, ~10 s).
  _, out, blocks = probe.intermediates(model, params, images)
  p = vit_checkpoint.scan_to_pyloop(params)["Transformer"]
  _, h, w, _ = out["stem"].shape
  maps = []
  for name, spec in zip(layout.block_names(params), vit.layer_specs(model)):
    q, k = blocks[name]["q"][:, :1], blocks[name]["k"]
    if spec.kind == "linear" and not (spec.exact_prefix_rows and model.num_prefix_tokens):
      phi_q, phi_k = attn_lib.feature_maps_of(spec, q, k, p[name][layout.ATTN])
      weights = attention_ops.linear_weights(phi_q, phi_k, spec.eps)
    else:
      weights = attention_ops.softmax_weights(q, k)
    weights = weights[:, :, 0, -h * w :]  # drop the cls→cls entry when there is a cls token
    maps.append(weights.reshape(weights.shape[0], weights.shape[1], h, w))
  return jnp.stack(maps)


@functools.partial(jax.jit, static_argnums=(0,))
def _intermediates(model: nn.Module, params: Any, images: jax.Array) -> Any:
  """What an eval-mode forward sows; jitted once per model and shape (studies call it per
  batch)."""
  _, state = model.apply({"params": params}, images, train=False, mutable=["intermediates"])
  return state["intermediates"]


def exact_shares(model: nn.Module, params: Any, images: jax.Array) -> list[float | None]:
  """Per layer, the exact key set's (window, sinks) share of its hybrid rows' attention mass
  (mean over images, rows and heads); None for a layer without one. Near 1: the layer bypasses
  its linear branch (then it is a local softmax, not a linear operator, in effect)."""
  enc = _intermediates(model, params, jnp.asarray(images))["Transformer"]
  if layout.is_scanned(params):  # one spec in every layer, sown values stacked on the depth axis
    sown = enc[layout.SCANNED_BLOCK].get(layout.ATTN, {}).get("exact_share")
    depth = len(layout.block_names(params))
    return [None] * depth if sown is None else np.mean(np.asarray(sown[0]), axis=-1).tolist()
  out = []
  for name in layout.block_names(params):
    sown = enc.get(name, {}).get(layout.ATTN, {}).get("exact_share")
    out.append(None if sown is None else float(np.mean(np.asarray(sown[0]))))
  return out


# ----------------------------------------------------------------------------- speed & resolution


def median_seconds(fn: Callable[[], Any], repeats: int = 5) -> float:
  """The median wall time of `repeats` calls of `fn` (its result waited for), after one untimed
  call (the compile)."""
  jax.block_until_ready(fn())
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - t0)
  return float(np.median(times))


def images_per_second(model: nn.Module, params: Any, images: np.ndarray, repeats: int = 5) -> float:
  """Median forward throughput of a jitted apply (compile excluded)."""
  predict = make_predict_fn(model)
  return len(images) / median_seconds(lambda: predict(params, images), repeats)


def matmul_gflops(n: int = 1024, repeats: int = 5) -> float:
  """The machine's float32 matmul rate (GFLOP/s): the median of `repeats` timed n×n by n×n
  products on the default device, compile excluded. What a training step's GFLOP/s is read
  against (summary's step cost): the share of what this machine does best."""
  mm = jax.jit(jnp.matmul)
  a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32)
  b = jax.random.normal(jax.random.PRNGKey(1), (n, n), jnp.float32)
  return 2.0 * n**3 / median_seconds(lambda: mm(a, b), repeats) / 1e9


def forward_peak_bytes(model: nn.Module, params: Any, images: np.ndarray) -> float:
  """XLA's peak-memory estimate of the compiled forward (arguments + outputs + temporaries)."""
  fn = jax.jit(lambda p, x: model.apply({"params": p}, x, train=False)[0])
  stats = fn.lower(params, images).compile().memory_analysis()
  if stats is None:
    return float("nan")
  total = (
      stats.argument_size_in_bytes
      + stats.output_size_in_bytes
      + stats.temp_size_in_bytes
      - stats.alias_size_in_bytes
  )
  return float(max(getattr(stats, "peak_memory_in_bytes", 0) or 0, total))


def resample_for_resolution(params: Mapping[str, Any], new_grid: tuple[int, int]) -> dict:
  """Params with the learned position embedding resampled to a new token grid."""
  return vit_checkpoint.with_posemb_grid(params, new_grid)
