"""models/layout.py owns the parameter-path names; the regexes built from them select exactly the
paths the hand-written literals did, on the param trees of real models (per-block and scanned,
softmax and linear with every lever), and every module a linear attention creates is listed."""

import itertools
import re

import jax
import jax.numpy as jnp
import pytest

from linvit_jax.conversion import optim
from linvit_jax.conversion import surgery
from linvit_jax.models import attention as attn_lib
from linvit_jax.models import feature_maps
from linvit_jax.models import layout
from linvit_jax.models import vit
from linvit_jax.runtime import tree as tree_lib

# The literals as they stood before the names moved to layout.py: the reference, kept here only.
_OLD_ATTN_MODULE = r"Transformer/encoderblock(_\d+)?/MultiHeadDotProductAttention_0"
OLD_STAGE_TRAINABLE = {
    "distill_attention": _OLD_ATTN_MODULE + "/.*",
    "attention": _OLD_ATTN_MODULE + "/.*",
    "attention_routing": _OLD_ATTN_MODULE + r"/(query|key|feature_map_[qk]|conv_v|window|sinks)/.*",
    "attention_features": _OLD_ATTN_MODULE
    + r"/(value|out|feature_map_[qk]|conv_v|window|sinks)/.*",
    "finetune": r".*",
    "all": r".*",
}
_OLD_BLOCK = r"Transformer/encoderblock_\d+"
_OLD_ATTN = _OLD_BLOCK + "/MultiHeadDotProductAttention_0"
_OLD_FEATURE_MAP_RULE = (_OLD_ATTN + r"/(feature_map_[qk]|conv_v|window|sinks)/.*", "keep")
_OLD_PROJECTIONS = _OLD_ATTN + r"/(query|key|value|out)/.*"
_OLD_AGNOSTIC = [
    (r"embedding/.*", "copy"),
    (r"cls", "copy"),
    (r"reg", "copy"),
    (r"pos_embedding", "copy"),
    (_OLD_BLOCK + r"/LayerNorm_\d+/.*", "copy"),
    (_OLD_BLOCK + r"/MlpBlock_0/.*", "copy"),
    (r"Transformer/encoder_norm/.*", "copy"),
    (r"MAPHead_0/.*", "copy"),
    (r"pre_logits/.*", "copy"),
    (r"head/.*", "copy"),
]
OLD_POLICIES = {
    "copy_same": [_OLD_FEATURE_MAP_RULE, (_OLD_PROJECTIONS, "keep")]
    + _OLD_AGNOSTIC
    + [(r".*", "keep")],
    "copy_all": [_OLD_FEATURE_MAP_RULE, (r".*", "copy")],
    "copy_attention_only": [
        _OLD_FEATURE_MAP_RULE,
        (_OLD_PROJECTIONS, "copy"),
        (r".*", "keep"),
    ],
    "copy_none": [(r".*", "keep")],
}
OLD_SUMMARY_ATTENTION = _OLD_ATTN + "/.*"  # SurgeryReport.summary's "attention" group
OLD_SCANNED = "Transformer/encoderblock/"  # surgery's and depth_axes' prefix

# One "on" value per AttentionSpec lever. A lever added to attention.LINEAR_LEVERS fails
# test_every_lever_is_exercised until it is added here, and then the coverage test checks that
# the modules it creates are listed in layout.
LEVER_ON = {
    "exact_prefix_rows": True,
    "center_keys": True,
    "conv_v": True,
    "window": 3,
    "sinks": 2,
}

_TINY = dict(
    num_classes=3, patch_size=(4, 4), width=16, depth=3, mlp_dim=32, num_heads=2, pool_type="tok"
)
_IMAGES = jax.ShapeDtypeStruct((1, 16, 16, 3), jnp.float32)  # a 4×4 patch grid (conv_v, window)


def _linear(fmap: str, **levers) -> attn_lib.AttentionSpec:
  return attn_lib.AttentionSpec(kind="linear", feature_map=fmap, **levers)


