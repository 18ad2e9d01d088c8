"""optim.py: trainable masks, the schedule, big_vision's optimizer, and defaults from config_lib."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from linvit_jax.configuration import config_lib
from linvit_jax.conversion import optim
from linvit_jax.conversion import train

VIT_LIKE = {  # per-block and scanned encoder paths, and a head
    "Transformer": {
        "encoderblock_0": {
            "MultiHeadDotProductAttention_0": {
                "query": {"kernel": np.zeros((4, 4))},
                "feature_map_q": {"w": np.zeros(2)},
            },
            "MlpBlock_0": {"Dense_0": {"kernel": np.zeros((4, 8))}},
        },
        "encoderblock": {"MultiHeadDotProductAttention_0": {"out": {"bias": np.zeros((2, 4))}}},
    },
    "head": {"kernel": np.zeros((4, 3)), "bias": np.zeros(3)},
}


def _true_paths(mask):
  return sorted(
      "/".join(k.key for k in p) for p, m in jax.tree_util.tree_flatten_with_path(mask)[0] if m
  )


def test_trainable_mask_names_regexes_callables_and_trees():
  attn = [
      "Transformer/encoderblock/MultiHeadDotProductAttention_0/out/bias",
      "Transformer/encoderblock_0/MultiHeadDotProductAttention_0/feature_map_q/w",
      "Transformer/encoderblock_0/MultiHeadDotProductAttention_0/query/kernel",
  ]
  assert _true_paths(optim.trainable_mask(VIT_LIKE, "distill_attention")) == attn
  assert _true_paths(optim.trainable_mask(VIT_LIKE, "attention")) == attn
  # attention_routing: v and out stay the teacher's (here the scanned block's out bias).
  assert _true_paths(optim.trainable_mask(VIT_LIKE, "attention_routing")) == attn[1:]
  # attention_features: q and k stay the teacher's.
  assert _true_paths(optim.trainable_mask(VIT_LIKE, "attention_features")) == attn[:2]
  everything = _true_paths(optim.trainable_mask(VIT_LIKE, None))
  assert len(everything) == 6
  assert _true_paths(optim.trainable_mask(VIT_LIKE, "all")) == everything
  assert _true_paths(optim.trainable_mask(VIT_LIKE, "finetune")) == everything
  # A regex is matched against the whole path (re.fullmatch), as in every other path field.
  assert _true_paths(optim.trainable_mask(VIT_LIKE, "head/.*")) == ["head/bias", "head/kernel"]
  assert _true_paths(optim.trainable_mask(VIT_LIKE, ".*/kernel")) == [
      "Transformer/encoderblock_0/MlpBlock_0/Dense_0/kernel",
      "Transformer/encoderblock_0/MultiHeadDotProductAttention_0/query/kernel",
      "head/kernel",
  ]
  with pytest.raises(ValueError, match="'kernel' selects no parameters"):
    optim.trainable_mask(VIT_LIKE, "kernel")
  mask = optim.trainable_mask(VIT_LIKE, lambda p: jax.tree.map(lambda x: x.ndim == 1, p))
  assert _true_paths(mask) == [
      "Transformer/encoderblock_0/MultiHeadDotProductAttention_0/" "feature_map_q/w",
      "head/bias",
  ]
  assert optim.trainable_mask(mask, mask) == mask  # a tree of bools passes through
  assert all(
      type(v) is bool
      for v in jax.tree.leaves(optim.trainable_mask({"a": np.zeros(2)}, {"a": np.bool_(True)}))
  )


def test_frozen_leaves_have_no_optimizer_state():
  params = {"a": np.ones((4, 4), np.float32), "b": np.ones((4,), np.float32)}
  mask = optim.trainable_mask(params, r"a")
  assert mask == {"a": True, "b": False}
  tx, _ = optim.make_optimizer(dict(wd=0.0, grad_clip=0.0), 4, mask)
  state = jax.eval_shape(tx.init, params)
  n_state = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state) if x.ndim)
  assert n_state == 2 * 16  # adam mu and nu of "a" only
  assert set(state.inner_states) == {"trained", "frozen"}  # checkpointed opt_state keys
  updates, _ = jax.jit(lambda p: tx.update(p, tx.init(p), p))(params)
  assert not np.any(np.asarray(updates["b"])) and np.all(np.asarray(updates["a"]))


def test_schedule_warmup_then_cosine():
  opt = dict(lr=1.0, warmup_steps=10, end_lr_ratio=0.1)
  scheds = [
      optim.make_schedule(dict(opt, schedule=k), 110) for k in ("cosine", "linear", "constant")
  ]
  at = jnp.array([0, 5, 10, 60, 100, 110])
  cos, lin, const = (np.asarray(v) for v in jax.jit(lambda t: [f(t) for f in scheds])(at))
  np.testing.assert_allclose(
      cos, [0, 0.5, 1, 0.55, 0.1 + 0.9 * (1 + np.cos(0.9 * np.pi)) / 2, 0.1], atol=1e-6
  )
  np.testing.assert_allclose(lin, [0, 0.5, 1, 0.55, 0.19, 0.1], atol=1e-6)
  np.testing.assert_allclose(const, [0, 0.5, 1, 1, 1, 1], atol=1e-6)
  with pytest.raises(ValueError, match="'cosine', 'linear' or 'constant'"):
    optim.make_schedule(dict(opt, schedule="step"), 10)


def test_weight_decay_has_big_vision_semantics():
  """wd is added after scale(lr), follows the schedule's shape only and decays `.*/kernel` only:
  big_vision's optax.make, written out by hand for adam's first step (update = ±1 per element)."""
  params = {
      "Dense_0": {
          "kernel": np.full((2, 2), 2.0, np.float32),
          "bias": np.full((2,), 2.0, np.float32),
      },
      "pos_embedding": np.full((1, 3, 2), 2.0, np.float32),
  }
  grads = jax.tree.map(np.ones_like, params)
  mask = optim.trainable_mask(params, None)
  lr, wd, warmup = 1e-2, 0.1, 4
  opt = dict(lr=lr, wd=wd, warmup_steps=warmup, schedule="constant", grad_clip=0.0)
  tx, schedule = optim.make_optimizer(opt, 10, mask)
  state = tx.init(params)
  for step in range(3):  # warmup: the schedule's shape s(t) = t / warmup scales lr and wd alike
    updates, state = tx.update(grads, state, params)
    s = float(schedule(step)) / lr
    assert s == pytest.approx(step / warmup)
    adam = 1.0  # first adam steps on a constant gradient: m/sqrt(v) = 1
    np.testing.assert_allclose(updates["Dense_0"]["kernel"], -s * (lr * adam + wd * 2.0), rtol=1e-4)
    np.testing.assert_allclose(updates["Dense_0"]["bias"], -s * lr * adam, rtol=1e-4)
    np.testing.assert_allclose(updates["pos_embedding"], -s * lr * adam, rtol=1e-4)


def test_defaults_come_from_config_lib():
  """A block that omits fields means what the config's block means: one table of defaults."""
  assert optim.optimizer_settings(None) == config_lib.OPTIMIZER_DEFAULTS
  block = config_lib.stage("finetune", steps=40, batch_size=8, lr=3e-4, warmup_steps=2)
  minimal = {
      "name": "x",
      "steps": 40,
      "batch_size": 8,
      "optimizer": {"lr": 3e-4, "warmup_steps": 2, "wd": None},
  }
  got = train.stage_settings(minimal)
  for k, v in block.items():
    if k == "optimizer":
      assert got[k] == {**config_lib.OPTIMIZER_DEFAULTS, **v}
    elif k in got:
      assert got[k] == v, k
  assert got["optimizer"]["wd"] == 1e-4 and got["optimizer"]["grad_clip"] == 1.0
  with pytest.raises(ValueError, match=r"unknown optimizer field\(s\) \['learning_rate'\]"):
    optim.optimizer_settings({"learning_rate": 0.1})
  with pytest.raises(ValueError, match=r"unknown optimizer field\(s\) \['learning_rate'\]"):
    config_lib.optimizer(0.1, learning_rate=0.1)
  # Every optimizer field reaches the block's `optimizer`, not the stage's top level.
  block = config_lib.stage("train", steps=4, batch_size=8, lr=1e-3, end_lr_ratio=0.1, b1=0.95)
  assert block["optimizer"]["end_lr_ratio"] == 0.1 and block["optimizer"]["b1"] == 0.95
  assert "end_lr_ratio" not in block and "b1" not in block


