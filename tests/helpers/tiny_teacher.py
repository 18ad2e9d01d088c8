"""A tiny headless ViT teacher checkpoint, a folder of smooth random photos and a convert_folder
config at 32 px: what the convert_folder tests share."""

from __future__ import annotations

import os

import jax
import numpy as np
from PIL import Image

from linvit_jax.models import checkpoints
from linvit_jax.models import vit

TINY = dict(
    num_classes=None,
    patch_size=(8, 8),
    width=32,
    depth=2,
    mlp_dim=64,
    num_heads=2,
    pool_type="tok",
    posemb="learn",
)


def headless_checkpoint(path: str, channels: int = 3, **model_kw) -> dict:
  """Saves a randomly initialised TINY ViT (with `model_kw` overrides) taking `channels`-channel
  images as a big_vision npz at `path`; returns its params."""
  model = vit.Model(**{**TINY, **model_kw})
  images = np.zeros((1, 32, 32, channels), np.float32)
  params = model.init(jax.random.PRNGKey(0), images)["params"]
  checkpoints.save_npz(path, jax.device_get(params))
  return params


def smooth_photos(folder: str, n: int = 8, seed: int = 0, gray_odd: bool = False) -> None:
  """`n` smooth random photos of 40-90 px, odd ones PNG and even ones JPEG; `gray_odd` saves the
  PNGs as grayscale (decode(channels=1) turns the JPEGs to luma)."""
  rs = np.random.RandomState(seed)
  os.makedirs(folder, exist_ok=True)
  for i in range(n):
    h, w = rs.randint(40, 90, size=2)
    smooth = (rs.rand(h // 8 + 2, w // 8 + 2, 3) * 255).astype(np.uint8)
    img = Image.fromarray(smooth).resize((w, h), Image.BICUBIC)
    if gray_odd and i % 2:
      img = img.convert("L")
    img.save(os.path.join(folder, f"photo_{i}.{'png' if i % 2 else 'jpg'}"))


def convert_folder_config(init: str, images: str, extra: str = ""):
  """configs/convert_folder.py at 32 px, tiny, batch 4, 16 images, plus `extra` (',key=value...')."""
  import configs.convert_folder as cf

  return cf.get_config(f"init={init},images={images},res=32,tiny=True,batch=4,max_images=16{extra}")
