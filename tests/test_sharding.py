"""sharding.py: mesh from config, fsdp rules, global batches, multi-process start-up.

Pure rules run in-process; facts that need 8 devices come from one subprocess
(tests/helpers/sharding_probe.py with --xla_force_host_platform_device_count=8).
"""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from linvit_jax.runtime import distributed
from linvit_jax.runtime import sharding
from tests.helpers.subprocs import HELPERS
from tests.helpers.subprocs import subprocess_env


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
  out = str(tmp_path_factory.mktemp("probe") / "probe.json")
  proc = subprocess.run(
      [sys.executable, os.path.join(HELPERS, "sharding_probe.py"), out],
      env=subprocess_env(8),
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert proc.returncode == 0, proc.stderr[-4000:]
  with open(out) as f:
    return json.load(f)


# ------------------------------------------------------------------------------------------------
# Mesh.


def test_make_mesh_single_device():
  mesh = sharding.make_mesh([("data", -1), ("fsdp", 1)])
  assert sharding.mesh_shape(mesh) == {"data": jax.device_count(), "fsdp": 1}
  assert sharding.batch_axes(mesh) == ("data", "fsdp")
  assert sharding.num_batch_shards(mesh) == jax.device_count()


@pytest.mark.parametrize(
    "cfg, words",
    [
        ([("data", 3), ("fsdp", 2)], ["(3, 2)", "6 devices", "8 devices are available"]),
        ([("data", 3), ("fsdp", -1)], ["8 devices", "multiple of 3"]),
        ([("data", -1), ("fsdp", -1)], ["at most one axis may be -1"]),
        ([("data", 4), ("data", 2)], ["'data' appears twice"]),
        ([("data", 0), ("fsdp", -1)], ["size 0"]),
        ([("data",)], ["(axis_name, size)"]),
        ([], ["empty"]),
    ],
)
def test_make_mesh_errors_name_devices_and_shape(cfg, words):
  fake_devices = [jax.devices()[0]] * 8  # the config is checked before the devices are used
  with pytest.raises(ValueError) as e:
    sharding.make_mesh(cfg, devices=fake_devices)
  for w in words:
    assert w in str(e.value), str(e.value)


def test_probe_meshes_on_8_devices(probe):
  assert probe["device_count"] == 8
  assert probe["mesh_shapes"]["data-1_fsdp1"] == {"data": 8, "fsdp": 1}
  assert probe["mesh_shapes"]["data4_fsdp-1"] == {"data": 4, "fsdp": 2}
  assert "6 devices" in probe["mesh_error"] and "8 devices are available" in probe["mesh_error"]
  assert "multiple of 3" in probe["mesh_error_rest"]


# ------------------------------------------------------------------------------------------------
# Parameter rules (pure: no devices needed).


def _shapes(**named):
  return {k: jax.ShapeDtypeStruct(v, np.float32) for k, v in named.items()}


def test_fsdp_splits_largest_divisible_dim_above_min_size():
  params = {
      "block": _shapes(
          wide=(384, 1536),
          tall=(1536, 384),
          bias=(1536,),
          odd_big=(5, 4000),
          indivisible=(4001, 7),
          qkv=(192, 3, 64),
      ),
      "scalar": jax.ShapeDtypeStruct((), np.float32),
  }
  specs = sharding.param_partition_specs(params, {"data": 2, "fsdp": 4})
  b = specs["block"]
  assert b["wide"] == P(None, "fsdp")
  assert b["tall"] == P("fsdp", None)
  assert b["bias"] == P()  # below min_size: replicated
  assert b["odd_big"] == P(None, "fsdp")
  assert b["indivisible"] == P()  # no dimension divisible by 4
  assert b["qkv"] == P("fsdp", None, None)
  assert specs["scalar"] == P()


def test_fsdp_axis_of_size_one_replicates_everything():
  params = _shapes(big=(1024, 1024))
  assert sharding.param_partition_specs(params, {"data": 8, "fsdp": 1})["big"] == P()
  assert sharding.param_partition_specs(params, {"data": 8})["big"] == P()


def test_rules_override_in_order():
  params = {
      "pos_embedding": jax.ShapeDtypeStruct((1, 197, 384), np.float32),
      "head": _shapes(kernel=(384, 1000), bias=(1000,)),
      "tiny": _shapes(kernel=(8, 16)),
  }
  rules = [
      ("pos_embedding", "replicate"),
      (r"head/kernel$", (None, "data")),
      (r"head/kernel$", "fsdp"),  # never reached: the first match wins
      (r"tiny/.*", "fsdp"),
  ]  # forced although below min_size
  specs = sharding.param_partition_specs(params, {"data": 2, "fsdp": 4}, rules=rules)
  assert specs["pos_embedding"] == P()
  assert specs["head"]["kernel"] == P(None, "data")
  assert specs["head"]["bias"] == P()
  assert specs["tiny"]["kernel"] == P(None, "fsdp")
  # re.fullmatch on the whole path: "kernel" alone names no leaf (re.search would take them all).
  specs = sharding.param_partition_specs(
      params, {"data": 2, "fsdp": 4}, rules=[("kernel", (None, "data"))]
  )
  assert specs["head"]["kernel"] == P(None, "fsdp")  # the automatic rule


@pytest.mark.parametrize(
    "spec, words",
    [
        ((None, "data"), ["head/kernel", "(384, 1001)", "dimension 1", "does not divide"]),
        (("model", None), ["head/kernel", "'model'"]),
        ((None, None, "fsdp"), ["head/kernel", "more entries"]),
        ("shard-please", ["'shard-please'"]),
    ],
)
def test_bad_rules_name_the_param(spec, words):
  params = {"head": _shapes(kernel=(384, 1001))}
  with pytest.raises(ValueError) as e:
    sharding.param_partition_specs(params, {"data": 2, "fsdp": 4}, rules=[("head/.*", spec)])
  for w in words:
    assert w in str(e.value), str(e.value)


def test_param_shardings_and_shard_tree_single_device():
  mesh = sharding.make_mesh([("data", -1), ("fsdp", 1)])
  tree = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.float32(2.0)}
  placed = sharding.shard_tree(tree, sharding.param_shardings(tree, mesh))
  np.testing.assert_array_equal(np.asarray(placed["a"]), tree["a"])
  assert sum(sharding.bytes_per_device(placed).values()) == 6 * 4 + 4


