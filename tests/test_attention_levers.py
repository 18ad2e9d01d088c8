"""The levers inside a linear attention layer (AttentionSpec options): exact prefix rows, key
centring, a zero-initialised depthwise conv on v, the window / sinks exact-set hybrid. Each is exact where it must be and O(N).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from linvit_jax.conversion import surgery
from linvit_jax.models import attention as A
from linvit_jax.models import vit
from tests.helpers import tiny_teacher

X = jax.random.normal(jax.random.PRNGKey(0), (2, 1 + 16, 32))  # cls + a 4×4 grid


def _pair(fmap="hedgehog_exp", prefix=1, x=X, **levers):
  """A softmax layer and a linear layer with `levers`, sharing q/k/v/out (initialised on x)."""
  soft = A.Attention(num_heads=2)
  params = soft.init(jax.random.PRNGKey(1), x)["params"]
  lin = A.Attention(
      num_heads=2,
      spec=A.AttentionSpec(kind="linear", feature_map=fmap, **levers),
      num_prefix_tokens=prefix,
  )
  lin_params = dict(lin.init(jax.random.PRNGKey(2), x)["params"])
  lin_params.update({k: params[k] for k in ("query", "key", "value", "out")})
  return soft, params, lin, lin_params


@pytest.mark.parametrize("fmap", ["elu1", "hedgehog", "hedgehog_exp"])
def test_exact_prefix_rows_equal_softmax_rows(fmap):
  soft, params, lin, lin_params = _pair(fmap, exact_prefix_rows=True)
  y_soft = soft.apply({"params": params}, X)
  y_lin = lin.apply({"params": lin_params}, X)
  np.testing.assert_allclose(np.asarray(y_lin[:, :1]), np.asarray(y_soft[:, :1]), atol=1e-5)
  assert np.max(np.abs(np.asarray(y_lin[:, 1:] - y_soft[:, 1:]))) > 1e-3  # the rest stays linear
  plain = A.Attention(num_heads=2, spec=A.AttentionSpec(kind="linear", feature_map=fmap))
  y_plain = plain.apply({"params": lin_params}, X)
  np.testing.assert_allclose(np.asarray(y_lin[:, 1:]), np.asarray(y_plain[:, 1:]), atol=1e-6)


@pytest.mark.parametrize("fmap", ["elu1", "hedgehog", "hedgehog_exp"])
def test_centred_keys_ignore_a_shift_shared_by_all_keys(fmap):
  """Softmax is invariant to a key shift shared by all keys; with center_keys the linear layer
  is too (folded hedgehog path and plain φ alike), and without it, it is not."""
  for center, invariant in ((True, True), (False, False)):
    _, _, lin, lin_params = _pair(fmap, center_keys=center)
    shifted = dict(lin_params)
    shifted["key"] = dict(lin_params["key"], bias=lin_params["key"]["bias"] + 0.7)
    a = lin.apply({"params": lin_params}, X)
    b = lin.apply({"params": shifted}, X)
    gap = float(np.max(np.abs(np.asarray(a - b))))
    assert (gap < 1e-5) == invariant, (fmap, center, gap)


def test_centred_keys_match_feature_maps_of():
  """The sown φ(k) (what the routing loss reads) equals feature_maps_of's, centring included."""
  _, _, lin, lin_params = _pair("hedgehog", center_keys=True)
  _, state = lin.apply({"params": lin_params}, X, mutable=["intermediates"])
  inter = state["intermediates"]
  fm = {k: v for k, v in lin_params.items() if k.startswith("feature_map")}
  _, phi_k = A.feature_maps_of(lin.spec, inter["q"][0], inter["k"][0], fm)
  np.testing.assert_allclose(np.asarray(phi_k), np.asarray(inter["phi_k"][0]), atol=1e-5)


