"""Distillation losses: minimal at student == teacher, gradients only where they should be, and a
real optimisation that cuts a linear student's attention-output error.

Compile time dominates on a 2-core CPU, so every jitted function here is compiled once, with XLA's
backend optimisation off (`_jit`): it compiles ~3x faster and the models are tiny.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from linvit_jax.configuration import config_lib
from linvit_jax.conversion import calibrate
from linvit_jax.conversion import distill
from linvit_jax.conversion import distill_stage
from linvit_jax.conversion import optim
from linvit_jax.conversion import surgery
from linvit_jax.models import attention as attn_lib
from linvit_jax.models import attention_ops
from linvit_jax.models import probe
from linvit_jax.models import vit
from linvit_jax.models import vit_checkpoint
from tests.helpers import robust_common as robust

_jit = functools.partial(
    jax.jit,
    compiler_options={
        "xla_backend_optimization_level": 0,
        "xla_llvm_disable_expensive_passes": True,
    },
)
# A loop of hundreds of steps runs ~6x faster with the backend optimised (no expensive passes).
_jit_for_loops = functools.partial(
    jax.jit,
    compiler_options={
        "xla_backend_optimization_level": 1,
        "xla_llvm_disable_expensive_passes": True,
    },
)
TINY = dict(
    num_classes=5, variant="mu/8", depth=2, width=64, num_heads=2, mlp_dim=128, pool_type="tok"
)  # 32x32 images -> 16 patches + cls = 17 tokens


def _np_init(model, images, seed):
  """The model's real param tree with numpy-drawn values at init-like scales (no XLA compile of
  init, which takes ~20 s here): fan-in scaled kernels, LayerNorm scale ~1, hedgehog ~identity."""
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), images[:1])["params"]
  rng = np.random.default_rng(seed)

  def draw(path, s):
    name = "/".join(p.key for p in path)
    if name.endswith("scale"):
      return (1 + 0.1 * rng.normal(size=s.shape)).astype(np.float32)
    if "/feature_map_" in name and name.endswith("kernel"):
      eye = np.eye(s.shape[1], s.shape[2])[None]
      return (eye + 1e-3 * rng.normal(size=s.shape)).astype(np.float32)
    if len(s.shape) < 2:
      return (0.02 * rng.normal(size=s.shape)).astype(np.float32)
    if name.endswith("out/kernel"):  # [H, Dh, D]
      fan_in = s.shape[0] * s.shape[1]
    elif "MultiHeadDotProductAttention" in name:  # query/key/value [D, H, Dh]
      fan_in = s.shape[0]
    else:
      fan_in = int(np.prod(s.shape[:-1]))
    return (rng.normal(size=s.shape) / np.sqrt(fan_in)).astype(np.float32)

  return jax.tree_util.tree_map_with_path(draw, shapes)


@pytest.fixture(scope="module")
def tiny():
  """A random softmax teacher and a hedgehog student after copy_same surgery."""
  teacher = vit.Model(**TINY)
  student = vit.Model(**TINY, attention="hedgehog")
  images = np.random.default_rng(0).normal(size=(4, 32, 32, 3)).astype(np.float32)
  t_params = _np_init(teacher, images, 0)
  s_params, _ = surgery.transplant(t_params, _np_init(student, images, 1), "copy_same")
  return teacher, t_params, student, s_params, images


def _attn_leaf(path: str) -> bool:
  return "/MultiHeadDotProductAttention_0/" in path and path.startswith("Transformer/")


# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def at_and_off_equality(tiny):
  """One compiled function: every loss for a softmax student copied from the teacher, and for the
  hedgehog student; the teacher-forced gradient; a masked-optimizer update."""
  teacher, t_params, student, s_params, images = tiny
  same_params, report = surgery.transplant(t_params, t_params, "copy_all")
  assert report.counts()["keep"] == 0
  weights = dict.fromkeys(("w_routing", "w_lookahead", "w_feature", "w_logit_kd"), 1.0)
  every = dict(weights, routing_kind="kl", routing_queries=8, lookahead=3)  # every loss on
  same_loss = distill_stage.make_distill_loss(teacher, teacher, every)
  lin_loss = distill_stage.make_distill_loss(teacher, student, every)
  forced = distill_stage.make_distill_loss(
      teacher, student, dict(w_routing=0.5, routing_queries=8, lookahead=2, w_lookahead=0.5)
  )
  mask = optim.trainable_mask(s_params, "distill_attention")
  opt = optim.masked_optimizer(optax.adam(1e-2), mask)

  @_jit
  def run(same_params, s_params, rng):
    batch = {"image": images}
    _, same = same_loss(same_params, t_params, batch, rng)
    _, lin = lin_loss(s_params, t_params, batch, rng)
    g_forced = jax.grad(lambda p: forced(p, t_params, batch, rng)[0])(s_params)
    # An update from a gradient that is nonzero everywhere (as end-to-end losses give).
    ones = jax.tree.map(jnp.ones_like, s_params)
    updates, state = opt.update(ones, opt.init(s_params), s_params)
    # The routing xent is minimal (= the teacher's entropy) rather than zero at equality.
    tg = probe.teacher_targets(teacher, t_params, images)
    p = attention_ops.softmax_weights(tg["q"][1], tg["k"][1])
    entropy = -jnp.mean(jnp.sum(jax.scipy.special.xlogy(p, p), -1))
    xent = distill.routing_loss(
        tg["q"][1],
        tg["k"][1],
        tg["q"][1],
        tg["k"][1],
        attn_lib.AttentionSpec(),
        None,
        num_queries=0,
    )
    return same, lin, g_forced, updates, state, entropy, xent

  same, lin, g_forced, updates, state, entropy, xent = run(
      same_params, s_params, jax.random.PRNGKey(0)
  )
  return (
      mask,
      s_params,
      *jax.tree.map(np.asarray, (same, lin, g_forced, updates)),
      state,
      float(entropy),
      float(xent),
  )


def test_every_loss_is_minimal_at_student_equals_teacher_and_positive_otherwise(
    at_and_off_equality,
):
  _, _, same, lin, _, _, _, entropy, xent = at_and_off_equality
  depth = TINY["depth"]
  zero_terms = (
      [
          "attn_nmse",
          "routing",
          "lookahead",
          "logit_kd",
          "feature_nmse/encoded",
          "feature_nmse/pre_logits",
      ]
      + [f"attn_nmse/layer_{l:02d}" for l in range(depth)]
      + [f"lookahead/layer_{l:02d}" for l in range(depth)]
  )
  for name in zero_terms:
    assert abs(same[name]) < 1e-6, (name, same[name])
    assert lin[name] > 1e-3, (name, lin[name])
  for name in ["attn_cosine", "feature_cosine/encoded", "feature_cosine/pre_logits"]:
    assert abs(same[name] - 1) < 1e-6, (name, same[name])
    assert lin[name] < 0.99, (name, lin[name])
  assert abs(same["loss"]) < 1e-5 and lin["loss"] > 0.1
  np.testing.assert_allclose(xent, entropy, rtol=1e-5)


def test_gradients_reach_only_the_trainable_parameters(at_and_off_equality):
  mask, s_params, _, _, g_forced, updates, state, _, _ = at_and_off_equality
  g_forced, updates, flat_mask = map(robust.flat, (g_forced, updates, mask))
  assert any(flat_mask.values()) and not all(flat_mask.values())
  for path, trainable in flat_mask.items():
    assert trainable == _attn_leaf(path), path
    # Teacher-forced losses: exactly zero gradient outside the attention sublayers (q/k/v/out
    # and feature maps all get one).
    assert bool(np.any(g_forced[path])) == trainable, path
    # The masked optimizer moves only trainable leaves, whatever the gradient.
    assert bool(np.any(updates[path])) == trainable, path
  # Frozen leaves carry no Adam moments.
  adam_state = state.inner_states["trained"].inner_state[0]
  n_moments = sum(x.size for x in jax.tree.leaves(adam_state.mu))
  assert n_moments == sum(v.size for p, v in g_forced.items() if flat_mask[p])
  assert optim.trainable_mask(s_params, "finetune") == jax.tree.map(lambda _: True, s_params)
  with pytest.raises(ValueError, match="selects no parameter"):
    optim.trainable_mask(s_params, "nothing/.*")


def test_scanned_trees_give_the_same_targets_and_outputs(tiny):
  teacher, t_params, student, s_params, images = tiny
  t_scan = vit.Model(**TINY, scan=True)
  s_scan = vit.Model(**TINY, attention="hedgehog", scan=True)
  tp_scan = vit_checkpoint.pyloop_to_scan(t_params)
  sp_scan = vit_checkpoint.pyloop_to_scan(s_params)

  @_jit
  def both(t_params, s_params, tp_scan, sp_scan):
    tg = probe.teacher_targets(teacher, t_params, images)
    tg_scan = probe.teacher_targets(t_scan, tp_scan, images)
    out = probe.student_attention_outputs(student, s_params, tg["attn_input"], with_qk=True)
    out_scan = probe.student_attention_outputs(s_scan, sp_scan, tg["attn_input"], with_qk=True)
    calibrated = calibrate.calibrate_out_projection(tg, s_scan, sp_scan)
    y_cal = probe.student_attention_outputs(s_scan, calibrated, tg["attn_input"])
    return tg, tg_scan, out, out_scan, calibrated, y_cal

  tg, tg_scan, out, out_scan, calibrated, y_cal = both(t_params, s_params, tp_scan, sp_scan)
  assert (
      tg.keys()
      == tg_scan.keys()
      >= {"attn_input", "q", "k", "sa", "+sa", "+mlp", "encoded", "pre_logits", "logits"}
  )
  assert tg["sa"].shape == (2, 4, 17, 64) and tg["q"].shape == (2, 4, 17, 2, 32)
  for key in tg:
    np.testing.assert_allclose(tg_scan[key], tg[key], atol=1e-5, err_msg=key)
  for a, b in zip(out_scan, out):
    np.testing.assert_allclose(a, b, atol=1e-5)
  # Calibration keeps the scanned layout and matches the teacher's output variance per layer.
  assert (
      calibrated["Transformer"]["encoderblock"]["MultiHeadDotProductAttention_0"]["out"][
          "kernel"
      ].shape
      == sp_scan["Transformer"]["encoderblock"]["MultiHeadDotProductAttention_0"]["out"][
          "kernel"
      ].shape
  )
  np.testing.assert_allclose(
      np.var(y_cal, axis=(1, 2, 3)), np.var(tg["sa"], axis=(1, 2, 3)), rtol=1e-3
  )
  assert not np.allclose(
      np.var(out[0], axis=(1, 2, 3)), np.var(tg["sa"], axis=(1, 2, 3)), rtol=0.05
  )


def test_distillation_cuts_attention_error_at_least_5x(tiny):
  """200 Adam steps of the distillation stage's loss (attention outputs + routing) on a
  stream of fresh random images, attention params only. The error is measured before each update
  on that step's batch, i.e. on images the student has not been trained on."""
  teacher, t_params, student, s_params, images = tiny
  s_params = _jit(
      lambda tp, sp: calibrate.calibrate_out_projection(
          probe.teacher_targets(teacher, tp, images), student, sp
      )
  )(t_params, s_params)
  loss_fn = distill_stage.make_distill_loss(
      teacher, student, dict(w_routing=0.1, routing_queries=8)
  )
  opt = optim.masked_optimizer(
      optax.adam(3e-3), optim.trainable_mask(s_params, "distill_attention")
  )

  @_jit_for_loops
  def step(params, opt_state, images, rng):
    (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        params, t_params, {"image": images}, rng
    )
    updates, opt_state = opt.update(grads, opt_state, params)
    per_layer = jnp.stack([metrics["attn_nmse/layer_00"], metrics["attn_nmse/layer_01"]])
    return optax.apply_updates(params, updates), opt_state, per_layer

  opt_state = opt.init(s_params)
  errors = []
  data = np.random.default_rng(1)  # images drawn on the host: no RNG kernels to compile
  for rng in jax.random.split(jax.random.PRNGKey(0), 200):
    images = data.normal(size=(8, 32, 32, 3)).astype(np.float32)
    s_params, opt_state, per_layer = step(s_params, opt_state, images, rng)
    errors.append(per_layer)
  errors = np.asarray(errors)
  before, after = errors[0], errors[-20:].mean(0)
  assert np.all(before > 0.5), before  # calibrated fresh attention: uncorrelated, right scale
  assert np.all(before / after >= 5), (before, after)


