"""checkpoints.py and models/vit_checkpoint.py against a real big_vision checkpoint (tests/data,
see its .json)."""

import os
import threading
import time
import types

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from linvit_jax import build
from linvit_jax.models import checkpoints as ckpt
from linvit_jax.models import posemb
from linvit_jax.models import vit
from linvit_jax.models import vit_checkpoint as vit_ckpt
from linvit_jax.models.checkpoints import CheckpointError
from linvit_jax.models.variants import decode_variant
from linvit_jax.runtime import gfile
from tests.helpers import bv_checkpoint
from tests.helpers import robust_common as robust
from tests.helpers import robust_config as rc
from tests.helpers.robust_common import GS_PATH

DATA = os.path.join(os.path.dirname(__file__), "data")
FIXTURE = os.path.join(DATA, "vit_w192_d4_p16_i64_tok_learn.npz")
CFG = bv_checkpoint.model_config()


@pytest.fixture(scope="module")
def meta():
  return bv_checkpoint.meta()


@pytest.fixture(scope="module")
def params():
  return ckpt.load_npz(FIXTURE)


def fresh(params):
  """A copy with fresh arrays, so a test can tamper without touching the shared fixture."""
  return ckpt.unflatten({k: np.array(v) for k, v in ckpt.flatten(params).items()})


def assert_bitwise_equal(a, b):
  fa, fb = ckpt.flatten(a), ckpt.flatten(b)
  assert fa.keys() == fb.keys()
  for k in fa:
    x, y = np.asarray(fa[k]), np.asarray(fb[k])
    assert x.dtype == y.dtype and x.shape == y.shape, k
    assert x.tobytes() == y.tobytes(), k


def temp_files(directory):
  return [n for n in os.listdir(directory) if n.endswith(".tmp") or ".tmp-" in n]


# ------------------------------------------------------------------------------------------------
# Reading and writing.


def test_load_fixture_gives_big_vision_tree(params, meta):
  flat = ckpt.flatten(params)
  assert {k: list(v.shape) for k, v in flat.items()} == meta["params"]
  assert sum(v.size for v in flat.values()) == meta["num_params"] == 1932682
  assert all(v.dtype == np.float32 for v in flat.values())
  assert sorted(params) == ["Transformer", "cls", "embedding", "head", "pos_embedding"]
  with np.load(FIXTURE) as raw:  # Same bits as a plain np.load.
    assert all(raw[k].tobytes() == flat[k].tobytes() for k in raw.files)


def test_flatten_unflatten_round_trip(params):
  assert_bitwise_equal(ckpt.unflatten(ckpt.flatten(params)), params)
  with pytest.raises(CheckpointError, match="nests under .a., which is itself an array"):
    ckpt.unflatten({"a": 1, "a/b": 2})
  with pytest.raises(CheckpointError, match="without '/'"):
    ckpt.flatten({"a/b": np.zeros(1)})


def test_save_load_round_trip_is_bitwise_and_leaves_no_temp_file(params, tmp_path):
  path = str(tmp_path / "sub" / "out.npz")  # Parent is created.
  ckpt.save_npz(path, params)
  assert_bitwise_equal(ckpt.load_npz(path), params)
  assert temp_files(tmp_path / "sub") == []
  with np.load(path) as raw, np.load(FIXTURE) as orig:  # big_vision's own key layout.
    assert sorted(raw.files) == sorted(orig.files)


def test_save_is_atomic_old_file_survives_a_failed_write(params, tmp_path, monkeypatch):
  path = str(tmp_path / "out.npz")
  old = {"only": {"leaf": np.arange(3, dtype=np.float32)}}
  ckpt.save_npz(path, old)

  def broken_savez(*args, **kwargs):
    raise OSError("disk full")

  monkeypatch.setattr(np, "savez", broken_savez)
  with pytest.raises(OSError, match="disk full"):
    ckpt.save_npz(path, params)
  monkeypatch.undo()
  assert_bitwise_equal(ckpt.load_npz(path), old)
  assert temp_files(tmp_path) == []
  ckpt.save_npz(path, params)  # And a successful save does replace it.
  assert_bitwise_equal(ckpt.load_npz(path), params)


def test_bfloat16_is_stored_as_void_and_recovered(params, tmp_path):
  bf = ckpt.unflatten({k: v.astype(ml_dtypes.bfloat16) for k, v in ckpt.flatten(params).items()})
  path = str(tmp_path / "bf16.npz")
  ckpt.save_npz(path, bf)
  with np.load(path) as raw:
    assert raw["cls"].dtype.str == "|V2"  # As big_vision / np.savez writes bfloat16.
  back = ckpt.load_npz(path)
  assert ckpt.flatten(back)["cls"].dtype == ml_dtypes.bfloat16
  assert_bitwise_equal(back, bf)


