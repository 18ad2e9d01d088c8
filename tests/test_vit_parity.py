"""Our softmax ViT reproduces big_vision's own outputs on a real big_vision checkpoint."""

import jax
import numpy as np
import pytest

from linvit_jax.models import vit
from tests.helpers.bv_checkpoint import unflatten


def _flat_out(out, prefix="out"):
  flat = {}
  for k, v in out.items():
    name = f"{prefix}/{k}"
    if isinstance(v, dict):
      flat.update(_flat_out(v, name))
    else:
      flat[name] = np.asarray(v)
  return flat


@pytest.fixture(scope="module")
def model_and_params(bv_fixture):
  meta, flat, _ = bv_fixture
  return vit.Model(**meta["model_config"]), unflatten(flat)


def test_param_tree_matches_big_vision(bv_fixture, model_and_params):
  meta, flat, ref = bv_fixture
  model, _ = model_and_params
  init = jax.eval_shape(model.init, jax.random.PRNGKey(0), ref["images"])["params"]
  shapes = {
      "/".join(str(p.key) for p in path): tuple(x.shape)
      for path, x in jax.tree_util.tree_flatten_with_path(init)[0]
  }
  assert shapes == {k: tuple(v) for k, v in meta["params"].items()}


def test_logits_and_every_out_entry_match_reference(bv_fixture, model_and_params):
  _, _, ref = bv_fixture
  model, params = model_and_params
  logits, out = model.apply({"params": params}, ref["images"])
  got = _flat_out(out)
  np.testing.assert_allclose(np.asarray(logits), ref["logits"], atol=1e-5, rtol=0)
  ref_keys = {k for k in ref if k.startswith("out/")}
  assert ref_keys <= set(got), sorted(ref_keys - set(got))
  for k in sorted(ref_keys):
    assert np.max(np.abs(got[k] - ref[k])) <= 1e-5, k


def test_scan_model_matches_loop_model(bv_fixture, model_and_params):
  meta, _, ref = bv_fixture
  model, params = model_and_params
  scan_model = vit.Model(**meta["model_config"], scan=True)
  t = params["Transformer"]
  depth = meta["model_config"]["depth"]
  stacked = jax.tree.map(lambda *xs: np.stack(xs), *[t[f"encoderblock_{i}"] for i in range(depth)])
  scan_params = {
      **params,
      "Transformer": {"encoderblock": stacked, "encoder_norm": t["encoder_norm"]},
  }
  logits, out = scan_model.apply({"params": scan_params}, ref["images"])
  np.testing.assert_allclose(np.asarray(logits), ref["logits"], atol=1e-5, rtol=0)
  np.testing.assert_allclose(
      np.asarray(out["encoder"]["block02"]["sa"]), ref["out/encoder/block02/sa"], atol=1e-5, rtol=0
  )


@pytest.mark.parametrize(
    "pool_type,posemb,rep_size",
    [
        ("gap", "sincos2d", False),
        ("map", "learn", True),
        ("0", "learn", 32),
        ("none", "sincos2d", False),
    ],
)
def test_every_pool_and_posemb_runs(pool_type, posemb, rep_size):
  model = vit.Model(
      num_classes=5 if pool_type != "none" else None,
      variant="mu/8",
      pool_type=pool_type,
      posemb=posemb,
      rep_size=rep_size,
  )
  x = np.zeros((2, 16, 16, 3), np.float32)
  params = model.init(jax.random.PRNGKey(0), x)["params"]
  logits, out = model.apply({"params": params}, x)
  assert np.isfinite(np.asarray(logits)).all()
  if pool_type == "map":
    assert "MAPHead_0" in params
  if rep_size:
    assert params["pre_logits"]["kernel"].shape[-1] == (32 if rep_size is True else rep_size)


def test_linear_student_keeps_teacher_tree(bv_fixture):
  meta, flat, ref = bv_fixture
  for fmap in ("elu1", "relu", "hedgehog", "favor"):
    student = vit.Model(**meta["model_config"], attention=fmap)
    p = jax.eval_shape(student.init, jax.random.PRNGKey(0), ref["images"])["params"]
    names = {
        "/".join(str(k.key) for k in path): tuple(x.shape)
        for path, x in jax.tree_util.tree_flatten_with_path(p)[0]
    }
    extra = {k for k in names if k not in meta["params"]}
    assert all(k.split("/")[-2].startswith("feature_map_") for k in extra), extra
    assert all(names[k] == tuple(v) for k, v in meta["params"].items())


def test_per_layer_attention_and_gelu_flag(bv_fixture):
  meta, flat, ref = bv_fixture
  cfg = dict(meta["model_config"])
  model = vit.Model(
      **cfg, attention=["softmax", "elu1", "softmax", "hedgehog"], gelu_approximate=False
  )
  params = model.init(jax.random.PRNGKey(0), ref["images"][:1])["params"]
  t = params["Transformer"]
  assert "feature_map_q" in t["encoderblock_3"]["MultiHeadDotProductAttention_0"]
  assert "feature_map_q" not in t["encoderblock_0"]["MultiHeadDotProductAttention_0"]
  with pytest.raises(ValueError, match="scan=True"):
    vit.Model(**cfg, attention=["softmax", "elu1", "softmax", "elu1"], scan=True).init(
        jax.random.PRNGKey(0), ref["images"][:1]
    )
  # Exact GELU differs from the tanh one big_vision uses, so parity needs the right flag.
  exact = vit.Model(**cfg, gelu_approximate=False)
  logits, _ = exact.apply({"params": unflatten(flat)}, ref["images"])
  assert 1e-7 < np.max(np.abs(np.asarray(logits) - ref["logits"]))


def test_unknown_model_field_is_named():
  with pytest.raises(TypeError, match="pool_typ"):
    vit.Model(10, variant="Ti/16", pool_typ="tok")
  with pytest.raises(ValueError, match="unknown feature map 'elu2'"):
    vit.Model(10, variant="Ti/16", attention="linear:elu2")
