"""Multi-process start-up: one process of many joins the others before any JAX backend is used.

`maybe_initialize_distributed()` starts JAX's multi-controller runtime from explicit JAX_*
variables or a cluster JAX detects by itself (TPU pod, multi-slice, SLURM, Open MPI), and on CPU
opens the collectives' connection while the processes are in step; a single process does nothing.
"""

from __future__ import annotations

import logging
import os

import jax
import numpy as np
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

# jax.distributed.initialize's default; JAX_INITIALIZATION_TIMEOUT overrides it.
DEFAULT_INITIALIZATION_TIMEOUT_S = 300


def _int_env(name: str) -> int | None:
  value = os.environ.get(name)
  if value in (None, ""):
    return None
  try:
    return int(value)
  except ValueError as e:
    raise ValueError(f"environment variable {name}={value!r} must be an integer") from e


def _looks_like_multihost_cluster() -> bool:
  """Environments where `jax.distributed.initialize()` can detect everything by itself."""
  hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
  if len([h for h in hosts.split(",") if h]) > 1:  # Cloud TPU pod slice: one process per host.
    return True
  if os.environ.get("MEGASCALE_COORDINATOR_ADDRESS"):  # multi-slice TPU
    return True
  if (_int_env("SLURM_NTASKS") or 1) > 1 and os.environ.get("SLURM_JOB_ID"):
    return True
  if (_int_env("OMPI_COMM_WORLD_SIZE") or 1) > 1:
    return True
  return False


def maybe_initialize_distributed() -> bool:
  """Starts JAX's multi-controller runtime when this is one process of many; True if it did.

  Explicit: JAX_COORDINATOR_ADDRESS ("host:port"), JAX_NUM_PROCESSES, JAX_PROCESS_ID (and
  optionally JAX_LOCAL_DEVICE_IDS="0,1"). Otherwise a TPU pod, multi-slice, SLURM or Open MPI
  job is left to `jax.distributed.initialize()`'s own detection. A single process does nothing.
  JAX_INITIALIZATION_TIMEOUT (seconds, default JAX's 300) bounds how long a process waits for
  the others, at start-up and at the CPU collectives' first connection (`_connect_cpu_collectives`).
  Must run before anything touches a JAX backend (jax.devices(), the first array).
  """
  if jax.distributed.is_initialized():
    return True
  address = os.environ.get("JAX_COORDINATOR_ADDRESS")
  num_processes = _int_env("JAX_NUM_PROCESSES")
  process_id = _int_env("JAX_PROCESS_ID")
  timeout = _int_env("JAX_INITIALIZATION_TIMEOUT") or DEFAULT_INITIALIZATION_TIMEOUT_S
  if address or num_processes or process_id is not None:
    if not (address and num_processes and process_id is not None):
      raise ValueError(
          "multi-process run needs all of JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and "
          f"JAX_PROCESS_ID; got JAX_COORDINATOR_ADDRESS={address!r}, "
          f"JAX_NUM_PROCESSES={num_processes!r}, JAX_PROCESS_ID={process_id!r}"
      )
    if num_processes == 1:
      return False
    if not 0 <= process_id < num_processes:
      raise ValueError(
          f"JAX_PROCESS_ID={process_id} is outside [0, JAX_NUM_PROCESSES=" f"{num_processes})"
      )
    local_ids = os.environ.get("JAX_LOCAL_DEVICE_IDS")
    jax.distributed.initialize(
        coordinator_address=address,
        num_processes=num_processes,
        process_id=process_id,
        local_device_ids=[int(i) for i in local_ids.split(",")] if local_ids else None,
        initialization_timeout=timeout,
    )
  elif _looks_like_multihost_cluster():
    jax.distributed.initialize(initialization_timeout=timeout)
  else:
    return False
  _connect_cpu_collectives(timeout)
  logging.info(
      "jax.distributed: process %d of %d, %d local / %d global devices",
      jax.process_index(),
      jax.process_count(),
      jax.local_device_count(),
      jax.device_count(),
  )
  return True


def _connect_cpu_collectives(timeout_s: int) -> None:
  """Opens the CPU collectives' connection between all the processes now, while they are in step.

  JAX's CPU collectives (gloo) connect the processes of a device set at that set's first
  collective and give up after gloo's fixed 30 s (not configurable in jax 0.10): a process that
  reaches its first collective more than 30 s after another (still compiling or loading data on a
  busy machine) fails with "Gloo context initialization failed: DEADLINE_EXCEEDED". Later
  collectives reuse the connection and wait for XLA's collective timeout (minutes), so connecting
  the set of all devices here, right after a barrier whose timeout is `timeout_s`, makes the
  processes' later skew harmless for every computation over all devices (all of this project's
  meshes; a collective over a subset of the devices still connects at its first use). Other
  backends do not use gloo; nothing to do there.
  """
  if jax.process_count() == 1 or jax.default_backend() != "cpu":
    return
  mesh = Mesh(np.array(jax.devices()), ("all",))
  ones = jax.make_array_from_process_local_data(
      NamedSharding(mesh, P("all")),
      np.ones((jax.local_device_count(),), np.int32),
      (jax.device_count(),),
  )
  count = (
      jax.jit(lambda x: x.sum(), out_shardings=NamedSharding(mesh, P())).lower(ones).compile()
  )  # compiled before the barrier: the processes leave it ready to connect
  from jax._src import distributed as jax_distributed

  client = getattr(jax_distributed.global_state, "client", None)
  if client is not None and hasattr(client, "wait_at_barrier"):
    client.wait_at_barrier("linvit_jax_connect_cpu_collectives", timeout_s * 1000)
  total = int(np.asarray(count(ones).addressable_data(0)))
  if total != jax.device_count():
    raise RuntimeError(
        f"multi-process start-up: a sum over the {jax.device_count()} devices of "
        f"{jax.process_count()} processes gave {total}"
    )