def test_param_rms_updates_are_relative_per_output_column():
  # Two columns 1000x apart in scale (a folded LayerScale): with absolute steps both move by the
  # same amount; with update_scale="param_rms" each moves by the same fraction of its own RMS.
  kernel = np.concatenate([np.full((4, 1), 1e-3), np.full((4, 1), 1.0)], axis=1).astype(np.float32)
  params = {"dense": {"kernel": jnp.asarray(kernel)}, "zero": jnp.zeros(3), "v": jnp.full(3, 2.0)}
  grads = jax.tree.map(jnp.ones_like, params)
  mask = optim.trainable_mask(params)
  base = dict(lr=1e-2, warmup_steps=0, schedule="constant", grad_clip=0.0, wd=0.0)

  def first_update(**kw):
    tx, _ = optim.make_optimizer({**base, **kw}, 10, mask)
    return tx.update(grads, tx.init(params), params)[0]

  absolute = first_update()
  np.testing.assert_allclose(absolute["dense"]["kernel"], -1e-2, rtol=1e-4)
  relative = first_update(update_scale="param_rms", param_scale_floor=1e-4)
  np.testing.assert_allclose(relative["dense"]["kernel"][:, 0], -1e-5, rtol=1e-4)
  np.testing.assert_allclose(relative["dense"]["kernel"][:, 1], -1e-2, rtol=1e-4)
  np.testing.assert_allclose(relative["v"], -2e-2, rtol=1e-4)  # a vector: its whole RMS
  np.testing.assert_allclose(relative["zero"], -1e-6, rtol=1e-4)  # zeros move at the floor
  # DenseGeneral out kernels [heads, head_dim, out]: one scale per output feature.
  out = jnp.asarray(np.random.default_rng(0).normal(size=(2, 3, 4)) * [1e-3, 1.0, 1.0, 5.0])
  want = np.sqrt(np.mean(np.asarray(out) ** 2, axis=(0, 1)))
  np.testing.assert_allclose(optim.column_rms(out, 1e-4)[0, 0], want, rtol=1e-5)
  with pytest.raises(ValueError, match="update_scale='relative'"):
    optim.make_optimizer({**base, "update_scale": "relative"}, 10, mask)


