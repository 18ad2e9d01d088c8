"""Numerics in the whole model: a bf16 student on extreme inputs stays finite, and FAVOR's random
features are the same for a seed in another process (the operator-level cases live in
tests/test_attention.py). Part of the robustness matrix (ROBUSTNESS.md lists every case and its
test).
"""

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from linvit_jax.models import checkpoints
from linvit_jax.models import vit
from tests.helpers import robust_config as rc
from tests.helpers.robust_common import SAME_XLA
from tests.helpers.subprocs import ROOT
from tests.helpers.subprocs import last_line
from tests.helpers.subprocs import subprocess_env


@pytest.mark.parametrize("fmap", ["elu1", "relu", "hedgehog", "favor", "chunked_softmax"])
def test_bf16_student_with_extreme_inputs_stays_finite(fmap):
  """bf16 matmuls under jit (a whole model: XLA:CPU once failed here on bf16×bf16→f32 dots), and
  inputs that push each feature map to its edge: q/k of norm ~1e3, q/k pre-activations ≤ -8
  (elu+1 ≈ 0, relu = 0: the normaliser is ε alone), all tokens equal (a constant image: zero
  LayerNorm variance)."""
  model = vit.Model(
      num_classes=10, attention=fmap, dtype_mm="bfloat16", head_zeroinit=False, **rc.MODEL
  )
  image = jax.random.normal(jax.random.PRNGKey(1), (2, 28, 28, 1))
  params = model.init(jax.random.PRNGKey(0), image)["params"]

  def edit(params, fn):
    flat = checkpoints.flatten(params)
    for name in list(flat):
      if "/query/" in name or "/key/" in name:
        flat[name] = fn(name, flat[name])
    return checkpoints.unflatten(flat)

  large = edit(params, lambda n, x: x * 300.0 if n.endswith("kernel") else x)
  negative = edit(params, lambda n, x: x * 0.0 + (-40.0 if n.endswith("bias") else 0.0))
  constant = jnp.full_like(image, 0.7)
  apply = jax.jit(lambda p, x: model.apply({"params": p}, x))
  for what, p, x in (
      ("large-norm q/k", large, image),
      ("q/k <= -8", negative, image),
      ("all tokens equal", params, constant),
      ("all equal + large", large, constant),
  ):
    logits, out = apply(p, x)
    for name, value in (("logits", logits), ("encoded", out["encoded"])):
      value = np.asarray(value.astype(jnp.float32))
      assert np.isfinite(value).all(), (fmap, what, name)
    assert np.abs(np.asarray(logits, np.float32)).max() > 0, (fmap, what)  # a real output


_FAVOR_PROBE = """
import jax, numpy as np
from linvit_jax.models import vit
from tests.helpers import robust_config as rc
m = vit.Model(num_classes=10, attention={"kind": "linear", "feature_map": "favor",
              "favor_seed": 3, "num_features": 16}, **rc.MODEL)
x = jax.random.normal(jax.random.PRNGKey(1), (2, 28, 28, 1))
p = m.init(jax.random.PRNGKey(0), x)["params"]
print(repr(np.asarray(m.apply({"params": p}, x)[1]["pre_logits"]).tobytes().hex()))
"""


def test_favor_features_are_the_same_for_a_seed_in_a_fresh_process():
  other = subprocess.run(
      [sys.executable, "-c", _FAVOR_PROBE],
      cwd=ROOT,
      env=subprocess_env(1, XLA_FLAGS=SAME_XLA),
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert other.returncode == 0, other.stderr[-2000:]

  def logits(seed):
    m = vit.Model(
        num_classes=10,
        attention={
            "kind": "linear",
            "feature_map": "favor",
            "favor_seed": seed,
            "num_features": 16,
        },
        **rc.MODEL,
    )
    x = jax.random.normal(jax.random.PRNGKey(1), (2, 28, 28, 1))
    p = m.init(jax.random.PRNGKey(0), x)["params"]
    return repr(np.asarray(m.apply({"params": p}, x)[1]["pre_logits"]).tobytes().hex())

  assert last_line(other.stdout) == logits(3)  # same seed, another process: the same bits
  assert logits(4) != logits(3)  # another seed: other features