def test_train_checkpoint_layouts_and_subtree_selector(params, tmp_path):
  flat = ckpt.flatten(params)
  # optax-era train checkpoint: params next to optimizer state.
  p1 = str(tmp_path / "optax.npz")
  np.savez(
      p1,
      **{f"params/{k}": v for k, v in flat.items()},
      **{"opt/0/mu/head/bias": np.zeros(10, np.float32), "step": np.array(7)},
  )
  assert_bitwise_equal(ckpt.load_npz(p1), params)
  # flax.optim-era: opt/target.
  p2 = str(tmp_path / "flaxoptim.npz")
  np.savez(p2, **{f"opt/target/{k}": v for k, v in flat.items()}, **{"opt/state/step": np.array(7)})
  assert_bitwise_equal(ckpt.load_npz(p2), params)
  # Two-tower checkpoint: `file:img` picks the image tower, also under params/.
  p3 = str(tmp_path / "two_tower.npz")
  np.savez(
      p3,
      **{f"params/img/{k}": v for k, v in flat.items()},
      **{"params/txt/Embed_0/embedding": np.zeros((8, 4), np.float32)},
  )
  assert_bitwise_equal(ckpt.load_npz(p3 + ":img"), params)
  assert_bitwise_equal(ckpt.load_npz(p3 + ":img/Transformer"), params["Transformer"])


def test_remote_paths_go_through_gfile(params, tmp_path, monkeypatch):
  """gs:// paths use tf.io.gfile (faked here over a local folder), with the same semantics."""

  def local(p):
    return str(tmp_path / p.split("://", 1)[1])  # gs://bucket/x -> tmp_path/bucket/x

  fake = types.SimpleNamespace(
      exists=lambda p: os.path.exists(local(p)),
      isdir=lambda p: os.path.isdir(local(p)),
      makedirs=lambda p: os.makedirs(local(p), exist_ok=True),
      GFile=lambda p, mode: open(local(p), mode),
      remove=lambda p: os.remove(local(p)),
      rename=lambda a, b, overwrite: os.replace(local(a), local(b)),
  )
  monkeypatch.setattr(gfile, "tf_gfile", lambda: fake)
  ckpt.save_npz("gs://bucket/run/ckpt.npz", {"img": params})
  assert temp_files(tmp_path / "bucket" / "run") == []
  assert_bitwise_equal(ckpt.load_npz("gs://bucket/run/ckpt.npz:img"), params)
  with pytest.raises(CheckpointError, match="gs://bucket/nope.npz': file not found"):
    ckpt.load_npz("gs://bucket/nope.npz")


# ------------------------------------------------------------------------------------------------
# Layout conversions.


def test_pyloop_scan_round_trip_is_bitwise(params):
  scan = vit_ckpt.pyloop_to_scan(params)
  enc = scan["Transformer"]
  assert sorted(enc) == ["encoder_norm", "encoderblock"]
  q = enc["encoderblock"]["MultiHeadDotProductAttention_0"]["query"]["kernel"]
  assert q.shape == (4, 192, 3, 64)
  np.testing.assert_array_equal(
      q[2],
      params["Transformer"]["encoderblock_2"]["MultiHeadDotProductAttention_0"]["query"]["kernel"],
  )
  assert "encoderblock_0" in params["Transformer"]  # Input untouched.
  assert_bitwise_equal(vit_ckpt.scan_to_pyloop(scan), params)
  assert_bitwise_equal(vit_ckpt.pyloop_to_scan(scan), scan)  # Already scanned: unchanged.
  assert_bitwise_equal(vit_ckpt.scan_to_pyloop(params), params)


def test_pyloop_to_scan_rejects_gaps_in_block_numbers(params):
  p = fresh(params)
  del p["Transformer"]["encoderblock_1"]
  with pytest.raises(CheckpointError, match=r"numbered 0\.\.2.*\[0, 2, 3\]"):
    vit_ckpt.pyloop_to_scan(p)


