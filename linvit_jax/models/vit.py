"""A ViT that is a drop-in for big_vision's `big_vision.models.vit.Model`, with pluggable attention.

Same constructor arguments, parameter names and shapes, and the same `(logits, out)` return with
the same `out` keys as big_vision, so big_vision checkpoints load unchanged. Two additions:

* `attention`: the operator, for the whole model or per layer (see `attention.parse_spec`):
  "softmax" (the teacher), "chunked_softmax", or a linear map such as "elu1" / "linear:hedgehog" /
  {"kind": "linear", "feature_map": "favor", "num_features": 128}.
* `gelu_approximate`: big_vision uses flax's tanh-approximated GELU (the default, True);
  DINOv2-style checkpoints were trained with the exact erf GELU.
* `layernorm_epsilon` (flax's and big_vision's 1e-6; Hugging Face ViT/DeiT use 1e-12) and
  `reg_tokens`: learned prefix tokens (`reg`, [1, R, D]) placed after the cls token and before the
  patches, without position embedding: DINOv2's registers, or DeiT's distillation token (whose
  position embedding is folded into it). Models without them are big_vision's exactly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from linvit_jax.models import attention as attn_lib
from linvit_jax.models import layout
from linvit_jax.models import posemb
from linvit_jax.models import vit_checkpoint
from linvit_jax.models.variants import decode_variant


def posemb_sincos_2d(
    h: int, w: int, width: int, temperature: float = 10_000.0, dtype=jnp.float32
) -> jax.Array:
  """Fixed 2D sin-cos position embedding (MoCo v3), [1, h·w, width]."""
  y, x = jnp.mgrid[:h, :w]
  if width % 4:
    raise ValueError(f"width must be a multiple of 4 for sincos2d posemb, got {width}")
  omega = jnp.arange(width // 4) / (width // 4 - 1)
  omega = 1.0 / (temperature**omega)
  y = jnp.einsum("m,d->md", y.flatten(), omega)
  x = jnp.einsum("m,d->md", x.flatten(), omega)
  pe = jnp.concatenate([jnp.sin(x), jnp.cos(x), jnp.sin(y), jnp.cos(y)], axis=1)
  return jnp.asarray(pe, dtype)[None, :, :]


def resample_posemb_in_graph(
    pe: jax.Array, old_grid: tuple[int, int], new_grid: tuple[int, int]
) -> jax.Array:
  """`posemb.resample_posemb`'s bilinear rule as two fixed matrices (differentiable, so
  the stored table trains at any resolution); equal to it within float32 rounding."""
  (oh, ow), (nh, nw) = old_grid, new_grid
  grid = jnp.reshape(pe.astype(jnp.float32), (oh, ow, -1))
  rows, cols = posemb.zoom_matrix(oh, nh), posemb.zoom_matrix(ow, nw)
  grid = jnp.einsum("ih,jw,hwc->ijc", rows, cols, grid, precision=jax.lax.Precision.HIGHEST)
  return jnp.reshape(grid, (1, nh * nw, -1)).astype(pe.dtype)


class MlpBlock(nn.Module):
  """Transformer MLP: Dense → GELU → Dropout → Dense."""

  mlp_dim: int | None = None  # defaults to 4x the input width
  dropout: float = 0.0
  dtype_mm: str = "float32"
  gelu_approximate: bool = True

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool = True) -> jax.Array:
    inits = dict(
        kernel_init=nn.initializers.xavier_uniform(), bias_init=nn.initializers.normal(stddev=1e-6)
    )
    d = x.shape[-1]
    x = nn.Dense(self.mlp_dim or 4 * d, dtype=self.dtype_mm, **inits)(x)
    x = nn.gelu(x, approximate=self.gelu_approximate)
    x = nn.Dropout(rate=self.dropout)(x, deterministic)
    return nn.Dense(d, dtype=self.dtype_mm, **inits)(x)


class Encoder1DBlock(nn.Module):
  """Pre-LN transformer block; `out` holds sa, +sa, mlp, +mlp like big_vision."""

  mlp_dim: int | None = None
  num_heads: int = 12
  dropout: float = 0.0
  dtype_mm: str = "float32"
  attention: attn_lib.AttentionSpec = attn_lib.AttentionSpec()
  gelu_approximate: bool = True
  layernorm_epsilon: float = 1e-6
  num_prefix_tokens: int = 0

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool = True):
    out = {}
    y = nn.LayerNorm(epsilon=self.layernorm_epsilon, name="LayerNorm_0")(x)
    # Teacher forcing feeds each student attention layer the teacher's own LayerNorm output.
    self.sow("intermediates", "attn_input", y)
    y = out["sa"] = attn_lib.Attention(
        num_heads=self.num_heads,
        spec=self.attention,
        dtype_mm=self.dtype_mm,
        num_prefix_tokens=self.num_prefix_tokens,
        name=layout.ATTN,
    )(y)
    y = nn.Dropout(rate=self.dropout)(y, deterministic)
    x = out["+sa"] = x + y

    y = nn.LayerNorm(epsilon=self.layernorm_epsilon, name="LayerNorm_1")(x)
    y = out["mlp"] = MlpBlock(
        mlp_dim=self.mlp_dim,
        dropout=self.dropout,
        dtype_mm=self.dtype_mm,
        gelu_approximate=self.gelu_approximate,
        name="MlpBlock_0",
    )(y, deterministic)
    y = nn.Dropout(rate=self.dropout)(y, deterministic)
    x = out["+mlp"] = x + y
    return x, out


class Encoder(nn.Module):
  """Stack of blocks (python loop, or nn.scan with remat) followed by `encoder_norm`."""

  depth: int
  mlp_dim: int | None = None
  num_heads: int = 12
  dropout: float = 0.0
  scan: bool = False
  remat_policy: str = "nothing_saveable"
  dtype_mm: str = "float32"
  attention: tuple[attn_lib.AttentionSpec, ...] = ()
  gelu_approximate: bool = True
  layernorm_epsilon: float = 1e-6
  num_prefix_tokens: int = 0

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool = True):
    out = {}
    specs = self.attention or (attn_lib.AttentionSpec(),) * self.depth
    common = dict(
        dtype_mm=self.dtype_mm,
        mlp_dim=self.mlp_dim,
        num_heads=self.num_heads,
        dropout=self.dropout,
        gelu_approximate=self.gelu_approximate,
        layernorm_epsilon=self.layernorm_epsilon,
        num_prefix_tokens=self.num_prefix_tokens,
    )
    if self.scan:
      if len(set(specs)) != 1:
        raise ValueError(
            "scan=True needs the same attention operator in every layer; "
            f"got {sorted(set(s.kind + ':' + s.feature_map for s in specs))}"
        )
      block = nn.remat(
          Encoder1DBlock,
          prevent_cse=False,
          static_argnums=(2,),
          policy=getattr(jax.checkpoint_policies, self.remat_policy, None),
      )
      x, scan_out = nn.scan(
          block,
          variable_axes={"params": 0, "intermediates": 0},
          split_rngs={"params": True, "dropout": True, "favor": True},
          in_axes=nn.broadcast,
          length=self.depth,
      )(name=layout.SCANNED_BLOCK, attention=specs[0], **common)(x, deterministic)
      for lyr in range(self.depth):
        out[f"block{lyr:02d}"] = jax.tree.map(lambda o, l=lyr: o[l], scan_out)
    else:
      for lyr in range(self.depth):
        block = Encoder1DBlock(name=layout.block_name(lyr), attention=specs[lyr], **common)
        x, out[f"block{lyr:02d}"] = block(x, deterministic)
    out["pre_ln"] = x  # alias for the last block's output, without the number in it
    return nn.LayerNorm(epsilon=self.layernorm_epsilon, name="encoder_norm")(x), out


class MAPHead(nn.Module):
  """Multihead attention pooling with a learned probe (always softmax: one query is O(N))."""

  mlp_dim: int | None = None
  num_heads: int = 12
  gelu_approximate: bool = True
  layernorm_epsilon: float = 1e-6

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    n, _, d = x.shape
    probe = self.param("probe", nn.initializers.xavier_uniform(), (1, 1, d), x.dtype)
    probe = jnp.tile(probe, [n, 1, 1])
    x = attn_lib.Attention(num_heads=self.num_heads, name=layout.ATTN)(probe, x)
    y = nn.LayerNorm(epsilon=self.layernorm_epsilon, name="LayerNorm_0")(x)
    x = x + MlpBlock(
        mlp_dim=self.mlp_dim, gelu_approximate=self.gelu_approximate, name="MlpBlock_0"
    )(y)
    return x[:, 0]


class _Model(nn.Module):
  """ViT model (big_vision's fields, plus `attention`, `gelu_approximate`, `layernorm_epsilon`
  and `reg_tokens`)."""

  num_classes: int | None = None
  patch_size: Sequence[int] = (16, 16)
  width: int = 768
  depth: int = 12
  mlp_dim: int | None = None
  num_heads: int = 12
  posemb: str = "learn"  # or "sincos2d"
  rep_size: int | bool = False
  dropout: float = 0.0
  pool_type: str = "gap"  # or "map", "tok", "0", "none"
  head_zeroinit: bool = True
  scan: bool = False
  remat_policy: str = "nothing_saveable"
  dtype_mm: str = "float32"
  attention: Any = "softmax"
  gelu_approximate: bool = True
  layernorm_epsilon: float = 1e-6
  reg_tokens: int = 0
  # The grid (h, w) the learned position table is stored at, when the input's grid may differ:
  # the table is resampled inside the forward (the rule of `posemb.resample_posemb`), so
  # one set of params trains and runs at any resolution. None: the table is the input's grid.
  posemb_grid: tuple[int, int] | None = None

  @property
  def num_prefix_tokens(self) -> int:
    """Tokens before the patches in `out["encoded"]`: the cls token, then the registers."""
    return int(self.pool_type == "tok") + self.reg_tokens

  @nn.compact
  def __call__(self, image: jax.Array, *, train: bool = False):
    """(logits or pooled features, out): big_vision's `out` keys. One forward pass read top to
    bottom in big_vision's own order (stem, posemb, prefix tokens, encoder, pooling, pre-logits,
    head), kept comparable with its Model.__call__ line for line, hence its length."""
    out = {}
    image = jnp.asarray(image, self.dtype_mm)
    x = out["stem"] = nn.Conv(
        self.width,
        tuple(self.patch_size),
        strides=tuple(self.patch_size),
        padding="VALID",
        name="embedding",
        dtype=self.dtype_mm,
    )(image)
    n, h, w, c = x.shape
    x = jnp.reshape(x, [n, h * w, c])

    # Position embedding is added before the cls token is prepended (big_vision's convention).
    if self.posemb == "learn":
      gh, gw = self.posemb_grid or (h, w)
      pe = self.param(
          "pos_embedding", nn.initializers.normal(stddev=1 / np.sqrt(c)), (1, gh * gw, c), x.dtype
      )
      if (gh, gw) != (h, w):
        pe = resample_posemb_in_graph(pe, (gh, gw), (h, w))
    elif self.posemb == "sincos2d":
      pe = posemb_sincos_2d(h, w, c, dtype=x.dtype)
    else:
      raise ValueError(f"unknown posemb type {self.posemb!r}; known: learn, sincos2d")
    x = out["with_posemb"] = x + pe

    if self.reg_tokens:
      reg = self.param("reg", nn.initializers.zeros, (1, self.reg_tokens, c), x.dtype)
      x = jnp.concatenate([jnp.tile(reg, [n, 1, 1]), x], axis=1)
    if self.pool_type == "tok":
      cls = self.param("cls", nn.initializers.zeros, (1, 1, c), x.dtype)
      x = jnp.concatenate([jnp.tile(cls, [n, 1, 1]), x], axis=1)

    x = nn.Dropout(rate=self.dropout)(x, not train)
    x, out["encoder"] = Encoder(
        depth=self.depth,
        mlp_dim=self.mlp_dim,
        num_heads=self.num_heads,
        dropout=self.dropout,
        scan=self.scan,
        remat_policy=self.remat_policy,
        dtype_mm=self.dtype_mm,
        attention=attn_lib.parse_layer_specs(self.attention, self.depth),
        gelu_approximate=self.gelu_approximate,
        layernorm_epsilon=self.layernorm_epsilon,
        num_prefix_tokens=self.num_prefix_tokens,
        name="Transformer",
    )(x, deterministic=not train)
    encoded = out["encoded"] = x
    # Pooling and the 2d map see the patches only (timm's rule for prefix tokens), cls aside.
    patches = encoded[:, self.num_prefix_tokens :]

    if self.pool_type == "map":
      x = out["head_input"] = MAPHead(
          num_heads=self.num_heads,
          mlp_dim=self.mlp_dim,
          gelu_approximate=self.gelu_approximate,
          layernorm_epsilon=self.layernorm_epsilon,
      )(x)
    elif self.pool_type == "gap":
      x = out["head_input"] = jnp.mean(patches, axis=1)
    elif self.pool_type == "0":
      x = out["head_input"] = x[:, 0]
    elif self.pool_type == "tok":
      x = out["head_input"] = x[:, 0]
    elif self.pool_type != "none":
      raise ValueError(f"unknown pool_type {self.pool_type!r}; known: gap, map, tok, 0, none")
    encoded = patches

    x_2d = jnp.reshape(encoded, [n, h, w, -1])
    if self.rep_size:
      rep_size = self.width if self.rep_size is True else self.rep_size
      hid = nn.Dense(rep_size, name="pre_logits")
      x_2d = nn.tanh(hid(x_2d))
      x = nn.tanh(hid(x))
    out["pre_logits_2d"] = x_2d
    out["pre_logits"] = x

    if self.num_classes:
      kw = {"kernel_init": nn.initializers.zeros} if self.head_zeroinit else {}
      head = nn.Dense(self.num_classes, name="head", **kw)
      x_2d = out["logits_2d"] = head(x_2d)
      x = out["logits"] = head(x)
    return x, out


def _freeze_attention(spec: Any) -> Any:
  """Config dicts/lists become hashable AttentionSpecs (linen attributes must be hashable)."""
  if isinstance(spec, (list, tuple)):
    return tuple(attn_lib.parse_spec(s) for s in spec)
  return attn_lib.parse_spec(spec or "softmax")  # validates names now, not at the first apply


def Model(
    num_classes: int | None = None, *, variant: str | None = None, **kw  # noqa: N802
) -> _Model:
  """big_vision-style factory: `Model(num_classes, variant="S/16", attention="elu1", ...)`."""
  kw = {**decode_variant(variant), **kw}
  if "patch_size" in kw:
    kw["patch_size"] = tuple(kw["patch_size"])
  if "attention" in kw:
    kw["attention"] = _freeze_attention(kw["attention"])
  known = {f for f in _Model.__dataclass_fields__ if f not in ("parent", "name")}
  unknown = sorted(set(kw) - known)
  if unknown:
    raise TypeError(f"unknown ViT model field(s) {unknown}; known: {sorted(known)}")
  return _Model(num_classes, **kw)


def layer_specs(model: _Model) -> tuple[attn_lib.AttentionSpec, ...]:
  """The attention operator of every encoder layer (one spec for all, or per layer)."""
  return attn_lib.parse_layer_specs(model.attention, model.depth)


def load(
    init_params: Mapping[str, Any] | None,
    init_file: str,
    model_cfg: Mapping[str, Any],
    dont_load: Sequence[str] = (),
) -> dict:
  """Loads a big_vision (or AugReg-era) ViT checkpoint into `init_params`' structure.

  big_vision's semantics: old layouts fixed, scan/loop converted to `model_cfg['scan']`, strict
  merge except keys matching a `dont_load` regex (those keep `init_params`' values), and the
  position embedding resampled to the model's grid (see `vit_checkpoint.load_vit_params`).
  """
  return vit_checkpoint.load_vit_params(init_params, init_file, model_cfg, dont_load)
