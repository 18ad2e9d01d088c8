"""One process of a multi-process JAX job that sums a global array; run by launch/local_multihost.py.

Each process contributes its own rows (process i: the values i*L .. i*L+L-1, L = local devices),
the rows are stitched into one global array sharded over every device of every process, and the
sum is computed twice: by a jitted reduction over the global array and by an explicit `psum`
across the mesh. Every process prints one line

  MULTIHOST_SUM process=<i> processes=<P> devices=<D> local_devices=<L> sum=<s> psum=<s>

so a test can check that all processes agree and see the whole (not their local part).
Multi-process start-up goes through linvit_jax.runtime.distributed.maybe_initialize_distributed,
i.e. the JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID contract the launchers rely
on.
MULTIHOST_SUM_DELAY="<process id>:<seconds>" makes that process sleep between start-up and its
first collective (a process that is late, e.g. still compiling on a busy machine).
"""

from __future__ import annotations

import os
import time

import numpy as np


def main() -> None:
  from linvit_jax.runtime import distributed  # before anything touches a JAX backend

  distributed.maybe_initialize_distributed()

  import jax
  import jax.numpy as jnp
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  local = jax.local_device_count()
  pid = jax.process_index()
  late, _, delay = os.environ.get("MULTIHOST_SUM_DELAY", "").partition(":")
  if late and int(late) == pid:
    time.sleep(float(delay))
  mesh = jax.make_mesh((jax.device_count(),), ("data",))
  spec = NamedSharding(mesh, P("data"))
  rows = np.arange(pid * local, (pid + 1) * local, dtype=np.float32)
  global_x = jax.make_array_from_process_local_data(spec, rows, (jax.device_count(),))

  total = jax.jit(jnp.sum, out_shardings=NamedSharding(mesh, P()))(global_x)

  psum = jax.jit(
      jax.shard_map(
          lambda x: jax.lax.psum(jnp.sum(x), "data"), mesh=mesh, in_specs=P("data"), out_specs=P()
      )
  )(global_x)

  print(
      f"MULTIHOST_SUM process={pid} processes={jax.process_count()} "
      f"devices={jax.device_count()} local_devices={local} "
      f"sum={float(np.asarray(total.addressable_data(0))):g} "
      f"psum={float(np.asarray(psum.addressable_data(0))):g}",
      flush=True,
  )


if __name__ == "__main__":
  main()