# ------------------------------------------------------------------------------------------------
# Small pure functions (eager, tiny arrays).


def test_attention_output_metrics_and_lookahead_zero_is_plain_matching():
  rng = np.random.default_rng(0)
  scale = np.array([1, 10, 0.01], np.float32)[:, None, None, None]  # layers of any scale
  t = rng.normal(size=(3, 2, 5, 8)).astype(np.float32) * scale
  s = t + 0.1 * rng.normal(size=t.shape).astype(np.float32) * scale
  depth3 = vit.Model(**{**TINY, "depth": 3})

  @_jit
  def run(s, t):
    targets = {"sa": t, "+sa": t, "+mlp": t}
    return (
        distill.attention_output_loss(s, t, "nmse"),
        distill.attention_output_loss(list(s), list(t), "cosine")[1],
        distill.attention_output_loss(t, t, "nmse")[0],
        distill.lookahead_loss(depth3, None, targets, s, 0)[1],
    )

  (loss, nmse), cos, zero, look = run(s, t)
  np.testing.assert_allclose(nmse, 0.01, rtol=0.3)  # scale-free: the same for each layer
  np.testing.assert_allclose(loss, np.mean(nmse), rtol=1e-6)
  assert np.all((cos > 0) & (cos < 0.02))
  assert zero == 0
  np.testing.assert_allclose(look, nmse, rtol=1e-6)
  with pytest.raises(ValueError, match="unknown attention-output metric 'mse'"):
    distill.attention_output_loss(s, t, "mse")