_ALL_ON_WINDOW = dict(LEVER_ON)  # window and sinks share one gate, named "window" when both are on
_ALL_ON_SINKS = {k: v for k, v in LEVER_ON.items() if k != "window"}

MODELS = {
    "softmax_per_block": dict(_TINY),
    "softmax_scanned": dict(_TINY, scan=True),
    "softmax_map_head_registers": dict(_TINY, pool_type="map", reg_tokens=2, rep_size=8),
    # A hybrid per-block student: every lever somewhere, a softmax layer left in.
    "linear_per_block": dict(
        _TINY,
        attention=(
            _linear("hedgehog", **_ALL_ON_WINDOW),
            _linear("hedgehog_exp", **_ALL_ON_SINKS),
            attn_lib.AttentionSpec(kind="softmax"),
        ),
    ),
    "linear_scanned_window": dict(
        _TINY, scan=True, attention=_linear("hedgehog", **_ALL_ON_WINDOW)
    ),
    "linear_scanned_sinks": dict(
        _TINY, scan=True, attention=_linear("hedgehog_exp", **_ALL_ON_SINKS)
    ),
    "linear_map_head": dict(
        _TINY, pool_type="map", reg_tokens=1, attention=_linear("elu1", conv_v=True)
    ),
}


def _params_shapes(model_kw):
  model = vit.Model(**model_kw)
  return jax.eval_shape(model.init, jax.random.PRNGKey(0), _IMAGES)["params"]


@pytest.fixture(scope="module")
def paths():
  """Every leaf path of every model, as it is and in surgery's per-block view."""
  out = set()
  for kw in MODELS.values():
    shapes = _params_shapes(kw)
    depth = kw["depth"]
    for p in tree_lib.flatten(shapes):
      out.add(p)
      if p.startswith(OLD_SCANNED):
        out.update(f"Transformer/encoderblock_{i}/{p[len(OLD_SCANNED):]}" for i in range(depth))
  return sorted(out)


def _selected(pattern, paths):
  return [p for p in paths if re.fullmatch(pattern, p)]


def test_the_models_hold_every_name(paths):
  # Else the comparisons below could pass on paths that never show the difference.
  joined = "\n".join(paths)
  for name in layout.LINEAR_ONLY + layout.PROJECTIONS:
    assert f"/{layout.ATTN}/{name}/" in joined, name
  assert any(p.startswith(layout.SCANNED_PREFIX) for p in paths)
  assert any(p.startswith("MAPHead_0/" + layout.ATTN + "/") for p in paths)  # not the encoder's


@pytest.mark.parametrize("name", sorted(OLD_STAGE_TRAINABLE))
def test_trainable_masks_select_what_the_literals_did(paths, name):
  assert set(optim.STAGE_TRAINABLE) == set(OLD_STAGE_TRAINABLE)
  new = _selected(optim.STAGE_TRAINABLE[name], paths)
  assert new == _selected(OLD_STAGE_TRAINABLE[name], paths)
  assert new  # not vacuous


@pytest.mark.parametrize("name", sorted(OLD_POLICIES))
def test_surgery_rules_select_what_the_literals_did(paths, name):
  assert set(surgery.POLICIES) == set(OLD_POLICIES)
  new, old = surgery.POLICIES[name], OLD_POLICIES[name]
  assert [a for _, a in new] == [a for _, a in old]
  for (new_re, _), (old_re, _) in zip(new, old):
    assert _selected(new_re, paths) == _selected(old_re, paths), old_re