def test_conv_v_starts_as_the_plain_layer_and_learns():
  _, _, lin, lin_params = _pair("elu1", conv_v=True)
  assert lin_params["conv_v"]["kernel"].shape == (3, 3, 1, 32)  # depthwise over H·Dh channels
  plain = A.Attention(num_heads=2, spec=A.AttentionSpec(kind="linear", feature_map="elu1"))
  without = {k: v for k, v in lin_params.items() if k != "conv_v"}
  np.testing.assert_allclose(
      np.asarray(lin.apply({"params": lin_params}, X)),
      np.asarray(plain.apply({"params": without}, X)),
      atol=1e-6,
  )
  grad = jax.grad(lambda p: jnp.sum(lin.apply({"params": p}, X) ** 2))(lin_params)
  assert float(jnp.abs(grad["conv_v"]["kernel"]).max()) > 0
  bumped = dict(
      lin_params,
      conv_v={"kernel": lin_params["conv_v"]["kernel"] + 0.1, "bias": lin_params["conv_v"]["bias"]},
  )
  y = lin.apply({"params": bumped}, X) - lin.apply({"params": lin_params}, X)
  assert float(jnp.abs(y[:, 1:]).max()) > 1e-4  # patches see their neighbours' v
  # ... and the cls token sees nothing but what out() makes of a zero (no bias on the prefix)
  np.testing.assert_allclose(np.asarray(y[:, :1]), 0.0, atol=1e-6)


def _temp_bytes(side: int, **levers) -> int:
  """Compiled temp memory of one hedgehog_exp layer with `levers` on cls + a side×side grid."""
  x = jnp.zeros((1, 1 + side * side, 64))
  spec = A.AttentionSpec(kind="linear", feature_map="hedgehog_exp", **levers)
  layer = A.Attention(num_heads=2, spec=spec, num_prefix_tokens=1)
  params = layer.init(jax.random.PRNGKey(0), x)
  return jax.jit(layer.apply).lower(params, x).compile().memory_analysis().temp_size_in_bytes


def test_levers_are_linear_in_tokens():
  """Compiled memory of a layer with every lever grows linearly in tokens (no N² buffer)."""
  levers = dict(exact_prefix_rows=True, center_keys=True, conv_v=True)
  small, big = _temp_bytes(16, **levers), _temp_bytes(64, **levers)  # 257, 4097 tokens: 16×
  assert big < 32 * small, (small, big)  # N² would be 256×
  n = 1 + 64 * 64
  assert big < n * n * 4 / 4, big  # far below one float32 score matrix


def test_bad_lever_values_fail_before_compute():
  with pytest.raises(ValueError, match=r"\['center_keys'\] apply to linear attention only"):
    A.parse_spec({"kind": "softmax", "center_keys": True})
  with pytest.raises(ValueError, match="unknown attention field"):
    A.parse_spec({"kind": "linear", "exact_cls": True})
  layer = A.Attention(num_heads=2, spec=A.AttentionSpec(kind="linear", conv_v=True))
  with pytest.raises(ValueError, match="square patch grid"):
    layer.init(jax.random.PRNGKey(0), jnp.zeros((1, 15, 32)))


def test_levers_in_a_vit_and_surgery():
  """A ViT student with the levers: the prefix count reaches every block, surgery keeps conv_v
  fresh (the teacher has none) and copies the registers like cls."""
  kw = dict(tiny_teacher.TINY, patch_size=(4, 4), reg_tokens=2)
  images = jnp.zeros((1, 16, 16, 3))
  teacher = vit.Model(**kw)
  student = vit.Model(
      **kw,
      attention={
          "kind": "linear",
          "feature_map": "hedgehog_exp",
          "exact_prefix_rows": True,
          "conv_v": True,
      },
  )
  tp = teacher.init(jax.random.PRNGKey(0), images)["params"]
  sp = student.init(jax.random.PRNGKey(1), images)["params"]
  for policy in ("copy_same", "copy_all"):
    params, report = surgery.transplant(tp, sp, policy)
    assert np.array_equal(params["reg"], tp["reg"])
    assert np.array_equal(
        params["Transformer"]["encoderblock_0"]["MultiHeadDotProductAttention_0"]["conv_v"][
            "kernel"
        ],
        sp["Transformer"]["encoderblock_0"]["MultiHeadDotProductAttention_0"]["conv_v"]["kernel"],
    )
  _, out = student.apply({"params": params}, images)
  _, t_out = teacher.apply({"params": tp}, images)
  assert out["encoded"].shape == (1, 1 + 2 + 16, 32)


