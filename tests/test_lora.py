"""lora.py: low-rank updates as an optimizer transformation, through optim.make_optimizer and a
checkpointed, resumed stage."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from linvit_jax import preflight
from linvit_jax.conversion import lora
from linvit_jax.conversion import optim
from linvit_jax.runtime import tree as tree_lib
from linvit_jax.runtime.errors import ConfigError
from tests import test_train
from tests.helpers import tiny_task as tt
from tests.helpers.stage_configs import finetune_only


def _params():
  rng = np.random.default_rng(0)
  out_scale = np.array([1e-3, 1, 1, 1, 1, 2], np.float32)  # one LayerScale-sized column
  return {
      "qkv": {  # DenseGeneral [in, heads, head_dim]: the matrix [6, 10]
          "kernel": rng.normal(size=(6, 2, 5)).astype(np.float32),
          "bias": rng.normal(size=(2, 5)).astype(np.float32),
      },
      "out": {"kernel": rng.normal(size=(2, 5, 6)).astype(np.float32) * out_scale},  # [10, 6]
  }


X = np.random.default_rng(1).normal(size=(8, 6)).astype(np.float32)


def _loss(p):
  h = jnp.tanh(jnp.einsum("bi,ihd->bhd", X, p["qkv"]["kernel"]) + p["qkv"]["bias"])
  return jnp.mean((jnp.einsum("bhd,hdo->bo", h, p["out"]["kernel"]) - 1.0) ** 2)


def _walk(tx, params, steps):
  state = tx.init(params)
  p = params
  for _ in range(steps):
    updates, state = tx.update(jax.grad(_loss)(p), state, p)
    p = optax.apply_updates(p, updates)
  return p, state


def _lora_state(state):
  found = [
      s
      for s in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, lora.LoraState))
      if isinstance(s, lora.LoraState)
  ]
  assert len(found) == 1
  return found[0]


OPT = dict(lr=1e-2, wd=0.0, grad_clip=0.0, warmup_steps=2, lora_rank=2)


@pytest.mark.parametrize("update_scale", ["absolute", "param_rms"])
def test_the_walk_equals_lora_written_out(update_scale):
  """Kernels follow W₀ + (A·B)⊙s with A, B stepped by Adam on the reparametrised loss; the bias
  follows plain Adam."""
  params, steps = _params(), 6
  opt = {**OPT, "update_scale": update_scale}
  tx, _ = optim.make_optimizer(opt, steps, optim.trainable_mask(params))
  got, state = _walk(tx, params, steps)
  start = _lora_state(tx.init(params)).factors

  def merged(f):  # the explicit reparametrisation
    out = {"qkv": {"bias": f["bias"]}, "out": {}}
    for name in ("qkv", "out"):
      w0 = params[name]["kernel"]
      m, n = lora.matrix_shape(w0.shape)
      s = start[name]["kernel"]["scale"]
      delta = (f[name]["a"] @ f[name]["b"]) * s
      out[name]["kernel"] = (w0.reshape(m, n) + delta).reshape(w0.shape)
    return out

  factors = {
      name: {"a": start[name]["kernel"]["lora_a"], "b": start[name]["kernel"]["lora_b"]}
      for name in ("qkv", "out")
  }
  factors["bias"] = jnp.asarray(params["qkv"]["bias"])
  plain = {k: v for k, v in OPT.items() if k != "lora_rank"}
  # Absolute Adam steps on the factors (the column scale is in the product), the stage's own
  # update scale on the bias; without clipping the two are independent.
  ref_txs = [
      optim.make_optimizer(plain, steps, optim.trainable_mask(factors, r"(qkv|out)/.*"))[0],
      optim.make_optimizer(
          {**plain, "update_scale": update_scale}, steps, optim.trainable_mask(factors, "bias")
      )[0],
  ]
  ref_states, f = [t.init(factors) for t in ref_txs], factors
  for _ in range(steps):
    grads = jax.grad(lambda f: _loss(merged(f)))(f)
    both = [t.update(grads, s, f) for t, s in zip(ref_txs, ref_states)]
    ref_states = [s for _, s in both]
    f = optax.apply_updates(f, jax.tree.map(jnp.add, both[0][0], both[1][0]))
  want = merged(f)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
  # and the factors the state carries are the ones of the written-out walk
  end = _lora_state(state).factors
  np.testing.assert_allclose(end["out"]["kernel"]["lora_b"], f["out"]["b"], rtol=1e-5, atol=1e-6)


def test_kernels_move_within_rank_r_and_tiny_columns_move_relatively():
  params = _params()
  for scale in ("param_rms", "absolute"):
    tx, _ = optim.make_optimizer({**OPT, "update_scale": scale}, 8, optim.trainable_mask(params))
    got, _ = _walk(tx, params, 8)
    for name in ("qkv", "out"):
      w0 = params[name]["kernel"]
      m, n = lora.matrix_shape(w0.shape)
      delta = (np.asarray(got[name]["kernel"]) - w0).reshape(m, n)
      s = np.linalg.svd(delta, compute_uv=False)
      assert s[0] > 1e-3 and s[2] < 1e-5 * s[0]  # it moved, within rank 2
    moved = np.abs((np.asarray(got["out"]["kernel"]) - params["out"]["kernel"]).reshape(10, 6))
    col_rms = np.sqrt(np.mean(params["out"]["kernel"].reshape(10, 6) ** 2, axis=0))
    relative = moved.max(axis=0) / col_rms
    if scale == "param_rms":  # every column by a like fraction of its size
      assert relative[0] < 10 * np.median(relative[1:])
    else:  # absolute steps move the 1e-3 column by many times its size
      assert relative[0] > 50 * np.median(relative[1:])


@pytest.mark.parametrize(
    "shape,matrix",
    [
        ((384, 6, 64), (384, 384)),  # q/k/v DenseGeneral
        ((6, 64, 384), (384, 384)),  # out projection
        ((14, 14, 3, 384), (588, 384)),  # patch embedding
        ((1, 256, 384), (256, 384)),  # a position embedding
        ((384, 1536), (384, 1536)),  # Dense
    ],
)
def test_matrix_view_is_the_most_square_split(shape, matrix):
  assert lora.matrix_shape(shape) == matrix


def test_only_kernels_wider_than_the_rank_are_low_rank():
  pattern = tree_lib.compile_patterns(r".*/kernel")
  assert lora.is_low_rank("a/kernel", (384, 6, 64), 8, pattern)
  assert not lora.is_low_rank("a/bias", (6, 64), 8, pattern)  # not a kernel: full steps
  assert not lora.is_low_rank("a/kernel", (384,), 8, pattern)
  assert not lora.is_low_rank("a/kernel", (3, 3, 384), 16, pattern)  # [9, 384]: rank ≥ 9
  with pytest.raises(ValueError, match="2 or more axes"):
    lora.matrix_split((5,))


@pytest.mark.parametrize("bad", [-1, 1.5, True, "8"])
def test_a_bad_rank_is_refused_naming_the_field(bad):
  params = _params()
  with pytest.raises(ValueError, match=r"optimizer.lora_rank="):
    optim.make_optimizer({**OPT, "lora_rank": bad}, 4, optim.trainable_mask(params))


def test_a_bad_rank_fails_before_compute_naming_the_stage():
  config = finetune_only(lora_rank=-2)
  with pytest.raises(ConfigError, match=r"config.finetune.optimizer: optimizer.lora_rank=-2"):
    preflight.validate(config)
  config.finetune.optimizer.lora_rank = 4
  preflight.validate(config)


def test_a_low_rank_stage_resumes_to_the_same_params(tmp_path):
  """The factors are optimizer state: checkpointed with it, so a stage cut and resumed ends where
  the uninterrupted one does; frozen leaves stay put and kernels move within the rank."""
  opt = {**tt.stage_cfg()["optimizer"], "lora_rank": 2}
  params, history = test_train._run(tmp_path / "full", optimizer=opt)
  assert all(np.isfinite(test_train._losses(history)))
  resumed = test_train._cut_after_step_3_and_resumed(tmp_path / "cut", optimizer=opt)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(resumed)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
  start = tt.init_params(jax.random.split(jax.random.PRNGKey(0))[0])  # run_stage's init key
  np.testing.assert_array_equal(np.asarray(params["Dense_0"]["bias"]), start["Dense_0"]["bias"])
  for name in ("Dense_0", "Dense_1"):
    delta = np.asarray(params[name]["kernel"]) - np.asarray(start[name]["kernel"])
    s = np.linalg.svd(delta, compute_uv=False)
    assert s[0] > 0 and s[2] < 1e-4 * s[0]


def test_a_scanned_encoder_gets_factors_per_layer():
  """A leading depth axis (`Transformer/encoderblock/...`) is a batch axis of the factors: each
  layer's kernel moves within rank r, the stack as a whole does not."""
  rng = np.random.default_rng(2)
  params = {"Transformer": {"encoderblock": {"Dense_0": {"kernel": rng.normal(size=(3, 8, 12))}}}}
  params = jax.tree.map(lambda x: x.astype(np.float32), params)
  x = rng.normal(size=(5, 8)).astype(np.float32)

  def loss(p):
    k = p["Transformer"]["encoderblock"]["Dense_0"]["kernel"]
    return sum(jnp.mean(jnp.sin(x @ k[i] + i)) for i in range(3))

  tx, _ = optim.make_optimizer(
      {**OPT, "update_scale": "param_rms"}, 6, optim.trainable_mask(params)
  )
  state, p = tx.init(params), params
  for _ in range(6):
    updates, state = tx.update(jax.grad(loss)(p), state, p)
    p = optax.apply_updates(p, updates)
  f = _lora_state(state).factors["Transformer"]["encoderblock"]["Dense_0"]["kernel"]
  assert f["lora_a"].shape == (3, 8, 2) and f["lora_b"].shape == (3, 2, 12)
  col_rms = np.sqrt(
      np.mean(params["Transformer"]["encoderblock"]["Dense_0"]["kernel"] ** 2, axis=1)
  )
  np.testing.assert_allclose(f["scale"], col_rms, rtol=1e-5)  # each layer's own columns
  delta = np.asarray(p["Transformer"]["encoderblock"]["Dense_0"]["kernel"]) - np.asarray(
      params["Transformer"]["encoderblock"]["Dense_0"]["kernel"]
  )
  for layer in delta:
    s = np.linalg.svd(layer, compute_uv=False)
    assert s[0] > 1e-4 and s[2] < 1e-4 * s[0]
  stacked = np.linalg.svd(delta.reshape(24, 12), compute_uv=False)
  assert stacked[2] > 1e-3 * stacked[0]  # three layers' own directions, not one rank-2 update