def test_routing_loss_samples_queries_and_reaches_only_q_k_and_feature_maps():
  rng = np.random.default_rng(0)
  tq, tk = (rng.normal(size=(2, 12, 2, 8)).astype(np.float32) for _ in range(2))
  ks = jax.random.PRNGKey(2)
  spec = attn_lib.parse_spec("hedgehog")
  fmap = {
      name: {
          "kernel": np.eye(8, dtype=np.float32)[None].repeat(2, 0),
          "bias": np.zeros((2, 8), np.float32),
      }
      for name in ("feature_map_q", "feature_map_k")
  }

  def loss(q, k, f, n):
    return distill.routing_loss(tq, tk, q, k, spec, f, n, ks, 2.0, "kl")

  @_jit
  def run(q, k, f):
    softmax = attn_lib.AttentionSpec()
    at_equality = distill.routing_loss(tq, tk, tq, tk, softmax, None, 0, None, 1.0, "kl")
    sub, g = jax.value_and_grad(loss, argnums=(0, 1, 2))(q, k, f, 6)
    return loss(q, k, f, 0), sub, g, at_equality

  full, sub, g, at_equality = run(tq, tk, fmap)
  assert full > 0
  # A subset of queries estimates the full loss.
  assert abs(sub - full) < full
  assert all(np.any(x) for x in jax.tree.leaves(g))  # q, k and both feature maps
  # Queries outside the sample get no gradient: the cost is O(N·s).
  assert int(np.sum(np.any(np.asarray(g[0]) != 0, axis=(0, 2, 3)))) == 6
  # A softmax student equal to the teacher at τ=1 has zero KL.
  assert abs(at_equality) < 1e-6
  with pytest.raises(ValueError, match="needs an rng"):
    distill.routing_loss(tq, tk, tq, tk, attn_lib.AttentionSpec(), None, 4, None)