def test_depthwise_conv_equals_flax_grouped_conv():
  import flax.linen as nn

  x = jax.random.normal(jax.random.PRNGKey(0), (2, 5, 6, 8))
  params = {
      "kernel": jax.random.normal(jax.random.PRNGKey(1), (3, 3, 1, 8)),
      "bias": jax.random.normal(jax.random.PRNGKey(2), (8,)),
  }
  ref = nn.Conv(8, (3, 3), padding="SAME", feature_group_count=8).apply({"params": params}, x)
  got = A.DepthwiseConv3x3().apply({"params": params}, x)
  np.testing.assert_allclose(np.asarray(got), np.asarray(ref), atol=1e-5)


# ------------------------------------------------------------------------------------------------
# The window hybrid (local softmax + linear under one normaliser).


def _gate(params, name, logit):
  return {**params, name: {"logit": jnp.full((2,), logit, jnp.float32)}}


def _with_gate(params, logit):
  return _gate(params, "window", logit)


def test_window_covering_the_grid_with_gate_one_is_softmax():
  """A window as large as the grid (7×7 around any patch of a 4×4 grid) and g = 1: every patch
  row is exact softmax; with exact_prefix_rows the cls row too, so the layer is softmax."""
  soft, params, lin, lin_params = _pair("hedgehog_exp", window=7, exact_prefix_rows=True)
  y_soft = soft.apply({"params": params}, X)
  y_win = lin.apply({"params": _with_gate(lin_params, 40.0)}, X)  # α = 1 in float32
  np.testing.assert_allclose(np.asarray(y_win), np.asarray(y_soft), atol=2e-5)


def _dense_hybrid(lin_params, inter, exact, logit, x=X):
  """The exact-set hybrid written out in O(N²) with an explicit mask `exact` [B,H,Q,N] over the
  rows Q it covers (the last Q rows of X): exact softmax inside the set, linear attention
  outside, mixed by α = the linear kernel's mass on the set, logit-shifted by the gate. Returns
  (the layer's output rows, α [B,H,Q])."""
  nq = exact.shape[2]
  q, k = inter["q"][0][:, -nq:], inter["k"][0]
  phi_q, phi_k = inter["phi_q"][0][:, -nq:], inter["phi_k"][0]
  v = jnp.einsum("bnd,dhk->bnhk", x, lin_params["value"]["kernel"]) + lin_params["value"]["bias"]
  s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
  e = jnp.where(exact, jnp.exp(s - jnp.max(jnp.where(exact, s, -jnp.inf), -1, keepdims=True)), 0)
  a = jnp.einsum("bqhf,bkhf->bhqk", phi_q, phi_k)
  a_exact, a_rest = jnp.where(exact, a, 0.0), jnp.where(exact, 0.0, a)
  boost = np.exp(logit)
  alpha = a_exact.sum(-1) * boost / (a_exact.sum(-1) * boost + a_rest.sum(-1) + 1e-6)  # [B,H,Q]
  soft = jnp.einsum("bhqk,bkhd->bhqd", e, v) / e.sum(-1)[..., None]
  linear = jnp.einsum("bhqk,bkhd->bhqd", a_rest, v) / (a_rest.sum(-1)[..., None] + 1e-6)
  ref = (alpha[..., None] * soft + (1 - alpha[..., None]) * linear).transpose(0, 2, 1, 3)
  out = lin_params["out"]
  return jnp.einsum("bqhd,hdo->bqo", ref, out["kernel"]) + out["bias"], alpha


def _window_mask(window, side=4):
  rows, cols = np.divmod(np.arange(side * side), side)
  r = window // 2
  near = (np.abs(rows[:, None] - rows[None]) <= r) & (np.abs(cols[:, None] - cols[None]) <= r)
  return np.concatenate([np.ones((side * side, 1), bool), near], axis=1)  # [patches, cls+patches]