def test_weight_decay_acts_on_the_factors_and_pulls_towards_the_start():
  params = _params()
  moved = {}
  for wd in (0.0, 0.5):
    tx, _ = optim.make_optimizer({**OPT, "wd": wd}, 8, optim.trainable_mask(params))
    got, _ = _walk(tx, params, 8)
    moved[wd] = np.linalg.norm(np.asarray(got["out"]["kernel"]) - params["out"]["kernel"])
  assert 0 < moved[0.5] < 0.8 * moved[0.0]


def test_the_seed_draws_the_a_factors():
  """The seed reaches LoRA's A (issue 39: seeds that vary every random draw): the same seed draws
  the same A, another seed another A, and B starts at zero either way."""
  params = _params()
  mask = optim.trainable_mask(params)

  def a_factors(seed):
    tx, _ = optim.make_optimizer(OPT, 8, mask, seed=seed)
    state = _lora_state(tx.init(params))
    return [
        np.asarray(f["lora_a"])
        for f in jax.tree.leaves(
            state.factors, is_leaf=lambda x: isinstance(x, dict) and "lora_a" in x
        )
    ]

  same, again, other = a_factors(3), a_factors(3), a_factors(4)
  assert same and all(np.array_equal(x, y) for x, y in zip(same, again))
  assert all(not np.allclose(x, y) for x, y in zip(same, other))
