"""big_vision ViT checkpoints into a model: old layouts, scan <-> loop, the architecture, `load`.

What makes a checkpoint fit *this ViT* lives here, beside the model (as in big_vision's
models/vit.py); generic .npz reading/writing and the strict merge are in linvit_jax/models/checkpoints.py.
Everything works on nested dicts of numpy arrays (no 'params' top key) and is pure: inputs are
never mutated.

The one path in is `load_vit_params` (what `vit.load` delegates to):
  read_vit_checkpoint -> pyloop/scan layout -> merge_params -> resample the posemb -> cast
where `read_vit_checkpoint` is load_npz -> fix_old_checkpoints for a big_vision .npz, and
models/foreign.py for a Hugging Face / timm folder or .safetensors file; the position table is
resized by models/posemb.py.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from linvit_jax.models import checkpoint_record
from linvit_jax.models import layout
from linvit_jax.models import posemb
from linvit_jax.models.checkpoint_record import CheckpointRecord
from linvit_jax.models.checkpoints import CheckpointError
from linvit_jax.models.checkpoints import Params
from linvit_jax.models.checkpoints import count_non_finite
from linvit_jax.models.checkpoints import dont_load_matcher
from linvit_jax.models.checkpoints import dtype_of
from linvit_jax.models.checkpoints import flatten
from linvit_jax.models.checkpoints import is_posemb
from linvit_jax.models.checkpoints import merge_params
from linvit_jax.models.checkpoints import raise_problems
from linvit_jax.models.checkpoints import shape_of
from linvit_jax.models.checkpoints import top_keys
from linvit_jax.models.checkpoints import unflatten
from linvit_jax.models.variants import decode_variant


def _copy_tree(tree: Mapping[str, Any]) -> Params:
  """Copies the dict structure (not the arrays), so callers' trees are never mutated."""
  return {k: _copy_tree(v) if isinstance(v, Mapping) else v for k, v in tree.items()}


# ------------------------------------------------------------------------------------------------
# Old checkpoint layouts.

_NUMBERED = re.compile(r"(.+)_(\d+)")


def convert_pre_linen(tree: Mapping[str, Any]) -> Params:
  """Renumbers pre-linen submodule names, as flax.training.checkpoints.convert_pre_linen.

  Pre-linen flax numbered submodules globally within their parent (LayerNorm_0,
  MultiHeadDotProductAttention_1, LayerNorm_2, MlpBlock_3); linen counts per module type
  (LayerNorm_0, MultiHeadDotProductAttention_0, LayerNorm_1, MlpBlock_0). Within each parent,
  names of the same type are renumbered 0, 1, 2, ... in order of their old number. Already-linen
  trees come back unchanged (numbers are already 0..n-1 per type).
  """

  def order(name: str) -> tuple[str, int]:
    m = _NUMBERED.fullmatch(name)
    return (m.group(1), int(m.group(2))) if m else (name, -1)

  out: Params = {}
  counts: dict[str, int] = {}
  for name in sorted(tree, key=order):
    value = tree[name]
    m = _NUMBERED.fullmatch(name)
    if m:
      kind = m.group(1)
      new = f"{kind}_{counts.get(kind, 0)}"
      counts[kind] = counts.get(kind, 0) + 1
    else:
      new = name
    out[new] = convert_pre_linen(value) if isinstance(value, Mapping) else value
  return out


def _has_cls_slot(n: int) -> bool:
  return math.isqrt(n - 1) ** 2 == n - 1 and n > 1


