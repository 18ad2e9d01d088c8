"""Makes the tiny PyTorch-ecosystem ViTs that prove `linvit_jax.models.foreign` (test data).

Run once, by hand, in an environment that has a CPU torch with transformers and timm (CI never
runs it: the tests compare against the committed outputs, without torch):

  python -m venv /tmp/torchenv && /tmp/torchenv/bin/pip install torch==2.13.0 transformers timm
  /tmp/torchenv/bin/python tools/make_import_fixtures.py tests/data/foreign

Each model is built by its own framework at a tiny size (width 32, 2 blocks), its parameters
redrawn at a scale that makes every term matter (LayerScale, LayerNorm affine, biases, registers),
and saved the way the framework saves it: a Hugging Face folder (config.json, model.safetensors,
preprocessor_config.json) or a timm folder (config.json with `architecture`, `model_args`,
`pretrained_cfg`; model.safetensors). `reference.npz` beside it holds NHWC input images and the
framework's own outputs on them (final normalised tokens; pooled output or logits where the model
has them; the same at a second resolution where the family resamples its position table).
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import torch

torch.manual_seed(0)
RNG = np.random.default_rng(0)


def _randomise(model: torch.nn.Module, scale: float = 0.2) -> None:
  """Every parameter redrawn: LayerNorm scales around 1, LayerScale gammas spread over decades."""
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith(("lambda1", "gamma")):  # LayerScale: DINOv2's spans 2e-4 .. 11
        p.copy_(torch.exp(torch.randn_like(p) * 1.5) * 0.3)
      elif ("norm" in name or "layernorm" in name) and name.endswith("weight"):
        p.copy_(1 + 0.3 * torch.randn_like(p))
      else:
        p.copy_(torch.randn_like(p) * scale)


def _images(n: int, size: int) -> np.ndarray:
  return RNG.normal(size=(n, size, size, 3)).astype(np.float32)


def _nchw(x: np.ndarray) -> torch.Tensor:
  return torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))


def _save_hf(model, root: str, folder: str, processor: dict) -> str:
  """`model` randomised and saved as a Hugging Face folder `root/folder`; returns the folder."""
  _randomise(model)
  out = os.path.join(root, folder)
  model.save_pretrained(out, safe_serialization=True)
  with open(os.path.join(out, "preprocessor_config.json"), "w") as f:
    json.dump(processor, f, indent=1)
  return out


def _save_encoded(model, out: str, sizes: tuple[int, ...]) -> None:
  """reference.npz: 2 images at each of `sizes` and the model's last hidden state on them; the
  first size's keys bare (`images`, `encoded`), the others suffixed (`images_42`, `encoded_42`)."""
  refs = {}
  for i, size in enumerate(sizes):
    suffix = f"_{size}" if i else ""
    x = _images(2, size)
    with torch.no_grad():
      y = model(pixel_values=_nchw(x)).last_hidden_state.numpy()
    refs.update({"images" + suffix: x, "encoded" + suffix: y})
  np.savez(os.path.join(out, "reference.npz"), **refs)


