"""Device mesh, parameter shardings and global batches (multi-process start-up: distributed.py).

One code path for one CPU, a GPU host or a TPU pod (the tests cover 1 CPU device, 8 simulated
devices and 2 processes × 4 devices on localhost; GPU and TPU are untested here):

* `make_mesh([("data", -1), ("fsdp", 1)])` names the device axes; -1 is "all the devices left".
* The batch dimension is split over every batch axis in the mesh ("data" and "fsdp"), so each
  device sees `global_batch / (data·fsdp)` examples; other axes (e.g. "model") replicate it.
* Parameters are fully-sharded (fsdp) along the "fsdp" axis: every leaf of at least `min_size`
  elements is split on its largest dimension that the axis divides; smaller leaves (biases,
  LayerNorms, scalars) are replicated. Per-path regex rules (re.fullmatch, the first that
  matches) override this. A train state's optimizer leaves follow the param each one mirrors
  (`state_shardings`).
* Each process feeds only its own rows of the global batch; `make_global_batch` stitches them
  into one global `jax.Array` with `jax.make_array_from_process_local_data`.

Paths are big_vision-style '/'-joined names (`f"{layout.block_path(0)}/MlpBlock_0/Dense_0/kernel"`);
a rule that names encoder modules is best built from models/layout.py (`layout.BLOCK_RE`,
`layout.attention_re(...)`), which knows both layouts. `train.py` jits under `jax.set_mesh(mesh)`
with these `NamedSharding`s at the jit boundary.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from linvit_jax.runtime import tree as tree_lib

# Mesh axes the batch dimension is split over, in this order, when present in the mesh.
BATCH_AXES = ("data", "fsdp")
FSDP_AXIS = "fsdp"
DEFAULT_MIN_SIZE = 2**14

MeshConfig = Sequence[tuple[str, int]]
# A rule's spec: "fsdp" (the automatic rule regardless of size), "replicate" / None, or an explicit
# PartitionSpec (or tuple/list of mesh axis names / None per dimension).
RuleSpec = str | None | P | Sequence[Any]
Rules = Sequence[tuple[str, RuleSpec]]


# ------------------------------------------------------------------------------------------------
# Mesh.


def _parse_mesh_config(mesh_cfg: MeshConfig, num_devices: int) -> tuple[list[str], list[int]]:
  names, sizes = [], []
  for entry in mesh_cfg:
    try:
      name, size = entry
      size = int(size)
    except (TypeError, ValueError) as e:
      raise ValueError(
          f"mesh config {list(mesh_cfg)!r}: each entry must be (axis_name, size), " f"got {entry!r}"
      ) from e
    if not isinstance(name, str) or not name:
      raise ValueError(f"mesh config {list(mesh_cfg)!r}: axis name {name!r} must be a string")
    if name in names:
      raise ValueError(f"mesh config {list(mesh_cfg)!r}: axis {name!r} appears twice")
    if size == 0 or size < -1:
      raise ValueError(
          f"mesh config {list(mesh_cfg)!r}: axis {name!r} has size {size}; sizes "
          "are positive, or -1 for 'the remaining devices'"
      )
    names.append(name)
    sizes.append(size)
  if not names:
    raise ValueError("mesh config is empty; use e.g. [('data', -1), ('fsdp', 1)]")
  if sizes.count(-1) > 1:
    raise ValueError(f"mesh config {list(mesh_cfg)!r}: at most one axis may be -1")
  fixed = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if num_devices % fixed:
      raise ValueError(
          f"mesh config {list(mesh_cfg)!r} cannot be laid out on {num_devices} devices: the fixed "
          f"axes need a multiple of {fixed} devices"
      )
    sizes[sizes.index(-1)] = num_devices // fixed
  elif fixed != num_devices:
    raise ValueError(
        f"mesh config {list(mesh_cfg)!r} has shape {tuple(sizes)} = {fixed} devices, but "
        f"{num_devices} devices are available (jax.device_count()); make the sizes multiply to "
        f"{num_devices}, or use -1 for one axis"
    )
  return names, sizes


def make_mesh(mesh_cfg: MeshConfig, devices: Sequence[Any] | None = None) -> Mesh:
  """A `Mesh` over all devices (of all processes) from [(axis_name, size), ...]; -1 = the rest.

  Axes are `AxisType.Auto`: shardings are given explicitly at jit boundaries and propagated by
  XLA inside, so models need no sharding annotations. On multi-slice TPU the first axis whose size
  is a multiple of the slice count spans slices (data parallelism over the slow network).
  """
  devices = list(jax.devices() if devices is None else devices)
  names, sizes = _parse_mesh_config(mesh_cfg, len(devices))
  axis_types = (AxisType.Auto,) * len(names)
  num_slices = len({getattr(d, "slice_index", 0) for d in devices})
  if num_slices > 1:
    from jax.experimental import mesh_utils

    dcn_axis = next((i for i, s in enumerate(sizes) if s % num_slices == 0), None)
    if dcn_axis is None:
      raise ValueError(
          f"mesh {dict(zip(names, sizes))} on {num_slices} TPU slices: no axis size "
          f"is a multiple of the slice count {num_slices}"
      )
    ici = list(sizes)
    ici[dcn_axis] //= num_slices
    dcn = [1] * len(sizes)
    dcn[dcn_axis] = num_slices
    grid = mesh_utils.create_hybrid_device_mesh(ici, dcn, devices)
    return Mesh(grid, tuple(names), axis_types=axis_types)
  return jax.make_mesh(tuple(sizes), tuple(names), axis_types=axis_types, devices=devices)


def mesh_shape(mesh: Mesh) -> dict[str, int]:
  return dict(zip(mesh.axis_names, mesh.devices.shape))


# ------------------------------------------------------------------------------------------------
# Batches.


def batch_axes(mesh: Mesh) -> tuple[str, ...]:
  """The mesh axes the batch dimension is split over (those of BATCH_AXES the mesh has)."""
  return tuple(a for a in BATCH_AXES if a in mesh.axis_names)


def num_batch_shards(mesh: Mesh) -> int:
  shape = mesh_shape(mesh)
  return math.prod(shape[a] for a in batch_axes(mesh))


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (batch) dimension over all batch axes; the other dimensions whole."""
  axes = batch_axes(mesh)
  return NamedSharding(mesh, P(axes if axes else None))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def check_batch_size(
    global_batch_size: int, mesh: Mesh, *, accum_steps: int = 1, what: str = "batch_size"
) -> None:
  """Raises before any compute when the global batch cannot be split evenly.

  It must divide into `accum_steps` micro-batches that each split over the batch shards, and
  over the processes feeding it.
  """
  shards = num_batch_shards(mesh)
  if accum_steps < 1:
    raise ValueError(f"{what}: accum_steps must be >= 1, got {accum_steps}")
  if global_batch_size <= 0 or global_batch_size % (shards * accum_steps):
    extra = f" × {accum_steps} accumulation steps" if accum_steps > 1 else ""
    raise ValueError(
        f"{what}={global_batch_size} must be a positive multiple of {shards * accum_steps}: the "
        f"batch is split over {shards} batch shards (mesh {mesh_shape(mesh)}, axes "
        f"{batch_axes(mesh)}){extra}"
    )
  if global_batch_size % jax.process_count():
    raise ValueError(
        f"{what}={global_batch_size} is not divisible by the "
        f"{jax.process_count()} processes that feed it"
    )


