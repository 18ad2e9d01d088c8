"""One benchmark case of bench_speed: an attention layer or a whole ViT with one operator, at one
image size, batch and mode (fwd | fwdbwd), traced, lowered and AOT-compiled, with its analytic
FLOPs and XLA's memory analysis.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp

from bench import common
from linvit_jax.models import attention as attn_lib
from linvit_jax.models import attention_ops
from linvit_jax.models import vit

OPERATORS = {
    "softmax": attn_lib.AttentionSpec(kind="softmax"),
    "chunked_softmax": attn_lib.AttentionSpec(kind="chunked_softmax"),
    "elu1": attn_lib.AttentionSpec(kind="linear", feature_map="elu1"),
    "relu": attn_lib.AttentionSpec(kind="linear", feature_map="relu"),
    "hedgehog": attn_lib.AttentionSpec(kind="linear", feature_map="hedgehog"),
    "favor": attn_lib.AttentionSpec(kind="linear", feature_map="favor"),
    # GPU only: softmax whose aggregation is cuDNN's fused flash attention (bf16).
    "cudnn": attn_lib.AttentionSpec(kind="softmax"),
}


@contextlib.contextmanager
def _cudnn_softmax(enabled: bool) -> Iterator[None]:
  """While tracing, softmax attention becomes cuDNN's fused kernel (bf16 in, bf16 out)."""
  if not enabled:
    yield
    return
  original = attention_ops.softmax_attention

  def cudnn(q, k, v):
    dt = q.dtype
    q, k, v = (x.astype(jnp.bfloat16) for x in (q, k, v))
    return jax.nn.dot_product_attention(q, k, v, implementation="cudnn").astype(dt)

  attention_ops.softmax_attention = cudnn
  try:
    yield
  finally:
    attention_ops.softmax_attention = original


@dataclasses.dataclass
class Case:
  lowered: Any  # traced and lowered, not yet compiled
  args: tuple
  flops: float  # analytic FLOPs of one call
  lower_s: float
  fn: Any = None  # the AOT-compiled executable, after compile()
  memory: dict[str, float] | None = None
  compile_s: float = 0.0

  def compile(self) -> Case:
    t0 = time.perf_counter()
    self.fn = self.lowered.compile()
    self.compile_s = self.lower_s + time.perf_counter() - t0
    self.memory = common.memory_stats(self.fn)
    self.lowered = None
    return self

  def __call__(self):
    return self.fn(*self.args)


def build(what: str, op: str, size: int, batch: int, mode: str, **kw: Any) -> Case:
  """Compiles one (what, operator, size, batch, mode) and counts its FLOPs; runs nothing."""
  return lower(what, op, size, batch, mode, **kw).compile()


def lower(
    what: str,
    op: str,
    size: int,
    batch: int,
    mode: str,
    *,
    variant: str = "S/16",
    dtype: str = "float32",
    seed: int = 0,
) -> Case:
  """Traces and lowers one case (serially: tracing is Python, and the cuDNN swap is global);
  `Case.compile()` may then run in a thread pool."""
  keys = jax.random.split(jax.random.PRNGKey(seed), 3)
  if what == "layer":
    fn, args, fwd_flops = _layer(OPERATORS[op], size, batch, mode, variant, dtype, keys)
  elif what == "vit":
    fn, args, fwd_flops = _vit(OPERATORS[op], size, batch, mode, variant, dtype, keys)
  else:
    raise ValueError(f"unknown benchmark target {what!r}; known: layer, vit")
  t0 = time.perf_counter()
  with _cudnn_softmax(op == "cudnn"):
    lowered = fn.lower(*args)
  flops = batch * fwd_flops * (1 if mode == "fwd" else 3)
  return Case(lowered, args, flops, time.perf_counter() - t0)


def _layer(spec, size: int, batch: int, mode: str, variant: str, dtype: str, keys) -> tuple:
  """(jitted fn, its args, forward FLOPs per example) of one attention layer with the ViT's
  token count at `size` px."""
  k_init, k_x, k_ct = keys
  dims = common.vit_dims(variant)
  n = common.tokens_for(size, dims["patch"])
  module = attn_lib.Attention(num_heads=dims["heads"], spec=spec, dtype_mm=dtype)
  x = jax.random.normal(k_x, (batch, n, dims["width"]), jnp.float32)
  params = jax.jit(module.init)(k_init, x)
  fwd_flops = common.attention_layer_flops(spec, n, dims["width"], dims["heads"])
  if mode == "fwd":
    return jax.jit(module.apply), (params, x), fwd_flops
  # A fixed random cotangent: a real backward (d params and d input), nothing XLA can fold.
  ct = jax.random.normal(k_ct, x.shape, jnp.float32)
  fn = jax.jit(lambda p, x, ct: jax.vjp(module.apply, p, x)[1](ct))
  return fn, (params, x, ct), fwd_flops


def _vit(spec, size: int, batch: int, mode: str, variant: str, dtype: str, keys) -> tuple:
  """(jitted fn, its args, forward FLOPs per image) of the whole ViT (scanned, saveable remat):
  its logits, or the value and gradient of a cross-entropy loss."""
  k_init, k_x, k_ct = keys
  model = vit.Model(
      1000,
      variant=variant,
      attention=spec,
      pool_type="tok",
      scan=True,
      remat_policy="everything_saveable",
      dtype_mm=dtype,
  )
  images = jax.random.normal(k_x, (batch, size, size, 3), jnp.float32)
  labels = jax.random.randint(k_ct, (batch,), 0, 1000)
  params = jax.jit(model.init)(k_init, images[:1])
  fwd_flops = common.vit_flops(spec, size, variant)
  if mode == "fwd":
    return jax.jit(lambda p, im: model.apply(p, im)[0]), (params, images), fwd_flops

  def loss(p, im, y):
    logits = model.apply(p, im)[0].astype(jnp.float32)
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], -1))

  return jax.jit(jax.value_and_grad(loss)), (params, images, labels), fwd_flops