def test_param_rms_keeps_a_scanned_encoders_layers_apart():
  # A scanned encoder stacks its layers on a leading axis: each layer's columns get their own
  # scales, exactly those of the same layer in a per-block tree (not an RMS over all layers).
  rng = np.random.default_rng(0)
  kernels = rng.normal(size=(3, 4, 5)) * np.array([1e-3, 1.0, 30.0])[:, None, None]
  biases = rng.normal(size=(3, 5)) * np.array([1e-4, 1.0, 10.0])[:, None]
  leaf = lambda k, b: {
      "MlpBlock_0": {"Dense_0": {"kernel": jnp.asarray(k), "bias": jnp.asarray(b)}}
  }
  scanned = {"Transformer": {"encoderblock": leaf(kernels, biases)}}
  per_block = {"Transformer": {f"encoderblock_{i}": leaf(kernels[i], biases[i]) for i in range(3)}}
  base = dict(lr=1e-2, warmup_steps=0, schedule="constant", grad_clip=0.0, wd=0.0)
  base.update(update_scale="param_rms", param_scale_floor=1e-6)

  def first_update(params):
    tx, _ = optim.make_optimizer(base, 10, optim.trainable_mask(params))
    grads = jax.tree.map(jnp.ones_like, params)
    return tx.update(grads, tx.init(params), params)[0]

  got = first_update(scanned)["Transformer"]["encoderblock"]["MlpBlock_0"]["Dense_0"]
  for i in range(3):
    want = first_update(per_block)["Transformer"][f"encoderblock_{i}"]["MlpBlock_0"]["Dense_0"]
    np.testing.assert_allclose(got["kernel"][i], want["kernel"], rtol=1e-5)
    np.testing.assert_allclose(got["bias"][i], want["bias"], rtol=1e-5)
  # The smallest layer moves by ~lr × its own scale, not the stack's.
  assert np.abs(got["kernel"][0]).max() < 1e-4 < np.abs(got["kernel"][2]).min()