def process_batch_rows(global_batch_size: int, mesh: Mesh) -> slice:
  """The rows of the global batch that this process feeds (what its local batch must hold).

  With the usual device orders this is `[i·B/P, (i+1)·B/P)` for process i; a data pipeline that
  wants the global batch to equal a single-process one, bit for bit, slices it with this.
  """
  index_map = batch_sharding(mesh).addressable_devices_indices_map((global_batch_size,))
  starts = sorted(
      {(idx[0].start or 0, idx[0].stop or global_batch_size) for idx in index_map.values()}
  )
  for (_, stop), (start, _) in zip(starts, starts[1:]):
    if stop != start:
      raise ValueError(
          f"this process's batch rows {starts} are not contiguous in mesh "
          f"{mesh_shape(mesh)}; reorder the mesh devices"
      )
  return slice(starts[0][0], starts[-1][1])


@functools.lru_cache(maxsize=16)
def _local_batch_shards(mesh: Mesh) -> int:
  """Distinct row blocks held by this process's devices (replicas on other axes share one)."""
  probe = batch_sharding(mesh).addressable_devices_indices_map((num_batch_shards(mesh),))
  return len({idx[0].start for idx in probe.values()})


def make_global_batch(local_batch: Any, mesh: Mesh) -> Any:
  """Per-process numpy batch (a pytree of [local_B, ...] arrays) → global sharded `jax.Array`s.

  Every process passes its own rows (see `process_batch_rows`); the global batch has
  local_B · (batch shards / this process's batch shards) rows.
  """
  sharding = batch_sharding(mesh)
  shards, local_shards = num_batch_shards(mesh), _local_batch_shards(mesh)

  def one(path, x):
    x = np.asarray(x)
    if x.ndim == 0 or x.shape[0] % local_shards:
      raise ValueError(
          f"batch entry '{tree_lib.path_str(path)}' has shape {x.shape}: its leading (batch) "
          f"dimension must split over this process's {local_shards} batch shards (mesh "
          f"{mesh_shape(mesh)})"
      )
    global_shape = (x.shape[0] // local_shards * shards,) + x.shape[1:]
    return jax.make_array_from_process_local_data(sharding, x, global_shape)

  return jax.tree_util.tree_map_with_path(one, local_batch)


# ------------------------------------------------------------------------------------------------
# Parameters.


def _fsdp_spec(shape: Sequence[int], axis_size: int) -> P:
  """Split the largest dimension the axis divides (ties: the later one); replicate if none."""
  for dim in sorted(range(len(shape)), key=lambda d: (shape[d], d), reverse=True):
    if shape[dim] % axis_size == 0 and shape[dim] >= axis_size:
      spec = [None] * len(shape)
      spec[dim] = FSDP_AXIS
      return P(*spec)
  return P()


def _explicit_spec(
    name: str,
    pattern: str,
    spec: Sequence[Any],
    shape: Sequence[int],
    axis_sizes: Mapping[str, int],
) -> P:
  spec = tuple(spec)
  if len(spec) > len(shape):
    raise ValueError(
        f"param '{name}' {tuple(shape)}: rule {pattern!r} gives spec {spec} with "
        f"more entries than the {len(shape)} dimensions"
    )
  for dim, axes in enumerate(spec):
    if axes is None:
      continue
    axes_t = axes if isinstance(axes, tuple) else (axes,)
    for a in axes_t:
      if a not in axis_sizes:
        raise ValueError(
            f"param '{name}': rule {pattern!r} names mesh axis {a!r}, but the mesh "
            f"has {dict(axis_sizes)}"
        )
    n = math.prod(axis_sizes[a] for a in axes_t)
    if shape[dim] % n:
      raise ValueError(
          f"param '{name}' {tuple(shape)}: rule {pattern!r} splits dimension {dim} "
          f"({shape[dim]}) over {axes_t} = {n} devices, which does not divide it"
      )
  return P(*spec)


def param_partition_specs(
    params_shapes: Any,
    axis_sizes: Mapping[str, int],
    *,
    rules: Rules | None = None,
    min_size: int = DEFAULT_MIN_SIZE,
) -> Any:
  """PartitionSpec per leaf of a pytree of arrays / ShapeDtypeStructs (pure: no devices needed).

  `rules` are (regex, spec) pairs tried in order with `re.fullmatch` on the leaf's whole path
  (as every path regex of the project: ".*/kernel", not "kernel"); the first match wins:
  "fsdp" = split the largest divisible dimension whatever the size, "replicate" or None = whole
  on every device, a tuple / PartitionSpec = exactly that. Leaves no rule matches get "fsdp" if
  they have at least `min_size` elements, else are replicated.
  """
  rules = list(rules or ())
  compiled = tree_lib.compile_patterns([pattern for pattern, _ in rules])
  fsdp_size = axis_sizes.get(FSDP_AXIS, 1)

  def one(path, leaf):
    name = tree_lib.path_str(path)
    shape = tuple(np.shape(leaf)) if not hasattr(leaf, "shape") else tuple(leaf.shape)
    hit = tree_lib.first_match(name, compiled)
    if hit is not None:
      pattern, spec = rules[hit]
      if spec is None or spec == "replicate":
        return P()
      if spec == "fsdp":
        return _fsdp_spec(shape, fsdp_size) if fsdp_size > 1 else P()
      if isinstance(spec, str):
        raise ValueError(
            f"param rule {pattern!r}: spec {spec!r} must be 'fsdp', 'replicate', "
            "None or a tuple of mesh axis names"
        )
      return _explicit_spec(name, pattern, spec, shape, axis_sizes)
    if fsdp_size > 1 and math.prod(shape) >= min_size:
      return _fsdp_spec(shape, fsdp_size)
    return P()

  return jax.tree_util.tree_map_with_path(one, params_shapes)


def param_shardings(
    params_shapes: Any, mesh: Mesh, rules: Rules | None = None, min_size: int = DEFAULT_MIN_SIZE
) -> Any:
  """`NamedSharding` per leaf; see `param_partition_specs` for the rules."""
  specs = param_partition_specs(params_shapes, mesh_shape(mesh), rules=rules, min_size=min_size)
  return jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, P))