def fix_old_checkpoints(
    params: Mapping[str, Any], *, model_posemb_len: int | None = None
) -> Params:
  """Brings older ViT checkpoints (original ViT paper, AugReg, ViT-G era) to today's names.

  - pre-linen module numbering (see convert_pre_linen);
  - `Transformer/posembed_input/pos_embedding` and `Transformer/pos_embedding` -> `pos_embedding`;
  - a posemb with a [cls] slot (N = g*g + 1; old ViTs concatenated [cls] before adding the
    posemb): the slot is split off and added into `cls`, which is exactly equivalent;
  - an inlined MAP head (`probe` at the top level) -> `MAPHead_0`.
  The [cls]-slot test is big_vision's (N = g*g + 1), which would misread a non-square grid with
  h*w = g*g + 1 (2x5, 4x5, ...), as today's checkpoints of non-square models have. So a
  top-level posemb that already has `model_posemb_len` positions (the model it is loaded into;
  load_vit_params passes it) is taken as is. Old-location posembs are always from square models.
  """
  params = convert_pre_linen(params)
  enc = params.get("Transformer")
  old_location = False
  if isinstance(enc, dict):
    if "posembed_input" in enc:
      params["pos_embedding"] = enc.pop("posembed_input")["pos_embedding"]
      old_location = True
    if "pos_embedding" in enc:
      params["pos_embedding"] = enc.pop("pos_embedding")
      old_location = True

  pe = params.get("pos_embedding")
  if (
      pe is not None
      and np.ndim(pe) == 3
      and _has_cls_slot(pe.shape[1])
      and (old_location or pe.shape[1] != model_posemb_len)
  ):
    params["pos_embedding"] = pe[:, 1:]
    if "cls" in params:
      params["cls"] = params["cls"] + pe[:, :1]

  if "probe" in params:
    head_parts = ("probe", "MlpBlock_0", layout.ATTN, "LayerNorm_0")
    params["MAPHead_0"] = {k: params.pop(k) for k in head_parts if k in params}
  return params


def _block_index(name: str) -> int | None:
  m = re.fullmatch(rf"{layout.SCANNED_BLOCK}_(\d+)", name)
  return int(m.group(1)) if m else None


def pyloop_to_scan(params: Mapping[str, Any]) -> Params:
  """Stacks `Transformer/encoderblock_{i}` into `Transformer/encoderblock` (leading depth axis).

  A tree that is already scanned comes back unchanged.
  """
  params = _copy_tree(params)
  enc = params.get("Transformer", {})
  indices = sorted(i for i in map(_block_index, enc) if i is not None)
  if not indices:
    return params
  if layout.SCANNED_BLOCK in enc:
    raise CheckpointError(
        f"'Transformer' has both '{layout.SCANNED_BLOCK}' (scan) and "
        f"'{layout.block_name('N')}' (python loop) blocks"
    )
  if indices != list(range(len(indices))):
    raise CheckpointError(
        f"'Transformer' blocks must be numbered 0..{len(indices) - 1} to be "
        f"stacked, found {layout.SCANNED_BLOCK}_{indices}"
    )
  blocks = [flatten(enc.pop(layout.block_name(i))) for i in indices]
  for i, block in enumerate(blocks[1:], 1):
    if block.keys() != blocks[0].keys():
      diff = sorted(block.keys() ^ blocks[0].keys())
      raise CheckpointError(
          f"cannot stack encoder blocks: {layout.block_name(i)} and "
          f"{layout.block_name(0)} differ in params {diff}"
      )
  stacked = {}
  for name in blocks[0]:
    shapes = {np.shape(b[name]) for b in blocks}
    if len(shapes) > 1:
      raise CheckpointError(
          f"cannot stack encoder blocks: '{layout.block_name('N')}/{name}' has "
          f"different shapes across blocks {sorted(shapes)}"
      )
    stacked[name] = np.stack([np.asarray(b[name]) for b in blocks])
  enc[layout.SCANNED_BLOCK] = unflatten(stacked)
  return params


def scan_to_pyloop(params: Mapping[str, Any]) -> Params:
  """Splits `Transformer/encoderblock` (leading depth axis) into `encoderblock_{i}`.

  A tree that is already per-block comes back unchanged.
  """
  params = _copy_tree(params)
  enc = params.get("Transformer", {})
  if layout.SCANNED_BLOCK not in enc:
    return params
  flat = flatten(enc.pop(layout.SCANNED_BLOCK))
  depths = {np.shape(v)[0] if np.ndim(v) else None for v in flat.values()}
  if len(depths) != 1 or None in depths:
    raise CheckpointError(
        f"cannot unstack 'Transformer/{layout.SCANNED_BLOCK}': its params disagree on "
        f"the leading (depth) axis, sizes {sorted(map(str, depths))}"
    )
  for i in range(depths.pop()):
    enc[layout.block_name(i)] = unflatten({k: np.asarray(v)[i] for k, v in flat.items()})
  return params


# ------------------------------------------------------------------------------------------------
# Position embeddings.


def with_posemb_grid(
    params: Mapping[str, Any], new_grid: tuple[int, int], old_grid: tuple[int, int] | None = None
) -> dict:
  """A copy of `params` whose learned position table (if any) is resampled to `new_grid`
  (posemb.resample_posemb; `old_grid` None: the table's square grid)."""
  params = dict(params)
  if "pos_embedding" in params:
    pe = np.asarray(params["pos_embedding"])
    new_shape = (1, new_grid[0] * new_grid[1], pe.shape[-1])
    params["pos_embedding"] = posemb.resample_posemb(pe, new_shape, old_grid, tuple(new_grid))
  return params