def test_param_ema_averages_the_params_after_each_update_and_is_what_a_stage_hands_on():
  params = {"w": jnp.asarray([1.0, -2.0]), "frozen": jnp.asarray([3.0])}
  mask = {"w": True, "frozen": False}
  base = dict(lr=0.1, warmup_steps=0, schedule="constant", grad_clip=0.0, wd=0.0, name="sgd")
  tx, _ = optim.make_optimizer({**base, "momentum": 0.0, "ema_decay": 0.5}, 10, mask)
  state = tx.init(params)
  assert optim.stage_result(params, state)["w"].tolist() == [1.0, -2.0]  # starts at the params
  want, p = np.asarray(params["w"]), params
  for t in range(4):
    grads = {"w": jnp.asarray([1.0, 2.0]) * (t + 1), "frozen": jnp.ones(1)}
    updates, state = tx.update(grads, state, p)
    p = jax.tree.map(lambda a, u: a + u, p, updates)
    beta = min(0.5, (1 + t) / (10 + t))  # the warm-up, then the decay
    want = beta * want + (1 - beta) * np.asarray(p["w"])
  result = optim.stage_result(p, state)
  np.testing.assert_allclose(result["w"], want, rtol=1e-6)
  assert not np.allclose(result["w"], p["w"])  # the average, not the last params
  assert result["frozen"].tolist() == [3.0] and result["w"].dtype == p["w"].dtype
  # off (the default): no average kept, the stage hands on its params
  tx0, _ = optim.make_optimizer({**base, "momentum": 0.0}, 10, mask)
  assert optim.stage_result(p, tx0.init(p)) is p
  for bad in (1.0, -0.1):
    with pytest.raises(ValueError, match="ema_decay"):
      optim.make_optimizer({**base, "ema_decay": bad}, 10, mask)


def test_tail_average_is_the_mean_of_the_params_after_each_update_of_the_tail():
  params = {"w": jnp.asarray([1.0, -2.0]), "frozen": jnp.asarray([3.0])}
  mask = {"w": True, "frozen": False}
  base = dict(lr=0.1, warmup_steps=0, schedule="cosine", grad_clip=0.0, wd=0.0, name="sgd")
  total = 7
  for fraction, tail in ((0.4, 3), (1.0, 7), (0.01, 1)):  # ⌈fraction · steps⌉ updates, at least 1
    tx, _ = optim.make_optimizer({**base, "momentum": 0.0, "average_last": fraction}, total, mask)
    state, p, after = tx.init(params), params, []
    for t in range(total):
      grads = {"w": jnp.asarray([1.0, 2.0]) * (t + 1) ** 2, "frozen": jnp.ones(1)}
      updates, state = tx.update(grads, state, p)
      p = jax.tree.map(lambda a, u: a + u, p, updates)
      after.append(np.asarray(p["w"]))
    result = optim.stage_result(p, state)
    np.testing.assert_allclose(result["w"], np.mean(after[-tail:], axis=0), rtol=1e-5)
    assert result["frozen"].tolist() == [3.0]
  assert not np.allclose(np.mean(after, axis=0), after[-1])  # the walk moved: a real average
  for bad in (1.5, -0.1):
    with pytest.raises(ValueError, match="average_last"):
      optim.make_optimizer({**base, "average_last": bad}, 10, mask)
  with pytest.raises(ValueError, match="choose one average"):
    optim.make_optimizer({**base, "average_last": 0.5, "ema_decay": 0.9}, 10, mask)