def test_logit_and_label_losses():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(4, 6)).astype(np.float32)
  ids = np.array([0, 3, 5, 1])
  one_hot = np.eye(6, dtype=np.float32)[ids]
  multi = (rng.random((4, 6)) > 0.5).astype(np.float32)

  @_jit
  def run(z):
    return (
        distill.logit_kd_loss(z, z, 2.0),
        distill.logit_kd_loss(z + 3.0, z, 2.0),
        distill.logit_kd_loss(z[::-1], z, 2.0),
        distill.softmax_xent(z, one_hot),
        distill.softmax_xent(z, ids),
        distill.sigmoid_xent(z, multi),
    )

  kd_same, kd_shift, kd_diff, xent_1h, xent_ids, sig = run(logits)
  assert abs(kd_same) < 1e-7 and abs(kd_shift) < 1e-6  # shift-invariant
  assert kd_diff > 0
  ref = -np.mean(np.log(np.exp(logits[np.arange(4), ids]) / np.exp(logits).sum(-1)))
  np.testing.assert_allclose([xent_1h, xent_ids], ref, rtol=1e-5)
  p = 1 / (1 + np.exp(-logits))
  ref = -np.mean(np.sum(multi * np.log(p) + (1 - multi) * np.log(1 - p), -1))
  np.testing.assert_allclose(sig, ref, rtol=1e-5)
  with pytest.raises(ValueError, match="do not fit logits"):
    distill.softmax_xent(logits, one_hot[:, :5])


