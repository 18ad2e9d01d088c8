"""evaluate.py: masked means over eval batches and the one top-1 rule (stages' training accuracy
and the eval top-1 both use it)."""

import jax.numpy as jnp
import numpy as np
import pytest

from linvit_jax.evaluation import evaluate
from linvit_jax.runtime import metrics
from linvit_jax.runtime import sharding


def test_evaluate_ignores_padding():
  mesh = sharding.make_mesh([("data", -1), ("fsdp", 1)])

  def eval_fn(params, batch):
    return {"correct": (batch["pred"] * params["scale"] == batch["labels"]).astype(jnp.float32)}

  batches = [
      {
          "pred": np.array([1, 2, 3, 4]),
          "labels": np.array([1, 0, 3, 9]),
          "_mask": np.array([1, 1, 1, 0], bool),
      },
      {
          "pred": np.array([5, 6, 7, 8]),
          "labels": np.array([5, 6, 0, 0]),
          "_mask": np.array([1, 1, 0, 0], bool),
      },
  ]
  out = evaluate.evaluate({"scale": jnp.ones((), jnp.int32)}, eval_fn, iter(batches), mesh)
  assert out == {"correct": pytest.approx(4 / 5), "num_examples": 5}


def test_top1_hits_integer_and_multi_hot_labels():
  logits = jnp.array([[0.1, 2.0, 0.3], [3.0, 0.0, 1.0], [0.0, 0.0, 5.0]])
  np.testing.assert_array_equal(metrics.top1_hits(logits, jnp.array([1, 2, 2])), [1, 0, 1])
  multi_hot = jnp.array([[0, 1, 1], [0, 1, 1], [1, 0, 0]], jnp.float32)
  hits = metrics.top1_hits(logits, multi_hot)
  assert hits.dtype == jnp.float32
  np.testing.assert_array_equal(hits, [1, 0, 0])


@pytest.mark.parametrize("attention", ["softmax", "hedgehog"])
def test_cls_attention_maps_are_distributions_and_jit_changes_nothing(attention):
  import jax

  from linvit_jax.models import vit

  model = vit.Model(
      10,
      width=32,
      depth=2,
      mlp_dim=64,
      num_heads=2,
      patch_size=(7, 7),
      attention=attention,
      pool_type="tok",
  )
  images = jax.random.normal(jax.random.PRNGKey(0), (3, 28, 28, 1))
  params = model.init(jax.random.PRNGKey(1), images)["params"]
  maps = evaluate.cls_attention_maps(model, params, images)
  assert maps.shape == (2, 3, 2, 4, 4)  # [layers, B, heads, h, w]
  total = maps.sum(axis=(-1, -2))  # the cls→cls weight is left out, so each row sums below 1
  assert np.all(maps >= 0) and np.all(total < 1) and np.all(total > 0.5)
  with jax.disable_jit():
    eager = evaluate.cls_attention_maps(model, params, images)
  np.testing.assert_allclose(maps, eager, atol=1e-5)