IMAGENET = dict(image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225])
HALF = dict(image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
# Every Hugging Face model here: width 32, 2 blocks of 2 heads, 7-px patches of 28-px images.
TINY_HF = dict(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=28, patch_size=7
)


def hf_dinov2(root: str) -> None:
  from transformers import Dinov2Config
  from transformers import Dinov2Model

  cfg = Dinov2Config(**TINY_HF, mlp_ratio=2, layer_norm_eps=1e-6, hidden_act="gelu")
  model = Dinov2Model(cfg).eval()
  processor = dict(IMAGENET, do_normalize=True, crop_size={"height": 28, "width": 28})
  _save_encoded(model, _save_hf(model, root, "hf_dinov2", processor), (28, 42))


def hf_dinov2_registers(root: str) -> None:
  from transformers import Dinov2WithRegistersConfig
  from transformers import Dinov2WithRegistersModel

  cfg = Dinov2WithRegistersConfig(**TINY_HF, mlp_ratio=2, num_register_tokens=3, hidden_act="gelu")
  model = Dinov2WithRegistersModel(cfg).eval()
  out = _save_hf(model, root, "hf_dinov2_registers", dict(IMAGENET, do_normalize=True))
  _save_encoded(model, out, (28, 42, 21))


def hf_vit(root: str) -> None:
  from transformers import ViTConfig
  from transformers import ViTForImageClassification

  # layer_norm_eps 1e-12, exact GELU: HF ViT's defaults
  cfg = ViTConfig(**TINY_HF, intermediate_size=64, num_labels=5)
  model = ViTForImageClassification(cfg).eval()
  out = _save_hf(model, root, "hf_vit", dict(HALF, do_normalize=True))
  x = _images(2, 28)
  with torch.no_grad():
    r = model(pixel_values=_nchw(x), output_hidden_states=True)
    y = model.vit.layernorm(r.hidden_states[-1]).numpy()
  np.savez(os.path.join(out, "reference.npz"), images=x, encoded=y, logits=r.logits.numpy())


def hf_siglip(root: str) -> None:
  from transformers import SiglipVisionConfig
  from transformers import SiglipVisionModel

  # gelu_pytorch_tanh, LayerNorm 1e-6, MAP head: SigLIP's defaults
  cfg = SiglipVisionConfig(**TINY_HF, intermediate_size=64)
  model = SiglipVisionModel(cfg).eval()
  out = _save_hf(model, root, "hf_siglip", dict(HALF, do_normalize=True))
  x = _images(2, 28)
  with torch.no_grad():
    r = model(pixel_values=_nchw(x))
  np.savez(
      os.path.join(out, "reference.npz"),
      images=x,
      encoded=r.last_hidden_state.numpy(),
      pooled=r.pooler_output.numpy(),
  )


def _save_timm(model, out: str, architecture: str, model_args: dict, mean, std) -> None:
  from safetensors.torch import save_file

  os.makedirs(out, exist_ok=True)
  save_file(
      {k: v.contiguous() for k, v in model.state_dict().items()},
      os.path.join(out, "model.safetensors"),
  )
  cfg = dict(
      architecture=architecture,
      num_classes=model.num_classes,
      num_features=model.num_features,
      global_pool=model.global_pool,
      model_args=model_args,
      pretrained_cfg=dict(
          input_size=[3, 28, 28],
          mean=list(mean),
          std=list(std),
          interpolation="bicubic",
          crop_pct=1.0,
      ),
  )
  with open(os.path.join(out, "config.json"), "w") as f:
    json.dump(cfg, f, indent=1)


TINY_TIMM = dict(img_size=28, patch_size=7, embed_dim=32, depth=2, num_heads=2, mlp_ratio=2)
# (folder, timm architecture name it stands for, VisionTransformer args, mean/std, what to keep)
TIMM_MODELS = (
    # As timm's vit_*_reg4_dinov2: registers, no position embedding on the prefix, LayerScale.
    (
        "timm_dinov2_registers",
        "vit_small_patch14_reg4_dinov2",
        dict(reg_tokens=2, no_embed_class=True, init_values=1e-5, num_classes=0),
        IMAGENET["image_mean"],
        IMAGENET["image_std"],
        (),
    ),
    # As timm's augreg vit_*: cls token with a position, no LayerScale, a classifier head.
    (
        "timm_vit",
        "vit_tiny_patch16_224.augreg_in21k",
        dict(num_classes=5),
        [0.5] * 3,
        [0.5] * 3,
        ("logits",),
    ),
    # As timm's vit_*_siglip_*: no cls token, tanh GELU, attention-pool (MAP) head.
    (
        "timm_siglip",
        "vit_base_patch16_siglip_224.webli",
        dict(class_token=False, global_pool="map", act_layer="gelu_tanh", num_classes=0),
        [0.5] * 3,
        [0.5] * 3,
        ("pooled",),
    ),
)


def timm_models(root: str) -> None:
  from timm.models.vision_transformer import VisionTransformer

  for folder, architecture, extra, mean, std, keep in TIMM_MODELS:
    args = dict(TINY_TIMM, **extra)
    model = VisionTransformer(**args).eval()
    _randomise(model)
    out = os.path.join(root, folder)
    _save_timm(model, out, architecture, args, mean, std)
    x = _images(2, 28)
    with torch.no_grad():
      y = model.forward_features(_nchw(x))
      refs = dict(images=x, encoded=y.numpy())
      if "logits" in keep:
        refs["logits"] = model(_nchw(x)).numpy()
      if "pooled" in keep:
        refs["pooled"] = model.forward_head(y, pre_logits=True).numpy()
    np.savez(os.path.join(out, "reference.npz"), **refs)


def main(root: str) -> None:
  for make in (hf_dinov2, hf_dinov2_registers, hf_vit, hf_siglip, timm_models):
    make(root)
    print("wrote", make.__name__)


if __name__ == "__main__":
  main(sys.argv[1] if len(sys.argv) > 1 else "tests/data/foreign")