def read_vit_checkpoint(
    source: str | CheckpointRecord, model_posemb_len: int | None = None
) -> tuple[Params, str]:
  """A ViT checkpoint in the current big_vision layout, and how its posemb is to be resampled.

  `source`: a record (checkpoint_record.read) or a path: a big_vision .npz (any layout
  `fix_old_checkpoints` knows), or a Hugging Face / timm folder or .safetensors file
  (models/foreign.py).
  """
  record = checkpoint_record.of(source)
  if record.imported is not None:
    return record.imported.params, record.imported.posemb_resample
  params = fix_old_checkpoints(record.tree, model_posemb_len=model_posemb_len)
  method = record.sidecar.get("posemb_resample", "big_vision")
  return params, method if method in posemb.RESAMPLERS else "big_vision"


# ------------------------------------------------------------------------------------------------
# The one entry point models/vit.py's load() delegates to.


def _check_against_config(
    params: Params, model_cfg: Mapping[str, Any], skipped: Callable[[str], bool], source: str
) -> None:
  """Clear errors when the checkpoint is plainly a different ViT than `model_cfg` describes.

  Only what is checkable from the params and stated in the config is compared, and only for
  params that will actually be loaded (not dont_load'ed).
  """
  cfg = {
      **decode_variant(model_cfg.get("variant")),
      **{
          k: model_cfg[k]
          for k in ("patch_size", "width", "num_heads", "mlp_dim")
          if model_cfg.get(k) is not None
      },
  }
  flat = flatten(params)
  problems = []
  emb = flat.get("embedding/kernel")
  if emb is not None and np.ndim(emb) == 4 and not skipped("embedding/kernel"):
    problems += _embedding_problems(emb, cfg)
  query = _first_block_param(flat, f"{layout.ATTN}/query/kernel")
  if query is not None and "num_heads" in cfg and not skipped(query):
    q = flat[query]
    if q.shape[-2] != cfg["num_heads"]:
      problems.append(
          f"{q.shape[-2]} heads ({query} {shape_of(q)}) but the model config "
          f"says num_heads={cfg['num_heads']}"
      )
  mlp = _first_block_param(flat, "MlpBlock_0/Dense_0/kernel")
  if mlp is not None and "mlp_dim" in cfg and not skipped(mlp):
    if flat[mlp].shape[-1] != cfg["mlp_dim"]:
      problems.append(
          f"mlp_dim {flat[mlp].shape[-1]} ({mlp} {shape_of(flat[mlp])}) but the "
          f"model config says {cfg['mlp_dim']}"
      )
  raise_problems(source, problems)


def _embedding_problems(emb: Any, cfg: Mapping[str, Any]) -> list[str]:
  """The patch size and width of embedding/kernel [ph, pw, C, D] against the config's."""
  problems = []
  if "patch_size" in cfg:
    ps = cfg["patch_size"]
    ps = tuple(ps) if isinstance(ps, Sequence) else (ps, ps)
    if tuple(emb.shape[:2]) != tuple(ps):
      problems.append(
          f"patch size {tuple(emb.shape[:2])} (embedding/kernel "
          f"{shape_of(emb)}) but the model config says {ps}"
      )
  if "width" in cfg and emb.shape[-1] != cfg["width"]:
    problems.append(
        f"width {emb.shape[-1]} (embedding/kernel {shape_of(emb)}) but the "
        f"model config says {cfg['width']}"
    )
  return problems


def _first_block_param(flat: Mapping[str, Any], suffix: str) -> str | None:
  """The name of the first block's (or the scanned block's) `suffix` param, None if absent."""
  pattern = rf"Transformer/{layout.SCANNED_BLOCK}(_0)?/{suffix}"
  return next((n for n in sorted(flat) if re.fullmatch(pattern, n)), None)


