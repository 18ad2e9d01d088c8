"""Attention operators against naive O(N²) references, and their numerics in bf16."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from linvit_jax.models import attention as A
from linvit_jax.models import attention_ops as ops
from linvit_jax.models import feature_maps

FMAPS = sorted(feature_maps.FEATURE_MAPS)


def _qkv(key, b=2, n=37, h=3, d=16, scale=1.0, dtype=jnp.float32):
  kq, kk, kv = jax.random.split(key, 3)
  shape = (b, n, h, d)
  return tuple((scale * jax.random.normal(k, shape)).astype(dtype) for k in (kq, kk, kv))


def _phi(name, q, k):
  spec = A.AttentionSpec(kind="linear", feature_map=name)
  fmap = feature_maps.get_feature_map_cls(name)()
  params = fmap.init(jax.random.PRNGKey(1), q, is_query=True)
  fm_params = {"feature_map_q": params.get("params", {}), "feature_map_k": params.get("params", {})}
  return A.feature_maps_of(spec, q, k, fm_params if params else None)


def test_registry_has_the_required_maps():
  assert {"elu1", "relu", "hedgehog", "favor"} <= set(FMAPS)


@pytest.mark.parametrize("name", FMAPS)
def test_linear_attention_equals_naive_reference(name):
  q, k, v = _qkv(jax.random.PRNGKey(0))
  phi_q, phi_k = _phi(name, q, k)
  assert np.isfinite(np.asarray(phi_q)).all() and (np.asarray(phi_q) >= 0).all()
  fast = ops.linear_attention(phi_q, phi_k, v, eps=1e-6)
  # Naive: materialise φ(Q)φ(K)ᵀ, normalise each row, multiply by V.
  a = np.einsum("bqhf,bkhf->bhqk", np.asarray(phi_q, np.float64), np.asarray(phi_k, np.float64))
  naive = np.einsum("bhqk,bkhd->bqhd", a, np.asarray(v, np.float64)) / (
      a.sum(-1).transpose(0, 2, 1)[..., None] + 1e-6
  )
  np.testing.assert_allclose(np.asarray(fast), naive, atol=1e-5, rtol=1e-5)
  w = ops.linear_weights(phi_q, phi_k)
  np.testing.assert_allclose(np.asarray(w).sum(-1), 1.0, atol=1e-5)


@pytest.mark.parametrize("n,chunk", [(37, 8), (64, 64), (100, 512), (129, 32)])
def test_chunked_softmax_equals_softmax(n, chunk):
  q, k, v = _qkv(jax.random.PRNGKey(2), n=n, scale=2.0)
  ref = ops.softmax_attention(q, k, v)
  got = ops.chunked_softmax_attention(q, k, v, chunk_size=chunk)
  np.testing.assert_allclose(np.asarray(got), np.asarray(ref), atol=1e-5, rtol=0)


def test_chunked_softmax_module_matches_softmax_module():
  x = jax.random.normal(jax.random.PRNGKey(3), (2, 50, 48))
  soft = A.Attention(num_heads=4)
  params = soft.init(jax.random.PRNGKey(4), x)
  chunked = A.Attention(num_heads=4, spec=A.AttentionSpec(kind="chunked_softmax", chunk_size=16))
  np.testing.assert_allclose(
      np.asarray(chunked.apply(params, x)), np.asarray(soft.apply(params, x)), atol=1e-5, rtol=0
  )


def test_softmax_weights_temperature():
  q, k, _ = _qkv(jax.random.PRNGKey(5))
  w1 = ops.softmax_weights(q, k, 1.0)
  w2 = ops.softmax_weights(q, k, 2.0)
  np.testing.assert_allclose(np.asarray(w1).sum(-1), 1.0, atol=1e-5)
  # Higher temperature flattens the distribution: lower max probability on average.
  assert float(w2.max(-1).mean()) < float(w1.max(-1).mean())


@pytest.mark.parametrize("name", FMAPS)
def test_bf16_linear_attention_at_4096_tokens_close_to_f32(name):
  x = jax.random.normal(jax.random.PRNGKey(6), (1, 4096, 64))
  spec = A.AttentionSpec(kind="linear", feature_map=name)
  mod = A.Attention(num_heads=2, spec=spec)
  params = mod.init(jax.random.PRNGKey(7), x)
  f32 = np.asarray(mod.apply(params, x), np.float64)
  mod16 = A.Attention(num_heads=2, spec=spec, dtype_mm=jnp.bfloat16)
  b16 = np.asarray(mod16.apply(params, x.astype(jnp.bfloat16)).astype(jnp.float32), np.float64)
  rel = np.linalg.norm(b16 - f32) / np.linalg.norm(f32)
  assert np.isfinite(b16).all()
  assert rel < 1e-2, rel


@pytest.mark.parametrize("name", FMAPS)
@pytest.mark.parametrize("case", ["large_norm", "very_negative", "all_equal"])
def test_bf16_extreme_inputs_stay_finite(name, case):
  key = jax.random.PRNGKey(8)
  if case == "large_norm":
    q, k, v = _qkv(key, n=256, scale=300.0, dtype=jnp.bfloat16)
  elif case == "very_negative":
    q, k, v = _qkv(key, n=256, dtype=jnp.bfloat16)
    q, k = q * 0 - 9.0, k * 0 - 12.0  # elu+1 → exp(-12): den underflows without the ε guard
  else:
    q = k = v = jnp.ones((2, 256, 3, 16), jnp.bfloat16)
  phi_q, phi_k = _phi(name, q, k)
  out = ops.linear_attention(phi_q.astype(jnp.bfloat16), phi_k.astype(jnp.bfloat16), v)
  assert out.dtype == jnp.bfloat16
  assert np.isfinite(np.asarray(out.astype(jnp.float32))).all()
  if case == "all_equal" and name != "relu":
    np.testing.assert_allclose(np.asarray(out, np.float32), 1.0, atol=1e-2)


def test_favor_is_reproducible_and_redraws_only_when_asked():
  q, k, _ = _qkv(jax.random.PRNGKey(9))
  fmap = feature_maps.Favor(seed=3)
  a = fmap.apply({}, q, is_query=True)
  b = feature_maps.Favor(seed=3).apply({}, q, is_query=True)
  c = feature_maps.Favor(seed=4).apply({}, q, is_query=True)
  np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert not np.allclose(np.asarray(a), np.asarray(c))
  r1 = feature_maps.Favor(redraw=True).apply(
      {}, q, is_query=True, rngs={"favor": jax.random.PRNGKey(1)}
  )
  r2 = feature_maps.Favor(redraw=True).apply(
      {}, q, is_query=True, rngs={"favor": jax.random.PRNGKey(2)}
  )
  assert not np.allclose(np.asarray(r1), np.asarray(r2))


def test_favor_approximates_softmax_with_many_features():
  q, k, v = _qkv(jax.random.PRNGKey(10), n=64, d=16, scale=0.5)
  ref = np.asarray(ops.softmax_weights(q, k))
  fm = feature_maps.Favor(num_features=4096, seed=0)
  w = np.asarray(
      ops.linear_weights(fm.apply({}, q, is_query=True), fm.apply({}, k, is_query=False))
  )
  assert np.abs(w - ref).mean() < 0.1 * ref.mean()


def test_hedgehog_starts_near_identity():
  q, _, _ = _qkv(jax.random.PRNGKey(11), d=8)
  params = feature_maps.Hedgehog().init(jax.random.PRNGKey(0), q, is_query=True)["params"]
  eye = np.broadcast_to(np.eye(8), params["kernel"].shape)
  assert np.abs(np.asarray(params["kernel"]) - eye).max() < 1e-2


def test_bad_specs_are_named():
  with pytest.raises(ValueError, match="unknown attention kind 'sofmax'"):
    A.parse_spec("sofmax")
  with pytest.raises(ValueError, match="unknown attention field"):
    A.parse_spec({"kind": "linear", "featuremap": "elu1"})
  with pytest.raises(ValueError, match="3 per-layer specs but depth is 4"):
    A.parse_layer_specs(["softmax"] * 3, 4)
  with pytest.raises(ValueError, match="not divisible"):
    A.Attention(num_heads=5).init(jax.random.PRNGKey(0), jnp.zeros((1, 4, 12)))


@pytest.mark.parametrize("name", ["hedgehog", "hedgehog_exp"])
def test_folded_feature_path_equals_unfolded(name):
  """Attention folds the per-head map into the q/k projection; feature_maps_of (losses, maps)
  applies it after the projection: both must give the same layer output."""
  x = 3 * jax.random.normal(jax.random.PRNGKey(0), (2, 37, 32))
  m = A.Attention(num_heads=4, spec=A.parse_spec(name))
  params = m.init(jax.random.PRNGKey(1), x)["params"]
  y, state = m.apply({"params": params}, x, mutable=["intermediates"])
  q, k = state["intermediates"]["q"][0], state["intermediates"]["k"][0]
  phi_q, phi_k = A.feature_maps_of(A.parse_spec(name), q, k, params)
  v = jnp.einsum("bnd,dhk->bnhk", x, params["value"]["kernel"]) + params["value"]["bias"]
  ref = (
      jnp.einsum("bnhk,hkd->bnd", ops.linear_attention(phi_q, phi_k, v), params["out"]["kernel"])
      + params["out"]["bias"]
  )
  np.testing.assert_allclose(np.asarray(y), np.asarray(ref), atol=5e-5, rtol=1e-4)


def test_hedgehog_exp_keys_keep_their_scale():
  """hedgehog puts every key on the same simplex (features sum to 2); hedgehog_exp keeps each
  key's scale (shared normaliser only), so a key can draw weight from every query, as a
  softmax attention sink does. Queries are normalised the same way in both."""
  q, k, _ = _qkv(jax.random.PRNGKey(3), d=8, scale=2.0)
  k = k.at[:, 0].multiply(4.0)  # one strong key
  for name in ("hedgehog", "hedgehog_exp"):
    phi_q, phi_k = _phi(name, q, k)
    np.testing.assert_allclose(np.asarray(phi_q).sum(-1), 2.0, rtol=1e-5)
  _, phi_k = _phi("hedgehog", q, k)
  np.testing.assert_allclose(np.asarray(phi_k).sum(-1), 2.0, rtol=1e-5)
  _, phi_k = _phi("hedgehog_exp", q, k)
  sums = np.asarray(phi_k).sum(-1)  # [B, N, H]
  assert np.asarray(phi_k).max() <= 1.0 + 1e-6 and np.ptp(sums) > 0.1
  assert (sums[:, 0] >= np.median(sums, axis=1)).all()  # the strong key is among the largest


@pytest.mark.parametrize("n,chunk", [(37, 8), (64, 64), (129, 32)])
def test_chunked_softmax_gradient_equals_softmax_gradient(n, chunk):
  # The flash-style custom_vjp recomputes each key block: its q/k/v gradients must be softmax's.
  q, k, v = _qkv(jax.random.PRNGKey(5), n=n, scale=2.0)
  ct = jax.random.normal(jax.random.PRNGKey(6), q.shape)

  def grads(f):
    return jax.grad(lambda q, k, v: jnp.sum(f(q, k, v) * ct), argnums=(0, 1, 2))(q, k, v)

  ref = grads(ops.softmax_attention)
  got = grads(lambda q, k, v: ops.chunked_softmax_attention(q, k, v, chunk_size=chunk))
  for g, r in zip(got, ref):
    np.testing.assert_allclose(np.asarray(g), np.asarray(r), atol=2e-5, rtol=1e-4)


def test_chunked_softmax_backward_keeps_no_scores_under_an_outer_remat():
  # A scanned ViT wraps each block in remat(policy=everything_saveable); an inner jax.checkpoint
  # would be overridden and every key block's scores saved. The custom_vjp must stay O(N·block).
  n, h, d, chunk = 1024, 2, 16, 128
  x = jax.ShapeDtypeStruct((1, n, h, d), jnp.float32)
  policy = jax.checkpoint_policies.everything_saveable

  def temp_bytes(f):
    g = jax.grad(lambda q, k, v: jnp.sum(jax.checkpoint(f, policy=policy)(q, k, v) ** 2), (0, 1, 2))
    return jax.jit(g).lower(x, x, x).compile().memory_analysis().temp_size_in_bytes

  scores = n * n * h * 4
  chunked = temp_bytes(lambda q, k, v: ops.chunked_softmax_attention(q, k, v, chunk_size=chunk))
  assert chunked < 0.5 * scores, (chunked, scores)
  assert temp_bytes(ops.softmax_attention) > scores  # the check can fail: softmax keeps them
