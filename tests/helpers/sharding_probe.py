"""Sharding facts measured on 8 simulated CPU devices, written as JSON for tests/test_sharding.py.

XLA_FLAGS=--xla_force_host_platform_device_count=8 python tests/helpers/sharding_probe.py OUT
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np


def _error(fn) -> str | None:
  try:
    fn()
  except ValueError as e:
    return str(e)
  return None


def main(out: str) -> None:
  import jax
  import jax.numpy as jnp

  from linvit_jax.conversion import optim
  from linvit_jax.conversion import train_step
  from linvit_jax.models import vit
  from linvit_jax.runtime import sharding
  from linvit_jax.runtime import tree as tree_lib

  r: dict = {"device_count": jax.device_count()}
  r["mesh_shapes"] = {
      "data-1_fsdp1": sharding.mesh_shape(sharding.make_mesh([("data", -1), ("fsdp", 1)])),
      "data4_fsdp-1": sharding.mesh_shape(sharding.make_mesh([("data", 4), ("fsdp", -1)])),
  }
  r["mesh_error"] = _error(lambda: sharding.make_mesh([("data", 3), ("fsdp", 2)]))
  r["mesh_error_rest"] = _error(lambda: sharding.make_mesh([("data", 3), ("fsdp", -1)]))

  # A real ViT-Ti/16 parameter tree (zeros), fsdp over all 8 devices vs replicated.
  model = vit.Model(num_classes=1000, variant="Ti/16")
  shapes = jax.eval_shape(
      lambda k: model.init(k, jnp.zeros((1, 224, 224, 3)))["params"], jax.random.PRNGKey(0)
  )
  zeros = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), shapes)
  fsdp_mesh = sharding.make_mesh([("data", 1), ("fsdp", -1)])
  params = sharding.shard_tree(zeros, sharding.param_shardings(shapes, fsdp_mesh))
  per_device = sharding.bytes_per_device(params)
  r["bytes"] = {
      "max_per_device": max(per_device.values()),
      "min_per_device": min(per_device.values()),
      "replicated": sum(z.nbytes for z in jax.tree.leaves(zeros)),
      "num_devices": len(per_device),
  }
  block = sharding.param_shardings(shapes, fsdp_mesh)["Transformer"]["encoderblock_0"]
  r["specs"] = {
      "qkv_kernel": str(block["MultiHeadDotProductAttention_0"]["query"]["kernel"].spec),
      "mlp_kernel": str(block["MlpBlock_0"]["Dense_0"]["kernel"].spec),
      "ln_scale": str(block["LayerNorm_0"]["scale"].spec),
  }

  # The optimizer state follows its params (mu/nu sharded like the kernel they mirror).
  mesh42 = sharding.make_mesh([("data", 4), ("fsdp", 2)])
  small = {
      "dense": {
          "kernel": jax.ShapeDtypeStruct((64, 512), jnp.float32),
          "bias": jax.ShapeDtypeStruct((512,), jnp.float32),
      }
  }
  mask = {"dense": {"kernel": True, "bias": True}}
  tx, _ = optim.make_optimizer({}, 10, mask)
  abstract = jax.eval_shape(
      lambda p: train_step.init_train_state(p, tx, jax.random.PRNGKey(0)), small
  )
  sh = sharding.state_shardings(abstract, mesh42, min_size=1024)
  flat = jax.tree_util.tree_flatten_with_path(sh)[0]
  r["state_specs"] = {tree_lib.path_str(p): str(s.spec) for p, s in flat}

  # Global batch assembly: 16 rows over the 8 batch shards of the (4, 2) mesh.
  local = {
      "image": np.arange(16 * 3, dtype=np.float32).reshape(16, 3),
      "labels": np.arange(16, dtype=np.int32),
  }
  g = sharding.make_global_batch(local, mesh42)
  r["batch"] = {
      "shape": list(g["image"].shape),
      "shard_shapes": sorted({s.data.shape for s in g["image"].addressable_shards}),
      "equal": bool(np.array_equal(np.asarray(g["image"]), local["image"])),
      "rows": [
          sharding.process_batch_rows(16, mesh42).start,
          sharding.process_batch_rows(16, mesh42).stop,
      ],
  }
  r["batch_error"] = _error(lambda: sharding.check_batch_size(12, mesh42))
  r["batch_error_accum"] = _error(lambda: sharding.check_batch_size(16, mesh42, accum_steps=4))
  r["batch_ok"] = _error(lambda: sharding.check_batch_size(32, mesh42, accum_steps=4))
  with open(out, "w") as f:
    json.dump(r, f, default=list)


if __name__ == "__main__":
  sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
  main(sys.argv[1])