def _sink_mask(inter, m):
  """[B,H,N]: the cls key and the m patch keys of largest centred norm per image and head."""
  k = np.asarray(inter["k"][0])[:, 1:]  # [B,16,H,D]
  norms = np.sum((k - k.mean(axis=1, keepdims=True)) ** 2, -1)  # [B,16,H]
  top = np.argsort(-norms, axis=1)[:, :m]  # [B,m,H]
  mask = np.zeros((k.shape[0], k.shape[2], 17), bool)
  mask[..., 0] = True
  for b in range(k.shape[0]):
    for h in range(k.shape[2]):
      mask[b, h, 1 + top[b, :, h]] = True
  return mask


@pytest.mark.parametrize("window, logit", [(3, 0.0), (3, -1.5), (5, 2.0)])
def test_window_hybrid_equals_its_dense_definition(window, logit):
  """Exact set E = the w×w patch neighbourhood plus the cls key, for the patch rows."""
  _, _, lin, lin_params = _pair("hedgehog_exp", window=window)
  lin_params = _with_gate(lin_params, logit)
  y, state = lin.apply({"params": lin_params}, X, mutable=["intermediates"])
  inter = state["intermediates"]
  ref_y, alpha = _dense_hybrid(lin_params, inter, _window_mask(window)[None, None], logit)
  np.testing.assert_allclose(np.asarray(y[:, 1:]), np.asarray(ref_y), atol=2e-4, rtol=1e-4)
  share = inter["exact_share"][0]
  np.testing.assert_allclose(np.asarray(share), np.asarray(alpha.mean(axis=(0, 2))), atol=1e-5)


@pytest.mark.parametrize("sinks, window, logit", [(3, 0, 0.0), (5, 0, 1.0), (4, 3, -0.5)])
def test_sink_hybrid_equals_its_dense_definition(sinks, window, logit):
  """Exact set E = the cls key and the m patch keys of largest centred norm (per image and
  head) for every row, plus each patch row's window when there is one (a sink inside it
  counted once)."""
  _, _, lin, lin_params = _pair("hedgehog_exp", window=window, sinks=sinks)
  lin_params = _gate(lin_params, "window" if window else "sinks", logit)
  y, state = lin.apply({"params": lin_params}, X, mutable=["intermediates"])
  inter = state["intermediates"]
  sink_mask = _sink_mask(inter, sinks)[:, :, None, :]  # [B,H,1,N]
  exact = np.broadcast_to(sink_mask, (2, 2, 17, 17)).copy()
  if window:
    exact[:, :, 1:] |= _window_mask(window)[None, None]
  ref_y, alpha = _dense_hybrid(lin_params, inter, exact, logit)
  np.testing.assert_allclose(np.asarray(y), np.asarray(ref_y), atol=2e-4, rtol=1e-4)
  np.testing.assert_allclose(
      np.asarray(inter["exact_share"][0]), np.asarray(alpha.mean(axis=(0, 2))), atol=1e-5
  )


@pytest.mark.parametrize("window, prefix, sinks", [(3, 1, 0), (5, 0, 0), (3, 0, 3), (3, 1, 4)])
def test_window_hybrid_on_a_padded_tiling_equals_its_dense_definition(window, prefix, sinks):
  """A 10×10 grid is cut into 6×6 tiles (padded to 12×12): padded query slots are dropped and
  padded keys never enter a window; without a prefix token some padded slots have an empty
  exact set, which must not turn into NaNs (forward or backward)."""
  side = 10
  x = jax.random.normal(jax.random.PRNGKey(4), (2, prefix + side * side, 32))
  _, _, lin, lin_params = _pair("hedgehog_exp", prefix, x, window=window, sinks=sinks)
  lin_params = _with_gate(lin_params, 0.7)
  y, state = lin.apply({"params": lin_params}, x, mutable=["intermediates"])
  inter = state["intermediates"]
  rows, cols = np.divmod(np.arange(side * side), side)
  r = window // 2
  near = (np.abs(rows[:, None] - rows[None]) <= r) & (np.abs(cols[:, None] - cols[None]) <= r)
  exact = np.zeros((2, 2, prefix + side * side, prefix + side * side), bool)
  exact[..., :prefix] = True
  exact[:, :, prefix:, prefix:] = near
  if sinks:
    k = np.asarray(inter["k"][0])[:, prefix:]  # [B,M,H,D]
    top = np.argsort(-np.sum((k - k.mean(axis=1, keepdims=True)) ** 2, -1), axis=1)[:, :sinks]
    for b in range(2):
      for h in range(2):
        exact[b, h, :, prefix + top[b, :, h]] = True
  hybrid_rows = slice(0 if sinks else prefix, None)
  ref_y, alpha = _dense_hybrid(lin_params, inter, exact[:, :, hybrid_rows], 0.7, x)
  np.testing.assert_allclose(np.asarray(y[:, hybrid_rows]), np.asarray(ref_y), atol=2e-4, rtol=1e-4)
  np.testing.assert_allclose(
      np.asarray(inter["exact_share"][0]), np.asarray(alpha.mean(axis=(0, 2))), atol=1e-5
  )
  grads = jax.grad(lambda p, x: jnp.sum(lin.apply({"params": p}, x) ** 2), argnums=(0, 1))(
      lin_params, x
  )
  assert all(np.all(np.isfinite(np.asarray(g))) for g in jax.tree_util.tree_leaves(grads))