def augreg_style(params, slot):
  """The fixture as google-research/vision_transformer (pre-linen) wrote ViTs."""
  old = fresh(params)
  enc = old["Transformer"]
  renames = {
      "LayerNorm_0": "LayerNorm_0",
      "MultiHeadDotProductAttention_0": "MultiHeadDotProductAttention_1",
      "LayerNorm_1": "LayerNorm_2",
      "MlpBlock_0": "MlpBlock_3",
  }
  for i in range(4):
    enc[f"encoderblock_{i}"] = {renames[k]: v for k, v in enc[f"encoderblock_{i}"].items()}
  pe = old.pop("pos_embedding")
  enc["posembed_input"] = {"pos_embedding": np.concatenate([slot, pe], axis=1)}
  return old


def test_augreg_checkpoint_is_fixed_back_to_the_original(params, tmp_path):
  slot = np.random.default_rng(0).normal(size=(1, 1, 192)).astype(np.float32)
  old = augreg_style(params, slot)
  assert "MlpBlock_3" in old["Transformer"]["encoderblock_0"]
  fixed = vit_ckpt.fix_old_checkpoints(old)
  assert "posembed_input" in old["Transformer"]  # Pure: input untouched.
  expected = fresh(params)
  expected["cls"] = params["cls"] + slot  # Old ViTs added the slot to [cls] before the encoder.
  assert_bitwise_equal(fixed, expected)
  # The same through a file and the full load path.
  path = str(tmp_path / "augreg.npz")
  ckpt.save_npz(path, old)
  assert_bitwise_equal(vit_ckpt.load_vit_params(params, path, CFG), expected)


def test_fix_old_checkpoints_other_eras(params):
  # 2021-era: posemb directly in the encoder, no cls slot (gap model).
  p = fresh(params)
  p["Transformer"]["pos_embedding"] = p.pop("pos_embedding")
  assert_bitwise_equal(vit_ckpt.fix_old_checkpoints(p), params)
  # ViT-G era: MAP head inlined at the top level.
  head = {
      "probe": np.ones((1, 1, 4), np.float32),
      "LayerNorm_0": {"scale": np.ones(4)},
      "MlpBlock_0": {"Dense_0": {"kernel": np.ones((4, 8))}},
      "MultiHeadDotProductAttention_0": {"out": {"bias": np.zeros(4)}},
  }
  fixed = vit_ckpt.fix_old_checkpoints({**fresh(params), **head})
  assert_bitwise_equal(fixed["MAPHead_0"], head)
  assert "probe" not in fixed
  # A current checkpoint is left alone.
  assert_bitwise_equal(vit_ckpt.fix_old_checkpoints(params), params)


def test_non_square_posemb_is_not_mistaken_for_a_cls_slot(params, tmp_path):
  """A 2x5 grid has N = 10 = 3*3 + 1: big_vision's old-checkpoint test alone would split it."""
  p = fresh(params)
  p["pos_embedding"] = np.random.default_rng(2).normal(size=(1, 10, 192)).astype(np.float32)
  path = write(tmp_path, p, "nonsquare.npz")
  assert_bitwise_equal(vit_ckpt.load_vit_params(p, path, CFG), p)
  # big_vision's rule alone:
  assert vit_ckpt.fix_old_checkpoints(p)["pos_embedding"].shape == (1, 9, 192)
  init = fresh(p)
  init["pos_embedding"] = np.zeros((1, 12, 192), np.float32)  # Grid unknowable from shapes.
  with pytest.raises(
      CheckpointError,
      match=r"nonsquare\.npz': cannot resample 'pos_embedding'"
      r": model pos_embedding \(1, 12, 192\) has 12 "
      r"positions, not a square grid",
  ):
    vit_ckpt.load_vit_params(init, path, CFG)


def test_convert_pre_linen_renumbers_per_type_in_numeric_order():
  tree = {
      "Dense_10": 10,
      "Dense_2": 2,
      "Conv_5": 5,
      "Conv_11": 11,
      "head": 0,
      "Block_3": {"LayerNorm_1": 1, "LayerNorm_7": 7},
  }
  assert vit_ckpt.convert_pre_linen(tree) == {
      "Dense_0": 2,
      "Dense_1": 10,
      "Conv_0": 5,
      "Conv_1": 11,
      "head": 0,
      "Block_0": {"LayerNorm_0": 1, "LayerNorm_1": 7},
  }


# ------------------------------------------------------------------------------------------------
# Position embeddings.