def test_surgery_names_select_what_the_literals_did(paths):
  assert _selected(surgery.FEATURE_MAP_RULE[0], paths) == _selected(_OLD_FEATURE_MAP_RULE[0], paths)
  assert _selected(surgery.ATTENTION_PROJECTIONS, paths) == _selected(_OLD_PROJECTIONS, paths)
  assert _selected(layout.attention_re(per_block=True), paths) == _selected(
      OLD_SUMMARY_ATTENTION, paths
  )
  assert layout.SCANNED_PREFIX == OLD_SCANNED
  assert [layout.depth_axes(p) for p in paths] == [int(p.startswith(OLD_SCANNED)) for p in paths]
  assert [layout.block_path(i) for i in range(3)] == [
      f"Transformer/encoderblock_{i}" for i in range(3)
  ]


def test_block_regexes_match_their_layouts(paths):
  blocks = {"/".join(p.split("/")[:2]) for p in paths if p.startswith("Transformer/")}
  assert {b for b in blocks if re.fullmatch(layout.BLOCK_RE, b)} == {
      b for b in blocks if re.fullmatch(r"Transformer/encoderblock(_\d+)?", b)
  }
  assert {b for b in blocks if re.fullmatch(layout.PER_BLOCK_RE, b)} == {
      b for b in blocks if re.fullmatch(r"Transformer/encoderblock_\d+", b)
  }
  assert re.fullmatch(layout.one_of(["a.b", "c"]), "a.b")
  assert not re.fullmatch(layout.one_of(["a.b", "c"]), "axb")  # names match literally


# ------------------------------------------------------------------------------------------------
# A module a linear attention creates must be one layout lists (so masks and surgery see it).


def test_every_lever_is_exercised():
  assert set(LEVER_ON) == set(attn_lib.LINEAR_LEVERS), (
      "a new AttentionSpec lever: give it an 'on' value in LEVER_ON, and list the modules it "
      "creates in models/layout.py (LEVER_MODULES)"
  )


def _lever_settings():
  """Each lever alone, every pair, and all of them (with and without the window: window and
  sinks name their shared gate after whichever is on)."""
  names = sorted(LEVER_ON)
  for r in (0, 1, 2):
    for combo in itertools.combinations(names, r):
      yield {n: LEVER_ON[n] for n in combo}
  yield dict(_ALL_ON_WINDOW)
  yield dict(_ALL_ON_SINKS)


def test_every_attention_submodule_is_listed_in_layout():
  x = jax.ShapeDtypeStruct((1, 1 + 16, 16), jnp.float32)  # cls + a 4×4 grid
  seen = set()
  for fmap in sorted(feature_maps.FEATURE_MAPS):
    for levers in _lever_settings():
      module = attn_lib.Attention(num_heads=2, spec=_linear(fmap, **levers), num_prefix_tokens=1)
      params = jax.eval_shape(module.init, jax.random.PRNGKey(0), x)["params"]
      unlisted = set(params) - set(layout.PROJECTIONS + layout.LINEAR_ONLY)
      assert not unlisted, (
          f"linear attention ({fmap}, {levers}) creates sub-module(s) {sorted(unlisted)} that "
          "models/layout.py does not list: add them to LEVER_MODULES (or FEATURE_MAPS) so the "
          "trainable masks and surgery rules cover them"
      )
      seen |= set(params)
  softmax = attn_lib.Attention(num_heads=2)
  assert set(jax.eval_shape(softmax.init, jax.random.PRNGKey(0), x)["params"]) == set(
      layout.PROJECTIONS
  )
  # Nor does layout list a name no module creates any more.
  assert seen == set(layout.PROJECTIONS + layout.LINEAR_ONLY)


def test_every_linear_only_module_is_trainable_and_kept_by_surgery(paths):
  for name in layout.LINEAR_ONLY:
    leaves = [p for p in paths if f"/{layout.ATTN}/{name}/" in p and p.startswith("Transformer/")]
    assert leaves, name
    for p in leaves:
      for stage in ("attention", "attention_routing", "attention_features"):
        assert re.fullmatch(optim.STAGE_TRAINABLE[stage], p), (stage, p)
      if not p.startswith(layout.SCANNED_PREFIX):  # surgery sees per-block paths only
        assert re.fullmatch(surgery.FEATURE_MAP_RULE[0], p), p