def infer_vit_config(source: str | CheckpointRecord) -> dict[str, Any]:
  """The big_vision ViT fields a checkpoint's names and shapes decide, for `vit.Model(**...)`.

  patch_size and width (embedding/kernel), depth (blocks, per-block or scanned), num_heads
  (query/kernel [D, H, Dh]), mlp_dim (Dense_0), posemb ('learn' when a pos_embedding is stored,
  else 'sincos2d'), pool_type ('tok' with a cls token, 'map' with a MAP head, else 'gap': a
  'gap' / '0' / 'none' model stores nothing that tells them apart), num_classes (head/kernel,
  None when there is no head), rep_size (pre_logits/kernel). Also `posemb_grid`: the stored
  position-embedding grid (h, w), the resolution the checkpoint was trained at, for information.
  Any layout `load_vit_params` reads (old names, scanned) works. `reg_tokens` from a `reg` param.

  What shapes cannot tell (the GELU form, the LayerNorm epsilon, the input normalisation as
  `preprocessing` {mean, std} on 0..1 pixels) comes from the source's own config for a Hugging
  Face / timm source, or from the JSON beside an .npz (`x.json`, as import_weights writes it);
  those keys are absent when nothing says.
  """
  record = checkpoint_record.of(source)
  if record.imported is not None:
    arch = dict(record.imported.arch)
    if record.imported.preprocessing:
      arch["preprocessing"] = record.imported.preprocessing
    return arch
  params = fix_old_checkpoints(record.tree)
  flat = flatten(params)
  emb, query, dense0, scanned = _first_block_kernels(params, flat, record.path)
  head = flat.get("head/kernel")
  rep = flat.get("pre_logits/kernel")
  pe = flat.get("pos_embedding")
  reg = flat.get("reg")
  return dict(
      _declared(record.sidecar),
      reg_tokens=int(reg.shape[1]) if reg is not None else 0,
      patch_size=tuple(int(x) for x in emb.shape[:2]),
      width=int(emb.shape[-1]),
      depth=_depth(params, query, scanned),
      num_heads=int(query.shape[-2]),
      mlp_dim=int(dense0.shape[-1]),
      posemb="learn" if pe is not None else "sincos2d",
      pool_type="tok" if "cls" in params else "map" if "MAPHead_0" in params else "gap",
      num_classes=int(head.shape[-1]) if head is not None else None,
      rep_size=int(rep.shape[-1]) if rep is not None else False,
      posemb_grid=_square_grid(pe),
  )


def _first_block_kernels(params: Params, flat: Mapping[str, Any], path: str):
  """(embedding/kernel, the first block's query and Dense_0 kernels, whether the blocks are
  scanned); a checkpoint without them is not a big_vision ViT, said naming `path`."""
  emb = flat.get("embedding/kernel")
  if emb is None or np.ndim(emb) != 4:
    raise_problems(
        path,
        [
            f"no patch embedding 'embedding/kernel' [ph, pw, C, D] (top-level "
            f"keys: {top_keys(params)}): not a big_vision ViT checkpoint"
        ],
    )
  scanned = isinstance(params.get("Transformer"), dict) and layout.is_scanned(params)
  block = f"Transformer/{layout.SCANNED_BLOCK}" if scanned else layout.block_path(0)
  query = flat.get(f"{block}/{layout.ATTN}/query/kernel")
  dense0 = flat.get(f"{block}/MlpBlock_0/Dense_0/kernel")
  if query is None or dense0 is None:
    raise_problems(
        path, [f"no first encoder block with attention query and MLP kernels under {block!r}"]
    )
  return emb, query, dense0, scanned


def _depth(params: Params, query: Any, scanned: bool) -> int:
  if scanned:
    return int(query.shape[0])
  indices = [_block_index(n) for n in params["Transformer"]]
  return 1 + max(i for i in indices if i is not None)


def _square_grid(pe: Any) -> tuple[int, int] | None:
  """The (side, side) grid of a [1, N, D] position table, None when there is none or N is not a
  square."""
  if pe is None or np.ndim(pe) != 3:
    return None
  side = math.isqrt(pe.shape[1])
  return (side, side) if side * side == pe.shape[1] else None


def _declared(sidecar: Mapping[str, Any]) -> dict[str, Any]:
  """What the sidecar JSON of an .npz declares beyond the shapes: GELU form, LayerNorm epsilon,
  input normalisation."""
  known = {
      k: sidecar["model_config"][k]
      for k in ("gelu_approximate", "layernorm_epsilon")
      if k in sidecar.get("model_config", {})
  }
  if isinstance(sidecar.get("preprocessing"), dict) and "mean" in sidecar["preprocessing"]:
    pre = sidecar["preprocessing"]
    known["preprocessing"] = {"mean": list(pre["mean"]), "std": list(pre["std"])}
  return known