def test_resample_posemb_bilinear_on_grids():
  i, j = np.mgrid[:4, :4].astype(np.float32)
  plane = (2 * i + 3 * j + 1)[..., None] * np.ones(5, np.float32)  # (4, 4, 5) linear ramp
  old = plane.reshape(1, 16, 5)
  new = posemb.resample_posemb(old, (1, 64, 5))
  grid = new.reshape(8, 8, 5)
  assert new.shape == (1, 64, 5) and new.dtype == np.float32
  # Corners map to corners, and a plane stays a plane (so its mean is kept).
  for (a, b), (c, d) in [((0, 0), (0, 0)), ((0, 3), (0, 7)), ((3, 0), (7, 0)), ((3, 3), (7, 7))]:
    np.testing.assert_allclose(grid[c, d], plane[a, b], rtol=1e-6)
  np.testing.assert_allclose(grid.mean(), plane.mean(), rtol=1e-5)
  ii, jj = np.mgrid[:8, :8] * (3 / 7)
  np.testing.assert_allclose(grid[..., 0], 2 * ii + 3 * jj + 1, rtol=1e-5)
  # Random data: mean roughly kept; same shape: identity.
  rnd = np.random.default_rng(1).normal(size=(1, 16, 8)).astype(np.float32)
  up = posemb.resample_posemb(rnd, np.zeros((1, 64, 8)))
  assert abs(up.mean() - rnd.mean()) < 0.1
  assert posemb.resample_posemb(rnd, rnd).tobytes() == rnd.tobytes()
  # Non-square grids with explicit (h, w); bf16 in, bf16 out.
  ns = posemb.resample_posemb(rnd.astype(ml_dtypes.bfloat16), (1, 48, 8), new_hw=(6, 8))
  assert ns.shape == (1, 48, 8) and ns.dtype == ml_dtypes.bfloat16
  with pytest.raises(CheckpointError, match="48 positions, not a square grid"):
    posemb.resample_posemb(rnd, (1, 48, 8))
  with pytest.raises(CheckpointError, match="width differs"):
    posemb.resample_posemb(rnd, (1, 64, 9))


def test_load_resamples_posemb_to_the_model_grid_and_casts(params):
  init = fresh(params)
  init["pos_embedding"] = np.zeros((1, 64, 192), np.float32)  # 128px model
  init = ckpt.unflatten({k: v.astype(ml_dtypes.bfloat16) for k, v in ckpt.flatten(init).items()})
  out = vit_ckpt.load_vit_params(init, FIXTURE, CFG)
  flat = ckpt.flatten(out)
  assert all(type(v) is np.ndarray and v.dtype == ml_dtypes.bfloat16 for v in flat.values())
  expected = posemb.resample_posemb(params["pos_embedding"], (1, 64, 192))
  np.testing.assert_array_equal(flat["pos_embedding"], expected.astype(ml_dtypes.bfloat16))


def test_load_converts_layout_to_the_model_config(params):
  scan_init = vit_ckpt.pyloop_to_scan(params)
  out = vit_ckpt.load_vit_params(scan_init, FIXTURE, {**CFG, "scan": True})
  assert_bitwise_equal(out, scan_init)
  scan_file_out = vit_ckpt.load_vit_params(params, FIXTURE, {**CFG, "scan": False})
  assert_bitwise_equal(scan_file_out, params)


def test_dont_load_swaps_in_a_new_head(params):
  init = fresh(params)
  init["head"] = {"kernel": np.zeros((192, 5), np.float32), "bias": np.full(5, 0.5, np.float32)}
  with pytest.raises(
      CheckpointError,
      match=r"shape mismatch at 'head/kernel': checkpoint " r"\(192, 10\) vs model \(192, 5\)",
  ):
    vit_ckpt.load_vit_params(init, FIXTURE, CFG)
  out = vit_ckpt.load_vit_params(init, FIXTURE, CFG, dont_load=["head/.*"])
  assert_bitwise_equal(out["head"], init["head"])
  rest = {k: v for k, v in out.items() if k != "head"}
  assert_bitwise_equal(rest, {k: v for k, v in params.items() if k != "head"})


def test_init_may_be_shape_dtype_structs(params):
  """jax.eval_shape gives objects with only .shape/.dtype; those are enough for the merge."""
  specs = ckpt.unflatten(
      {
          k: types.SimpleNamespace(shape=v.shape, dtype=v.dtype)
          for k, v in ckpt.flatten(params).items()
      }
  )
  assert_bitwise_equal(vit_ckpt.load_vit_params(specs, FIXTURE, CFG), params)


# ------------------------------------------------------------------------------------------------
# Bad checkpoints: each one a clear error saying what and where.