def test_feature_alignment_on_arrays_and_out_dicts():
  rng = np.random.default_rng(0)
  t = {
      "encoded": rng.normal(size=(2, 5, 8)).astype(np.float32),
      "pre_logits": rng.normal(size=(2, 8)).astype(np.float32),
  }
  s = {k: v + 0.5 for k, v in t.items()}

  @_jit
  def run(s, t):
    return (
        distill.feature_alignment_loss(t["encoded"], t["encoded"]),
        distill.feature_alignment_loss(-t["encoded"], t["encoded"], w_nmse=0.0)[0],
        distill.feature_alignment_loss(s, t),
    )

  (same, same_m), opposite, (shifted, shifted_m) = run(s, t)
  assert abs(same) < 1e-6 and abs(same_m["cosine"] - 1) < 1e-6
  np.testing.assert_allclose(opposite, 2.0, rtol=1e-6)  # 1 - cos(-t, t)
  assert shifted > 0 and set(shifted_m) == {
      "nmse/encoded",
      "cosine/encoded",
      "nmse/pre_logits",
      "cosine/pre_logits",
  }
  with pytest.raises(ValueError, match="'logits'"):
    distill.feature_alignment_loss(s, t, keys=("logits",))


def test_config_block_is_validated():
  c = distill_stage.distill_config(w_routing=0.0)
  assert c.metric == "nmse" and c.w_routing == 0.0
  # The config's defaults (config_lib.distill), whether the block comes from a config or a dict.
  base = config_lib.base_config()
  assert c.routing_queries == base.distill.routing_queries == 32
  assert distill_stage.distill_config(base).to_dict() == {
      **base.distill.to_dict(),
      "feature_keys": distill.FEATURE_KEYS,
  }
  with pytest.raises(ValueError, match=r"unknown distill config field\(s\) \['w_rout'\]"):
    distill_stage.distill_config(w_rout=1.0)
  with pytest.raises(ValueError, match="routing_kind"):
    distill_stage.make_distill_loss(TINY, {**TINY, "attention": "elu1"}, {"routing_kind": "js"})


def test_routing_with_the_forwards_phi_equals_recomputing_it(tiny):
  # distill_loss reuses the φ(q), φ(k) the student's forward sowed instead of recomputing them
  # from q/k (which, with φ folded into the projections, costs two extra projections per layer).
  teacher, t_params, student, s_params, images = tiny
  rng = jax.random.PRNGKey(3)

  def routing(sp, reuse):
    targets = probe.teacher_targets(teacher, t_params, images)
    _, q, k, phis = probe.student_attention_outputs(
        student, sp, targets["attn_input"], with_qk=True, with_phi=True
    )
    assert len(phis) == 2 and all(p is not None for p in phis)
    return distill.routing_losses(
        targets, q, k, student, sp, rng, num_queries=8, student_phi=phis if reuse else None
    )[0]

  @_jit
  def both(sp):
    return [jax.value_and_grad(lambda p, r=r: routing(p, r))(sp) for r in (True, False)]

  (v1, g1), (v0, g0) = both(s_params)
  np.testing.assert_allclose(float(v1), float(v0), rtol=1e-5)
  for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g0)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6, rtol=1e-4)
  assert any(np.any(np.asarray(a) != 0) for a in jax.tree.leaves(g1))


def test_bfloat16_teacher_targets_stay_close_and_bad_dtypes_are_refused(tiny):
  """distill.teacher_dtype_mm=bfloat16 runs the targets' forward with bf16 matmuls (float32
  accumulation, stream and softmax), student_dtype_mm the student's teacher-forced attention:
  the loss moves by well under its own size, and the float32 gradient keeps its direction."""
  teacher, t_params, student, s_params, images = tiny
  losses = {
      "float32": distill_stage.make_distill_loss(teacher, student, dict(w_routing=0.1)),
      "bfloat16": distill_stage.make_distill_loss(
          teacher, student, dict(w_routing=0.1, teacher_dtype_mm="bfloat16")
      ),
      "both": distill_stage.make_distill_loss(
          teacher,
          student,
          dict(w_routing=0.1, teacher_dtype_mm="bfloat16", student_dtype_mm="bfloat16"),
      ),
  }

  @_jit
  def both(sp):
    batch = {"image": images}
    return {dt: jax.value_and_grad(lambda p, f=f: f(p, t_params, batch, None)[0])(sp)
            for dt, f in losses.items()}  # fmt: skip

  out = both(s_params)
  l32, g32 = out["float32"]
  a = np.concatenate([np.ravel(x) for x in jax.tree.leaves(g32)])
  for name in ("bfloat16", "both"):
    l16, g16 = out[name]
    assert float(l16) != float(l32)  # the bf16 forward did run
    np.testing.assert_allclose(float(l16), float(l32), rtol=0.02)
    b = np.concatenate([np.ravel(x) for x in jax.tree.leaves(g16)])
    assert b.dtype == np.float32 and a @ b / (np.linalg.norm(a) * np.linalg.norm(b)) > 0.99
  with pytest.raises(ValueError, match="teacher_dtype_mm must be float32 or bfloat16.*'fp16'"):
    distill_stage.distill_config(teacher_dtype_mm="fp16")
  with pytest.raises(ValueError, match="student_dtype_mm must be float32 or bfloat16"):
    distill_stage.distill_config(student_dtype_mm="float16")