@pytest.mark.parametrize("window, sinks", [(7, 0), (0, 16), (3, 2)])
def test_exact_set_guards_hold_at_bfloat16(window, sinks):
  """bfloat16 inputs, and exact sets that hold every key (the linear rest Σ_all − Σ_set is then
  0 up to rounding, possibly negative: clipped) or none of the mass (φ(k) = 0 outside the
  prefix): outputs and gradients stay finite, and the full set is softmax attention."""
  from linvit_jax.models import exact_set

  keys = jax.random.split(jax.random.PRNGKey(5), 5)
  bf16 = jnp.bfloat16
  q, k, v = (3 * jax.random.normal(key, (2, 17, 2, 8), bf16) for key in keys[:3])
  phi_q = jax.nn.softmax(jax.random.normal(keys[3], (2, 17, 2, 16)), -1).astype(bf16)
  phi_k = jnp.exp(jax.random.normal(keys[4], (2, 17, 2, 16)) - 2).astype(bf16)
  gate = jnp.full((2,), 40.0)  # α = 1 wherever the set has any linear mass

  def run(q, k, v, phi_q, phi_k):
    return exact_set.exact_set_hybrid(q, k, v, phi_q, phi_k, gate, window, 1, sinks, 1e-6)[0]

  for phi in (phi_k, phi_k.at[:, 1:].set(0)):
    y = run(q, k, v, phi_q, phi)
    assert y.dtype == bf16 and np.all(np.isfinite(np.asarray(y, np.float32)))
    loss = lambda *a: jnp.sum(run(*a).astype(jnp.float32) ** 2)  # noqa: E731
    grads = jax.grad(loss, argnums=(0, 1, 2, 3, 4))(q, k, v, phi_q, phi)
    assert all(np.all(np.isfinite(np.asarray(g, np.float32))) for g in grads)
  if window == 7 or sinks == 16:  # every key exact for the hybrid rows: softmax
    soft = A.ops.softmax_attention(*(x.astype(jnp.float32) for x in (q, k, v)))
    rows = slice(1, None) if window else slice(None)
    y = run(q, k, v, phi_q, phi_k)
    np.testing.assert_allclose(
        np.asarray(y[:, rows], np.float32), np.asarray(soft[:, rows]), atol=0.05
    )


def test_sinks_covering_every_key_with_gate_one_is_softmax():
  """With every patch key a sink (and the cls key, always exact) and α = 1, every row is
  exact softmax."""
  soft, params, lin, lin_params = _pair("hedgehog_exp", sinks=16)
  y_soft = soft.apply({"params": params}, X)
  y_sink = lin.apply({"params": _gate(lin_params, "sinks", 40.0)}, X)
  np.testing.assert_allclose(np.asarray(y_sink), np.asarray(y_soft), atol=2e-5)