def write(tmp_path, tree, name="bad.npz"):
  path = str(tmp_path / name)
  ckpt.save_npz(path, tree)
  return path


def bad_truncated(params, tmp_path):
  path = str(tmp_path / "trunc.npz")
  with open(FIXTURE, "rb") as f:
    data = f.read()
  with open(path, "wb") as f:
    f.write(data[: len(data) // 2])
  return path, {}, r"trunc\.npz': truncated or corrupt"


def bad_not_a_zip(params, tmp_path):
  path = str(tmp_path / "text.npz")
  with open(path, "w") as f:
    f.write("this is not a checkpoint")
  return (
      path,
      {},
      r"text\.npz': not an \.npz \(a zip archive of arrays\), a \.safetensors file or a model folder",
  )


def bad_empty_file(params, tmp_path):
  path = str(tmp_path / "zero.npz")
  open(path, "wb").close()
  return path, {}, r"zero\.npz': file is empty"


def bad_empty_npz(params, tmp_path):
  path = str(tmp_path / "none.npz")
  np.savez(path)
  return path, {}, r"none\.npz': empty checkpoint"


def bad_wrong_shape(params, tmp_path):
  p = fresh(params)
  p["Transformer"]["encoderblock_1"]["MlpBlock_0"]["Dense_0"]["kernel"] = np.zeros((192, 700))
  return (
      write(tmp_path, p),
      {},
      (
          r"bad\.npz': shape mismatch at 'Transformer/encoderblock_1/"
          r"MlpBlock_0/Dense_0/kernel': checkpoint \(192, 700\) vs "
          r"model \(192, 768\)"
      ),
  )


def bad_missing_key(params, tmp_path):
  p = fresh(params)
  del p["Transformer"]["encoderblock_3"]["MlpBlock_0"]["Dense_0"]["kernel"]
  return (
      write(tmp_path, p),
      {},
      (
          r"bad\.npz': missing 'Transformer/encoderblock_3/MlpBlock_0/"
          r"Dense_0/kernel' \(expected shape \(192, 768\)\)"
      ),
  )


def bad_extra_key(params, tmp_path):
  p = fresh(params)
  p["foo"] = {"bar": np.zeros(3, np.float32)}
  return write(tmp_path, p), {}, r"bad\.npz': unexpected key 'foo/bar' \(shape \(3,\)\)"


def bad_dtype(params, tmp_path):
  p = fresh(params)
  p["embedding"]["bias"] = np.zeros(192, np.int32)
  return (
      write(tmp_path, p),
      {},
      (
          r"bad\.npz': dtype mismatch at 'embedding/bias': "
          r"checkpoint int32 \(integer\) vs model float32 \(float\)"
      ),
  )


def bad_non_finite(params, tmp_path):
  p = fresh(params)
  p["cls"][0, 0, :3] = [np.nan, np.inf, -np.inf]
  return write(tmp_path, p), {}, r"bad\.npz': non-finite values at 'cls': 3 of 192"


def bad_patch_size(params, tmp_path):
  return (
      FIXTURE,
      {"variant": "Ti/14"},
      (
          r"tok_learn\.npz': patch size \(16, 16\) "
          r"\(embedding/kernel \(16, 16, 3, 192\)\) but the model "
          r"config says \(14, 14\)"
      ),
  )


def bad_width(params, tmp_path):
  return FIXTURE, {"variant": "S/16"}, r"3 problems:\n  width 192 .* says 384\n  3 heads"


def bad_subtree(params, tmp_path):
  return (
      FIXTURE + ":img",
      {},
      (
          r"tok_learn\.npz': no subtree 'img' \('img' not found under "
          r"the top level\); available: 'Transformer', 'cls', 'embedding'"
      ),
  )


def bad_directory(params, tmp_path):
  # A folder is read as a Hugging Face / timm model folder (models/foreign.py); this one is not.
  return str(tmp_path), {}, r"a folder without config\.json .*a big_vision checkpoint is an \.npz"


def bad_nonexistent(params, tmp_path):
  return str(tmp_path / "nope.npz"), {}, r"nope\.npz': file not found"


def bad_single_array(params, tmp_path):
  path = str(tmp_path / "one.npz")
  with open(path, "wb") as f:
    np.save(f, np.zeros(3))
  return path, {}, r"one\.npz': holds a single array"


BAD = [
    bad_truncated,
    bad_not_a_zip,
    bad_empty_file,
    bad_empty_npz,
    bad_wrong_shape,
    bad_missing_key,
    bad_extra_key,
    bad_dtype,
    bad_non_finite,
    bad_patch_size,
    bad_width,
    bad_subtree,
    bad_directory,
    bad_nonexistent,
    bad_single_array,
]


@pytest.mark.parametrize("case", BAD, ids=[f.__name__[4:] for f in BAD])
def test_bad_checkpoint_raises_a_clear_error(case, params, tmp_path):
  path, cfg, message = case(params, tmp_path)
  with pytest.raises(CheckpointError, match=message):
    vit_ckpt.load_vit_params(params, path, cfg or CFG)


def test_merge_collects_all_problems_in_one_error(params):
  loaded = fresh(params)
  del loaded["head"]["bias"]
  loaded["extra"] = np.zeros(2, np.float32)
  loaded["embedding"]["kernel"] = np.zeros((14, 14, 3, 192), np.float32)
  with pytest.raises(CheckpointError) as info:
    ckpt.merge_params(loaded, params, source="x.npz")
  err = info.value
  assert isinstance(err, ValueError)
  assert str(err).startswith("checkpoint 'x.npz': 3 problems:")
  assert err.problems == [
      "shape mismatch at 'embedding/kernel': checkpoint (14, 14, 3, 192) vs model "
      "(16, 16, 3, 192)",
      "missing 'head/bias' (expected shape (10,))",
      "unexpected key 'extra' (shape (2,)), not in the model",
  ]
  assert "dont_load" in str(err)  # Says how to fix it.
  # dont_load exempts both sides: the init value is kept, the extra key ignored.
  merged = ckpt.merge_params(loaded, params, ["head/bias", "extra", "embedding/.*"])
  assert_bitwise_equal(merged, params)
  with pytest.raises(CheckpointError, match="not a valid regex"):
    ckpt.merge_params(loaded, params, ["head/("])


def test_decode_variant():
  assert decode_variant("S/16") == dict(
      width=384, depth=12, mlp_dim=1536, num_heads=6, patch_size=(16, 16)
  )
  assert decode_variant("So400m/14")["mlp_dim"] == 4304
  assert decode_variant("mu") == dict(width=32, depth=1, mlp_dim=128, num_heads=2)
  assert decode_variant(None) == {}
  with pytest.raises(ValueError, match="unknown ViT variant 'X/16'"):
    decode_variant("X/16")


# ------------------------------------------------------------------------------------------------
# Robustness (ROBUSTNESS.md): layouts follow the model config; remote reads fail fast.


@pytest.mark.parametrize(
    "saved_scan,model_scan",
    [(True, False), (False, True)],
    ids=["scanned_file_loop_model", "loop_file_scanned_model"],
)
def test_scan_layout_mismatch_is_converted_not_an_error(saved_scan, model_scan, tmp_path):
  """big_vision's semantics: the layout follows the model config; values are unchanged."""
  loop_path, path = str(tmp_path / "loop.npz"), str(tmp_path / "t.npz")
  rc.make_teacher(loop_path)
  robust.save_variant(path, scan=saved_scan)
  config = robust.config(path)
  config.model.scan = model_scan
  kw = build.model_kwargs(config.model)
  model = vit.Model(**kw, attention="softmax")
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((1, 28, 28, 1)))["params"]
  loaded = vit.load(shapes, path, kw)
  expected = ckpt.load_npz(loop_path)
  if model_scan:
    expected = vit_ckpt.pyloop_to_scan(expected)
  robust.assert_bitwise(robust.flat(loaded), robust.flat(expected))


def test_gs_path_without_network_fails_fast_and_says_why():
  import tensorflow as tf  # imported first: its import time is not what is measured

  del tf
  t0 = time.time()
  with pytest.raises(CheckpointError, match="credentials") as info:
    ckpt.load_npz(GS_PATH)
  assert time.time() - t0 < 60
  assert str(info.value).startswith(f"checkpoint '{GS_PATH}': ")


def test_remote_read_that_hangs_is_cut_off(monkeypatch):
  release = threading.Event()

  class HangingGFile:

    @staticmethod
    def exists(path):
      release.wait(30)
      return True

  monkeypatch.setattr(gfile, "tf_gfile", lambda: HangingGFile)
  monkeypatch.setattr(ckpt, "REMOTE_TIMEOUT_S", 0.5)
  t0 = time.time()
  try:
    with pytest.raises(CheckpointError, match=r"no answer within 0 s .*credentials"):
      ckpt.load_npz("gs://bucket/slow.npz")
  finally:
    release.set()
  assert time.time() - t0 < 10