def test_block_alignment_weights_the_top_blocks_up():
  np.testing.assert_allclose(distill.depth_weights(3, 1.0), [1 / 3] * 3, rtol=1e-6)
  np.testing.assert_allclose(distill.depth_weights(3, 3.0), [1 / 6, 2 / 6, 3 / 6], rtol=1e-6)
  with pytest.raises(ValueError, match="blocks_top_weight=0"):
    distill.depth_weights(3, 0.0)
  rng = np.random.default_rng(1)
  t = rng.normal(size=(3, 2, 5, 8)).astype(np.float32)
  s = t.copy()
  s[2] += rng.normal(size=s[2].shape)  # only the top block is off
  out = {"encoder": {f"block{l:02d}": {"+mlp": s[l]} for l in range(3)}}
  flat, m = distill.block_alignment_loss(out, {"+mlp": t})
  top, _ = distill.block_alignment_loss(out, {"+mlp": t}, top_weight=3.0)
  per_top = 3 * flat  # the mean over 3 blocks, 2 of them exact
  np.testing.assert_allclose(top, per_top / 2, rtol=1e-5)  # weight 3/6 on the top block
  assert m["block_cosine/layer_02"] < m["block_cosine/layer_00"] == pytest.approx(1.0, abs=1e-6)


def test_token_structure_loss_reads_what_tells_patches_apart():
  """Zero for the teacher's own tokens and for any per-image shift of them (the shared component
  is not its business); large for a student that has the teacher's mean token and nothing else,
  though its plain cosine is high; the cls/register prefix is left out."""
  rng = np.random.default_rng(0)
  common = 4.0 * rng.normal(size=(2, 1, 16))
  t = (common + rng.normal(size=(2, 1 + 9, 16))).astype(np.float32)
  loss, m = distill.token_structure_loss(t, t, prefix=1)
  assert float(loss) == pytest.approx(0.0, abs=1e-6) and float(m["structure_cosine"]) == (
      pytest.approx(1.0, abs=1e-6)
  )
  shifted = t + rng.normal(size=(2, 1, 16)).astype(np.float32)  # one shift per image
  assert float(distill.token_structure_loss(shifted, t, prefix=1)[0]) == pytest.approx(0, abs=1e-5)
  blurred = t.copy()
  blurred[:, 1:] = 0.8 * t[:, 1:].mean(axis=1, keepdims=True) + 0.2 * t[:, 1:]
  blurred[:, 1:] += 0.3 * rng.normal(size=blurred[:, 1:].shape)
  plain = float(probe.cosine(blurred[:, 1:], t[:, 1:]).mean())
  structure = float(distill.token_structure_loss(blurred, t, prefix=1)[1]["structure_cosine"])
  assert plain > 0.9 and structure < plain - 0.2
  wrong_cls = t.copy()
  wrong_cls[:, 0] = -wrong_cls[:, 0]
  assert float(distill.token_structure_loss(wrong_cls, t, prefix=1)[0]) == pytest.approx(
      0, abs=1e-6
  )


def test_an_align_stage_with_w_structure_adds_exactly_that_term(tiny):
  from linvit_jax.conversion import stages

  teacher, t_params, student, s_params, images = tiny
  config = config_lib.base_config()
  losses = {}
  for w in (0.0, 0.5):
    cfg = config_lib.align_stage(steps=2, batch_size=4, w_structure=w)
    loss_fn, _ = stages.build("align", config_lib.mlc.ConfigDict(cfg), config, teacher, student,
                              s_params)  # fmt: skip
    losses[w] = loss_fn(s_params, t_params, {"image": images}, jax.random.PRNGKey(0))
  (plain, m0), (with_term, m1) = losses[0.0], losses[0.5]
  assert "structure_cosine" not in m0 and 0.0 < float(m1["structure_cosine"]) < 1.0
  np.testing.assert_allclose(
      float(with_term) - float(plain), 0.5 * (1 - float(m1["structure_cosine"])), rtol=1e-4
  )