def test_fsdp_over_8_devices_holds_at_most_a_sixth_per_device(probe):
  b = probe["bytes"]
  ratio = b["max_per_device"] / b["replicated"]
  assert b["num_devices"] == 8
  assert ratio <= 1 / 6, ratio
  assert probe["specs"] == {
      "qkv_kernel": "P('fsdp', None, None)",
      "mlp_kernel": "P(None, 'fsdp')",
      "ln_scale": "P()",
  }


def test_optimizer_state_sharded_like_its_params(probe):
  specs = probe["state_specs"]
  assert specs["params/dense/kernel"] == "P(None, 'fsdp')"
  mirrors = [k for k in specs if k.endswith("dense/kernel") and "opt_state" in k]
  assert len(mirrors) == 2  # adam mu and nu
  assert all(specs[k] == "P(None, 'fsdp')" for k in mirrors)
  assert specs["step"] == specs["rng"] == "P()"


# ------------------------------------------------------------------------------------------------
# Batches.


def test_global_batch_on_8_devices(probe):
  b = probe["batch"]
  assert b["shape"] == [16, 3] and b["equal"]
  assert b["shard_shapes"] == [[2, 3]]  # 16 rows over data·fsdp = 8 shards
  assert b["rows"] == [0, 16]  # one process feeds all rows
  assert "multiple of 8" in probe["batch_error"] and "8 batch shards" in probe["batch_error"]
  assert "multiple of 32" in probe["batch_error_accum"]
  assert "4 accumulation steps" in probe["batch_error_accum"]
  assert probe["batch_ok"] is None


def test_make_global_batch_single_device():
  mesh = sharding.make_mesh([("data", -1), ("fsdp", 1)])
  local = {"image": np.ones((4, 2, 2, 1), np.float32), "labels": np.arange(4)}
  g = sharding.make_global_batch(local, mesh)
  assert g["image"].shape == (4, 2, 2, 1)
  np.testing.assert_array_equal(np.asarray(g["labels"]), np.arange(4))
  assert sharding.process_batch_rows(4, mesh) == slice(0, 4)
  with pytest.raises(ValueError, match="accumulation"):
    sharding.check_batch_size(6, mesh, accum_steps=4)
  with pytest.raises(ValueError, match="positive"):
    sharding.check_batch_size(0, mesh)


# ------------------------------------------------------------------------------------------------
# Multi-process start-up.


def test_initialize_distributed_is_a_noop_single_process(monkeypatch):
  for k in (
      "JAX_COORDINATOR_ADDRESS",
      "JAX_NUM_PROCESSES",
      "JAX_PROCESS_ID",
      "TPU_WORKER_HOSTNAMES",
      "MEGASCALE_COORDINATOR_ADDRESS",
      "SLURM_NTASKS",
      "OMPI_COMM_WORLD_SIZE",
  ):
    monkeypatch.delenv(k, raising=False)
  assert distributed.maybe_initialize_distributed() is False
  monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "localhost:1234")
  monkeypatch.setenv("JAX_NUM_PROCESSES", "1")
  monkeypatch.setenv("JAX_PROCESS_ID", "0")
  assert distributed.maybe_initialize_distributed() is False


def test_initialize_distributed_incomplete_env_is_an_error(monkeypatch):
  monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "localhost:1234")
  monkeypatch.delenv("JAX_NUM_PROCESSES", raising=False)
  monkeypatch.delenv("JAX_PROCESS_ID", raising=False)
  with pytest.raises(ValueError, match="JAX_NUM_PROCESSES"):
    distributed.maybe_initialize_distributed()
  monkeypatch.setenv("JAX_NUM_PROCESSES", "two")
  monkeypatch.setenv("JAX_PROCESS_ID", "0")
  with pytest.raises(ValueError, match="must be an integer"):
    distributed.maybe_initialize_distributed()