def test_sinks_are_linear_in_tokens_and_refuse_bad_values():
  small, big = _temp_bytes(16, sinks=8), _temp_bytes(64, sinks=8)  # 16× the tokens
  assert big < 32 * small, (small, big)  # N² would be 256×
  with pytest.raises(ValueError, match=r"attention sinks must be >= 0.*got -2"):
    A.parse_spec({"kind": "linear", "sinks": -2})
  with pytest.raises(ValueError, match=r"\['sinks'\] apply to linear attention only"):
    A.parse_spec({"kind": "softmax", "sinks": 4})
  spec = A.AttentionSpec(kind="linear", sinks=17)
  too_many = A.Attention(num_heads=2, spec=spec, num_prefix_tokens=1)
  with pytest.raises(ValueError, match="attention sinks=17 is more than the 16 patch tokens"):
    too_many.init(jax.random.PRNGKey(0), X)


def test_window_at_init_is_the_linear_layer_with_exact_window_weights():
  """With b = 0 and a 1×1 window (each patch's own key, plus cls), α is the linear kernel's own
  mass there; outputs stay close to the plain linear layer (the same weights, re-split)."""
  _, _, lin, lin_params = _pair("hedgehog_exp", window=1)
  plain = A.Attention(
      num_heads=2, spec=A.AttentionSpec(kind="linear", feature_map="hedgehog_exp"),
      num_prefix_tokens=1,
  )  # fmt: skip
  y_win = lin.apply({"params": lin_params}, X)
  y_lin = plain.apply({"params": {k: v for k, v in lin_params.items() if k != "window"}}, X)
  np.testing.assert_allclose(np.asarray(y_win[:, :1]), np.asarray(y_lin[:, :1]), atol=1e-6)
  gap = float(np.max(np.abs(np.asarray(y_win - y_lin))))
  assert 0 < gap < 0.5 * float(np.max(np.abs(np.asarray(y_lin)))), gap


def test_window_is_linear_in_tokens_and_refuses_bad_values():
  small, big = _temp_bytes(16, window=5), _temp_bytes(64, window=5)  # 16× the tokens
  assert big < 32 * small, (small, big)  # N² would be 256×
  for bad in (-3, 4):
    with pytest.raises(ValueError, match=f"attention window must be an odd number.*got {bad}"):
      A.parse_spec({"kind": "linear", "window": bad})
  with pytest.raises(ValueError, match=r"\['window'\] apply to linear attention only"):
    A.parse_spec({"kind": "softmax", "window": 3})


@pytest.mark.parametrize("gate_name, lever", [("window", {"window": 3}), ("sinks", {"sinks": 2})])
def test_exact_set_gate_is_student_only_in_surgery(gate_name, lever):
  kw = dict(num_classes=None, patch_size=(4, 4), width=32, depth=2, mlp_dim=64, num_heads=2)
  images = jnp.zeros((1, 16, 16, 3))
  teacher = vit.Model(**kw, pool_type="tok")
  student = vit.Model(**kw, pool_type="tok", attention={"kind": "linear", **lever})
  tp = teacher.init(jax.random.PRNGKey(0), images)["params"]
  sp = student.init(jax.random.PRNGKey(1), images)["params"]
  params, _ = surgery.transplant(tp, sp, "copy_all")
  gate = params["Transformer"]["encoderblock_1"]["MultiHeadDotProductAttention_0"][gate_name]
  np.testing.assert_array_equal(gate["logit"], np.zeros(2))  # fresh: the linear kernel's share
  y, _ = student.apply({"params": params}, images)
  assert np.all(np.isfinite(np.asarray(y)))


def test_exact_share_is_reported_per_layer():
  from linvit_jax.evaluation import evaluate

  kw = dict(num_classes=None, patch_size=(4, 4), width=32, depth=2, mlp_dim=64, num_heads=2)
  images = jax.random.normal(jax.random.PRNGKey(3), (2, 16, 16, 3))
  for scan in (False, True):
    student = vit.Model(**kw, scan=scan, attention={"kind": "linear", "window": 3})
    # jitted: an op-by-op init of the window hybrid compiles each of its many small ops.
    params = jax.jit(student.init)(jax.random.PRNGKey(1), images)["params"]
    shares = evaluate.exact_shares(student, params, images)
    assert len(shares) == 2 and all(0.0 < s < 1.0 for s in shares), (scan, shares)
  plain = vit.Model(**kw, attention="hedgehog_exp")
  params = plain.init(jax.random.PRNGKey(1), images)["params"]
  assert evaluate.exact_shares(plain, params, images) == [None, None]


