"""Weights from Hugging Face and timm (models/foreign.py, import_weights), proven against the
source frameworks' own forward passes on tiny random models (tests/data/foreign, made by
tools/make_import_fixtures.py with torch; no torch here)."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from linvit_jax.models import checkpoints
from linvit_jax.models import foreign
from linvit_jax.models import foreign_files
from linvit_jax.models import import_weights
from linvit_jax.models import posemb
from linvit_jax.models import vit
from linvit_jax.models import vit_checkpoint
from tests.helpers.foreign_fixtures import FOREIGN
from tests.helpers.foreign_fixtures import copy_folder
from tests.helpers.foreign_fixtures import write_safetensors

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAMILIES = {
    "hf_dinov2": dict(reg_tokens=0, pool_type="tok", gelu_approximate=False),
    "hf_dinov2_registers": dict(reg_tokens=3, pool_type="tok", gelu_approximate=False),
    "hf_vit": dict(reg_tokens=0, pool_type="tok", num_classes=5, layernorm_epsilon=1e-12),
    "hf_siglip": dict(reg_tokens=0, pool_type="map", gelu_approximate=True),
    "timm_dinov2_registers": dict(reg_tokens=2, pool_type="tok", gelu_approximate=False),
    "timm_vit": dict(reg_tokens=0, pool_type="tok", num_classes=5),
    "timm_siglip": dict(reg_tokens=0, pool_type="map", gelu_approximate=True),
}
TOL = 1e-4  # max abs difference on the final tokens, float32 (measured: ≤ 5e-6)


def _model_kwargs(arch):
  return {k: v for k, v in arch.items() if k not in ("posemb_grid", "preprocessing")}


def _forward(init, images):
  arch = _model_kwargs(vit_checkpoint.infer_vit_config(init))
  model = vit.Model(**arch)
  shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), images)["params"]
  params = vit.load(shapes, init, arch)
  logits, out = jax.jit(model.apply)({"params": params}, images)
  return logits, out


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_parity_with_source_framework(family):
  folder = os.path.join(FOREIGN, family)
  ref = np.load(os.path.join(folder, "reference.npz"))
  arch = vit_checkpoint.infer_vit_config(folder)
  for k, v in FAMILIES[family].items():
    assert arch[k] == v, (k, arch[k])
  for suffix in ("", "_42", "_21"):  # other resolutions: the position table resized as torch does
    if "images" + suffix not in ref:
      continue
    logits, out = _forward(folder, ref["images" + suffix])
    err = np.max(np.abs(np.asarray(out["encoded"]) - ref["encoded" + suffix]))
    assert err <= TOL, (family, suffix, err)
  if "logits" in ref:
    logits, _ = _forward(folder, ref["images"])
    assert np.max(np.abs(np.asarray(logits) - ref["logits"])) <= TOL
  if "pooled" in ref:
    assert np.max(np.abs(np.asarray(out["pre_logits"]) - ref["pooled"])) <= TOL


def test_a_wrong_mapping_would_fail():
  """The tolerance is meaningful: the same weights without their LayerScale fold are far off."""
  folder = os.path.join(FOREIGN, "hf_dinov2")
  ref = np.load(os.path.join(folder, "reference.npz"))
  imported = foreign.read(folder)
  flat = checkpoints.flatten(imported.params)
  key = "Transformer/encoderblock_0/MlpBlock_0/Dense_1/kernel"
  flat[key] = flat[key] * 1.01
  model = vit.Model(**_model_kwargs(imported.arch))
  _, out = model.apply({"params": checkpoints.unflatten(flat)}, ref["images"])
  assert np.max(np.abs(np.asarray(out["encoded"]) - ref["encoded"])) > 10 * TOL


def test_source_config_read():
  arch = vit_checkpoint.infer_vit_config(os.path.join(FOREIGN, "hf_dinov2"))
  assert arch["preprocessing"]["mean"] == [0.485, 0.456, 0.406]
  assert arch["patch_size"] == (7, 7) and arch["posemb_grid"] == (4, 4)
  siglip = vit_checkpoint.infer_vit_config(os.path.join(FOREIGN, "hf_siglip"))
  assert siglip["preprocessing"]["mean"] == [0.5, 0.5, 0.5]
  assert foreign.read(os.path.join(FOREIGN, "timm_vit")).posemb_resample.endswith("antialias")


def test_torch_bicubic_identity_and_shape():
  pe = np.random.RandomState(0).randn(1, 16, 5).astype(np.float32)
  for aa in (False, True):
    np.testing.assert_allclose(posemb.resample_posemb_torch(pe, (4, 4), aa), pe, atol=1e-6)
    assert posemb.resample_posemb_torch(pe, (6, 3), aa).shape == (1, 18, 5)


def test_import_weights_cli_round_trip(tmp_path):
  """The written npz + JSON load back (vit.load, infer_vit_config) to the same outputs."""
  folder = os.path.join(FOREIGN, "hf_dinov2_registers")
  ref = np.load(os.path.join(folder, "reference.npz"))
  out = str(tmp_path / "dinov2.npz")
  assert import_weights.main([folder, out]) == 0
  with open(str(tmp_path / "dinov2.json")) as f:
    info = json.load(f)
  assert info["model_config"]["reg_tokens"] == 3 and info["preprocessing"]["std"][0] == 0.229
  arch = vit_checkpoint.infer_vit_config(out)
  assert arch["reg_tokens"] == 3 and arch["gelu_approximate"] is False
  for suffix in ("", "_42"):
    _, o = _forward(out, ref["images" + suffix])
    assert np.max(np.abs(np.asarray(o["encoded"]) - ref["encoded" + suffix])) <= TOL


@pytest.mark.parametrize(
    "make, match",
    [
        (
            lambda t: copy_folder(
                t,
                "hf_dinov2",
                config_edit={"model_type": "convnext", "architectures": ["ConvNextModel"]},
            ),
            r"ConvNextModel \(model_type 'convnext'\), not a ViT",
        ),
        (lambda t: copy_folder(t, "hf_vit", config_edit={"model_type": "bert"}), "not a ViT"),
        (
            lambda t: copy_folder(t, "hf_dinov2", drop=("encoder.layer.1.mlp.fc2.bias",)),
            r"missing tensor 'encoder.layer.1.mlp.fc2.bias'",
        ),
        (
            lambda t: copy_folder(t, "hf_dinov2", config_edit={"hidden_size": 48}),
            r"has shape \(32, 3, 7, 7\), but config.json says \(48, 3, 7, 7\)",
        ),
        (lambda t: copy_folder(t, "hf_dinov2", config_edit={"use_swiglu_ffn": True}), "SwiGLU"),
        (
            lambda t: copy_folder(t, "timm_vit", drop=("norm.weight",)),
            r"missing tensor 'norm.weight'",
        ),
        (lambda t: str(t), "without config.json"),
    ],
)
def test_bad_sources_name_the_file_and_problem(tmp_path, make, match):
  src = make(tmp_path)
  out = str(tmp_path / "out" / "x.npz")
  with pytest.raises(checkpoints.CheckpointError, match=match) as e:
    import_weights.import_weights(src, out)
  assert src.split(os.sep)[-1] in str(e.value)
  assert not os.path.exists(out) and not os.path.exists(
      foreign.sidecar_path(out)
  )  # nothing half-written


def test_pickle_and_extra_tensors(tmp_path):
  pth = tmp_path / "model.pth"
  pth.write_bytes(b"\x80\x02}q\x00.")
  with pytest.raises(
      checkpoints.CheckpointError, match=r"model.pth': a PyTorch pickle .*safetensors"
  ):
    foreign.read(str(pth))
  src = tmp_path / "timm.safetensors"
  tensors = foreign_files.read_safetensors(os.path.join(FOREIGN, "timm_vit", "model.safetensors"))
  write_safetensors(str(src), dict(tensors, **{"blocks.0.attn.q_norm.weight": np.ones(16)}))
  with pytest.raises(checkpoints.CheckpointError, match="qk_norm"):
    foreign.read(str(src), num_heads=2)
  write_safetensors(str(src), tensors)
  with pytest.raises(checkpoints.CheckpointError, match="--num_heads"):
    foreign.read(str(src))  # a bare timm file: no config says how many heads
  assert foreign.read(str(src), num_heads=2).arch["num_heads"] == 2


def test_cli_pickle_init_is_one_line_not_a_config_field(tmp_path):
  """A .pth as init= says what it is (before: 'no such config field ...')."""
  pth = tmp_path / "model.pth"
  pth.write_bytes(b"\x80\x02}q\x00.")
  photos = tmp_path / "photos"
  photos.mkdir()
  proc = subprocess.run(
      [
          sys.executable,
          "-m",
          "linvit_jax.main",
          "--config",
          f"configs/convert_folder.py:init={pth},images={photos}",
          "--workdir",
          str(tmp_path / "w"),
      ],
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert proc.returncode == 2, proc.stderr
  last = proc.stderr.strip().splitlines()[-1]
  assert "PyTorch pickle" in last and "no such config field" not in last, proc.stderr


def test_convert_folder_from_hugging_face_dinov2_with_registers(tiny_hf_conversion):
  """A Hugging Face folder goes straight into convert_folder (through the Python API):
  registers, exact GELU and the source's mean/std picked up; the student keeps its registers."""
  student, workdir = tiny_hf_conversion
  run_config = json.loads((workdir / "config.json").read_text())
  assert run_config["model"]["reg_tokens"] == 3 and run_config["model"]["gelu_approximate"] is False
  assert "vgg_value_range(mean=(123.675" in run_config["data"]["pp_train"]
  results = json.loads((workdir / "results.json").read_text())
  e2e = results["end_to_end_converted"]
  assert 0.3 < e2e["cls_cosine"] <= 1.0001 and 0.3 < e2e["patch_cosine"] <= 1.0001
  assert student.config["model"]["reg_tokens"] == 3
  assert student.params["reg"].shape == (1, 3, 32)