def abstract_tree(tree: Any) -> Any:
  """`tree` as jax.ShapeDtypeStructs (dtypes as jax would hold them: float64 → float32 without
  x64), so that shardings are planned without touching the values; structs stay as they are."""

  def one(x):
    if isinstance(x, jax.ShapeDtypeStruct):
      return x
    dtype = jax.dtypes.canonicalize_dtype(x.dtype if hasattr(x, "dtype") else np.result_type(x))
    return jax.ShapeDtypeStruct(np.shape(x), dtype)

  return jax.tree.map(one, tree)


def with_shardings(abstract: Any, shardings: Any) -> Any:
  """ShapeDtypeStructs that carry `shardings` (what orbax restores into, already placed)."""
  return jax.tree.map(
      lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings
  )


def state_shardings(
    abstract_state: Any,
    mesh: Mesh,
    param_rules: Rules | None = None,
    min_size: int = DEFAULT_MIN_SIZE,
) -> Any:
  """Shardings of a train state (any pytree with a `.params` field, e.g.
  train_step.TrainState, as ShapeDtypeStructs): params by the rules; optimizer leaves that mirror
  a param (path suffix + shape) like it; everything else by the rules too."""
  by_rules = param_shardings(abstract_state, mesh, param_rules, min_size)
  param_sh = param_shardings(abstract_state.params, mesh, param_rules, min_size)
  by_path = {}
  for (path, leaf), sh in zip(
      jax.tree_util.tree_flatten_with_path(abstract_state.params)[0], jax.tree.leaves(param_sh)
  ):
    by_path[tree_lib.path_str(path)] = (tuple(leaf.shape), sh)

  def one(path, leaf, default):
    parts = tree_lib.path_str(path).split("/")
    for k in range(1, len(parts)):
      hit = by_path.get("/".join(parts[k:]))
      if hit is not None and hit[0] == tuple(leaf.shape):
        return hit[1]
    return default

  return jax.tree_util.tree_map_with_path(one, abstract_state, by_rules)


def shard_tree(tree: Any, shardings: Any) -> Any:
  """Places a pytree of host (numpy) or device arrays in the given shardings.

  Host arrays must be the full (global) value on every process; each process copies only the
  slices its devices hold, so this works multi-process without gathering anything.
  """

  def one(x, sharding):
    if isinstance(x, jax.Array):
      if x.sharding == sharding:
        return x
      if x.is_fully_addressable or sharding.is_fully_addressable:
        return jax.device_put(x, sharding)
      return jax.jit(lambda a: a, out_shardings=sharding)(x)
    x = np.asarray(x)
    x = x.astype(jax.dtypes.canonicalize_dtype(x.dtype), copy=False)  # float64 → float32 w/o x64
    return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])

  return jax.tree.map(one, tree, shardings)


def bytes_per_device(tree: Any) -> dict[Any, int]:
  """Bytes of `tree`'s arrays held by each addressable device (replicas counted on each)."""
  totals: dict[Any, int] = {}
  for leaf in jax.tree.leaves(tree):
    for shard in leaf.addressable_shards:
      totals[shard.device] = totals.get(shard.device, 0) + shard.data.nbytes
  return totals