def test_num_features_must_be_positive_and_sets_the_hedgehog_width():
  with pytest.raises(ValueError, match=r"num_features must be positive.*got 0"):
    A.parse_spec({"kind": "linear", "feature_map": "hedgehog_exp", "num_features": 0})
  spec = A.parse_spec({"kind": "linear", "feature_map": "hedgehog_exp", "num_features": 8})
  x = jnp.ones((1, 5, 32))
  params = A.Attention(num_heads=2, spec=spec).init(jax.random.PRNGKey(0), x)["params"]
  assert params["feature_map_q"]["kernel"].shape == (2, 16, 8)  # [heads, head_dim, width]
  _, state = A.Attention(num_heads=2, spec=spec).apply(
      {"params": params}, x, mutable=["intermediates"]
  )
  assert state["intermediates"]["phi_k"][0].shape == (1, 5, 2, 16)  # 2 × width features


# ---------------------------------------------------------------- pooled keys of a softmax layer


def _pooled_reference(q, k, v, prefix, g):
  """pooled_key_softmax_attention written out in float64: patch j of an axis is in block
  ⌈g·(j + 1) / side⌉ - 1 (the same runs as ⌊i·side/g⌋ … ⌊(i+1)·side/g⌋ - 1, by another rule)."""
  q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
  side = int(round((k.shape[1] - prefix) ** 0.5))
  rows = -(-g * (np.arange(side) + 1) // side) - 1
  block_of = (rows[:, None] * g + rows[None, :]).reshape(-1)
  keys, values, log_count = [k[:, :prefix]], [v[:, :prefix]], [np.zeros(prefix)]
  for m in range(block_of.max() + 1):
    members = prefix + np.flatnonzero(block_of == m)
    keys.append(k[:, members].mean(1, keepdims=True))
    values.append(v[:, members].mean(1, keepdims=True))
    log_count.append([np.log(len(members))])
  keys, values = np.concatenate(keys, 1), np.concatenate(values, 1)
  logits = np.einsum("bqhd,bkhd->bhqk", q / np.sqrt(q.shape[-1]), keys) + np.concatenate(log_count)
  w = np.exp(logits - logits.max(-1, keepdims=True))
  return np.einsum("bhqk,bkhd->bqhd", w / w.sum(-1, keepdims=True), values)


@pytest.mark.parametrize(
    "side,g,prefix", [(8, 4, 1), (7, 3, 1), (9, 4, 0), (10, 4, 5), (64, 16, 1)]
)
def test_pooled_key_softmax_equals_its_dense_definition(side, g, prefix):
  """Blocks of ⌈side/g⌉² patches (smaller ones at the far edge when side is not a multiple),
  mean keys and values, log-count on the logits, prefix keys whole."""
  shape = (2, prefix + side * side, 2, 8)
  q, k, v = (2.0 * jax.random.normal(jax.random.PRNGKey(i), shape) for i in range(3))
  got = A.ops.pooled_key_softmax_attention(q, k, v, prefix, g)
  np.testing.assert_allclose(np.asarray(got), _pooled_reference(q, k, v, prefix, g), atol=2e-5)


def test_pooled_keys_are_softmax_on_small_grids_and_on_blockwise_equal_keys():
  q, k, v = (jax.random.normal(jax.random.PRNGKey(i), (1, 1 + 16, 2, 8)) for i in range(3))
  whole = A.ops.softmax_attention(q, k, v)
  np.testing.assert_array_equal(A.ops.pooled_key_softmax_attention(q, k, v, 1, 4), whole)
  # 2×2 blocks of equal keys and values: the count on each logit makes the pooled layer exact
  # (without it the cls key would get 4× its share).
  up = lambda x: jnp.repeat(jnp.repeat(x.reshape(1, 4, 4, 2, 8), 2, 1), 2, 2).reshape(1, 64, 2, 8)
  k8, v8 = (jnp.concatenate([x[:, :1], up(x[:, 1:])], 1) for x in (k, v))
  q8 = jax.random.normal(jax.random.PRNGKey(5), (1, 65, 2, 8))
  np.testing.assert_allclose(
      np.asarray(A.ops.pooled_key_softmax_attention(q8, k8, v8, 1, 4)),
      np.asarray(A.ops.softmax_attention(q8, k8, v8)),
      atol=1e-5,
  )


def test_key_grid_layer_is_linear_in_tokens_and_checked():
  def temp_bytes(side):
    x = jnp.zeros((1, 1 + side * side, 32))
    layer = A.Attention(
        num_heads=2, spec=A.AttentionSpec(kind="softmax", key_grid=8), num_prefix_tokens=1
    )
    params = layer.init(jax.random.PRNGKey(0), x)
    return jax.jit(layer.apply).lower(params, x).compile().memory_analysis().temp_size_in_bytes

  small, big = temp_bytes(16), temp_bytes(64)  # 257, 4097 tokens: 16×; full softmax: 256×
  assert big < 32 * small, (small, big)
  with pytest.raises(ValueError, match="key_grid must be >= 0"):
    A.AttentionSpec(key_grid=-1)
  with pytest.raises(ValueError, match="softmax kinds only"):
    A.AttentionSpec(kind="linear", key_grid=4)
  layer = A.Attention(num_heads=2, spec=A.AttentionSpec(key_grid=2), num_prefix_tokens=1)
  with pytest.raises(ValueError, match="square patch grid"):
    layer.init(jax.random.PRNGKey(0), jnp.zeros((1, 15, 32)))


def test_hybrid_swap_carries_the_key_grid():
  """A pooled softmax layer in a ViT: the swap sets its spec, and at a grid no wider than
  key_grid the hybrid is exactly the one with every key."""
  kw = dict(tiny_teacher.TINY, patch_size=(4, 4), posemb="sincos2d")  # any grid
  images = jax.random.normal(jax.random.PRNGKey(3), (1, 16, 16, 3))  # a 4×4 grid
  teacher = vit.Model(**kw)
  student = vit.Model(**kw, attention="hedgehog_exp")
  tp = teacher.init(jax.random.PRNGKey(0), images)["params"]
  sp = student.init(jax.random.PRNGKey(1), images)["params"]
  pooled, params = surgery.to_softmax_layers(tp, student, sp, [1], key_grid=4)
  whole, _ = surgery.to_softmax_layers(tp, student, sp, [1])
  specs = vit.layer_specs(pooled)
  assert specs[1] == A.AttentionSpec(kind="softmax", key_grid=4) and specs[0].kind == "linear"
  out = lambda m, x: np.asarray(jax.jit(m.apply)({"params": params}, x)[0])  # noqa: E731
  np.testing.assert_array_equal(out(pooled, images), out(whole, images))
  big = jax.random.normal(jax.random.PRNGKey(4), (1, 32, 32, 3))  # 8×8: pooled 2×2 blocks
  assert np.abs(out(pooled, big) - out(whole, big)).max() > 1e-6


def test_pooled_keys_hold_at_bfloat16():
  """bf16 q/k/v at 896 px's grid with large logits: block sums, scores, weights and the weighted
  sum in float32, so the bf16 layer is the float32 layer on the same (rounded) inputs, up to the
  output's own rounding."""
  shape = (1, 1 + 64 * 64, 2, 16)
  q, k, v = (8.0 * jax.random.normal(jax.random.PRNGKey(i), shape) for i in range(3))
  q, k, v = (x.astype(jnp.bfloat16) for x in (q, k, v))
  bf16 = A.ops.pooled_key_softmax_attention(q, k, v, 1, 16)
  f32 = A.ops.pooled_key_softmax_attention(*(x.astype(jnp.float32) for x in (q, k, v)), 1, 16)
  assert bf16.dtype == jnp.bfloat16 and np.isfinite(np.asarray(bf16, np.float32)).all()
  np.testing.assert_allclose(np.asarray(bf16, np.float32), np.asarray(f32), rtol=1e-2, atol=1e-2)