def input_channels(source: str | CheckpointRecord) -> int:
  """The number of image channels a checkpoint's patch embedding takes (C of [ph, pw, C, D]):
  3 for RGB models, 1 for grayscale ones (e.g. a Fashion-MNIST ViT)."""
  record = checkpoint_record.of(source)
  params = record.imported.params if record.imported is not None else record.tree
  emb = flatten(fix_old_checkpoints(params)).get("embedding/kernel")
  if emb is None or np.ndim(emb) != 4:
    raise_problems(record.path, ["no patch embedding 'embedding/kernel' [ph, pw, C, D]"])
  return int(np.shape(emb)[2])


def model_config_from_init(
    model_cfg: Mapping[str, Any], init: str | CheckpointRecord, head_skipped: bool = False
) -> dict[str, Any]:
  """`model_cfg` with what `init` decides read from it (`infer_vit_config`).

  Kept from `model_cfg`: the pool type when the checkpoint cannot tell ('gap' / '0' / 'none':
  no cls token, no MAP head), the number of classes when the head is skipped (`head_skipped`: a
  new head, e.g. an i21k teacher on i1k), the GELU form and LayerNorm epsilon unless the source
  declares them, and every field that is not architecture (dropout, scan, dtype, ...).
  """
  arch = infer_vit_config(init)
  out = dict(model_cfg, variant="")
  for key in ("width", "depth", "mlp_dim", "num_heads", "posemb", "rep_size", "reg_tokens"):
    out[key] = arch[key]
  out["patch_size"] = tuple(arch["patch_size"])
  if arch["pool_type"] in ("tok", "map") or model_cfg.get("pool_type") not in ("gap", "0", "none"):
    out["pool_type"] = arch["pool_type"]
  if not head_skipped:
    out["num_classes"] = arch["num_classes"]
  for key in ("gelu_approximate", "layernorm_epsilon"):
    if key in arch:
      out[key] = arch[key]
  return out


def load_vit_params(
    init_params: Mapping[str, Any] | None,
    init_file: str | CheckpointRecord,
    model_cfg: Mapping[str, Any],
    dont_load: Sequence[str] = (),
) -> Params:
  """big_vision's `vit.load` semantics: a checkpoint made to fit the model `init_params` is from.

  Steps: read (any layout, `:subtree` selector) -> fix old names -> scan or per-block layout
  as `model_cfg['scan']` says -> check against model_cfg (patch size, width, heads, mlp_dim) ->
  strict merge into `init_params` (dont_load'ed params keep their init value) -> resample the
  posemb to the model's grid -> cast each param to the model's dtype. Returns numpy arrays.
  With `init_params=None` the fixed-up checkpoint is returned as is (after the config checks).
  """
  init_pe = (init_params or {}).get("pos_embedding")
  posemb_len = shape_of(init_pe)[1] if init_pe is not None and len(shape_of(init_pe)) == 3 else None
  params, posemb_method = read_vit_checkpoint(init_file, model_posemb_len=posemb_len)
  init_file = init_file.path if isinstance(init_file, CheckpointRecord) else init_file
  if isinstance(params.get("Transformer"), dict):
    convert = pyloop_to_scan if model_cfg.get("scan") else scan_to_pyloop
    params = convert(params)
  skipped = dont_load_matcher(dont_load)
  _check_against_config(params, model_cfg, skipped, init_file)

  if init_params is None:
    flat = flatten(params)
    raise_problems(
        init_file,
        [
            f"non-finite values at {k!r}: {n} of {np.size(v)} entries are " "NaN/Inf"
            for k, v in flat.items()
            if (n := count_non_finite(v))
        ],
    )
    return unflatten({k: np.asarray(v) for k, v in flat.items()})

  merged = flatten(merge_params(params, init_params, dont_load, source=init_file))
  flat_init = flatten(init_params)
  out = {}
  for name, value in merged.items():
    init_val = flat_init[name]
    if skipped(name):  # Init value, untouched (could be a jax array or a ShapeDtypeStruct).
      out[name] = np.asarray(init_val) if hasattr(init_val, "__array__") else init_val
      continue
    value = np.asarray(value)
    if is_posemb(name) and value.shape != shape_of(init_val):
      try:
        value = posemb.resample_posemb_as(posemb_method, value, shape_of(init_val))
      except CheckpointError as e:
        raise CheckpointError(f"checkpoint '{init_file}': cannot resample {name!r}: " f"{e}") from e
    out[name] = value.astype(dtype_of(init_val), copy=False)
  return unflatten(out)
