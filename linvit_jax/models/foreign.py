"""ViT weights from the PyTorch ecosystem, read without torch, in big_vision's layout: the one way
in (`read`), and the sidecar JSON that keeps what an .npz of them cannot hold.

Sources (`read(path)`): a Hugging Face model folder (config.json + model.safetensors, sharded or
not) or a timm folder (config.json with `architecture` + model.safetensors), or a bare
`.safetensors` file (its family told by its tensor names), or a hub name for either folder
(`hf:facebook/dinov2-small`, `timm:vit_small_patch14_dinov2`: huggingface_hub's cache). Families:

  Hugging Face  Dinov2Model, Dinov2WithRegistersModel, ViTModel / ViTForImageClassification
                (DeiT published as ViT), DeiTModel (its distillation token a register),
                SiglipVisionModel (and the vision tower of a SiglipModel), with a MAP head
                (models/foreign_hf.py).
  timm          VisionTransformer state dicts: cls token or none, registers, position embedding
                with or without the prefix tokens, LayerScale, 'token' / 'map' / 'avg' pooling
                (models/foreign_timm.py).

What big_vision has no slot for is folded exactly: LayerScale γ into the out projection and the
second MLP dense (γ·(Wx + b)); a prefix token's position embedding into the token itself (it is a
constant) (models/foreign_layout.py). Each source's position table is kept at its own grid and
resampled the way the source framework does at run time (torch's bicubic, with or without
antialias: models/posemb.py) when the model's grid differs. The architecture, GELU form,
LayerNorm epsilon and input normalisation are read from the source's config.json /
preprocessor_config.json where it ships them. The files are read by models/foreign_files.py.

Anything else (a ConvNeXt folder, a pickle `.pth`, a SwiGLU MLP, missing tensors, a config that
disagrees with the weights) is a `CheckpointError` naming the file and what is wrong.
"""

from __future__ import annotations

import os
from typing import Any

from linvit_jax.models import foreign_files
from linvit_jax.models import foreign_hf
from linvit_jax.models import foreign_timm
from linvit_jax.models import hub
from linvit_jax.models.checkpoints import CheckpointError
from linvit_jax.models.foreign_layout import Imported


def is_foreign(path: str) -> bool:
  """Whether `path` is for this module: a local folder, a .safetensors file, a pickle file or a
  hub name (`hf:org/name`, `timm:name`: linvit_jax.models.hub)."""
  if hub.is_hub_name(path):
    return True
  if "://" in path:
    return False
  base = path.split(":", 1)[0] if not os.path.exists(path) else path
  return (
      os.path.isdir(base)
      or base.endswith(".safetensors")
      or base.endswith(foreign_files.PICKLE_SUFFIXES)
      or foreign_files.is_torch_zip(base)
  )


def read(path: str, num_heads: int | None = None) -> Imported:
  """A Hugging Face / timm folder or a .safetensors file, in big_vision's layout (see module doc).

  A hub name (`hf:facebook/dinov2-small`, `timm:vit_small_patch14_dinov2`) is read from the folder
  huggingface_hub caches it in (linvit_jax.models.hub.resolve: downloaded when not cached and online).
  `num_heads`: import_weights' --num_heads (a timm file does not store its heads).
  """
  if hub.is_hub_name(path):
    path = hub.resolve(path)
  if not os.path.exists(path):
    raise CheckpointError(f"checkpoint '{path}': file not found (cwd {os.getcwd()!r})")
  if path.endswith(foreign_files.PICKLE_SUFFIXES) or foreign_files.is_torch_zip(path):
    foreign_files.raise_pickle_error(path)
  if os.path.isdir(path):
    return _read_folder(path, num_heads)
  return _read_file(path, num_heads)


def _read_folder(path: str, num_heads: int | None) -> Imported:
  """A model folder: its config.json says the family."""
  config = foreign_files.read_json(os.path.join(path, "config.json"))
  if config is None:
    raise CheckpointError(
        f"checkpoint '{path}': a folder without config.json (a Hugging Face or timm model "
        "folder has one; a big_vision checkpoint is an .npz file)"
    )
  if "model_type" in config:
    foreign_hf.check_heads_declared(config, num_heads, path)
    return foreign_hf.from_hf(path, config)
  if "architecture" in config:
    tensors, weights = foreign_files.read_folder_tensors(path)
    return foreign_timm.from_timm(weights, tensors, config, num_heads, path)
  raise CheckpointError(
      f"checkpoint '{path}/config.json': neither a Hugging Face config (model_type) nor a "
      "timm one (architecture)"
  )


def _read_file(path: str, num_heads: int | None) -> Imported:
  """A .safetensors file: a Hugging Face config.json beside it makes it that folder's weights;
  otherwise its tensor names say timm (with a timm config.json beside it, when there is one)."""
  folder = os.path.dirname(os.path.abspath(path))
  beside = foreign_files.read_json(os.path.join(folder, "config.json"))
  if beside and "model_type" in beside:
    foreign_hf.check_heads_declared(beside, num_heads, path)
    return foreign_hf.from_hf(folder, beside)
  tensors = foreign_files.read_safetensors(path)
  if "patch_embed.proj.weight" in tensors:
    timm_config = beside if beside and "architecture" in beside else {}
    return foreign_timm.from_timm(path, tensors, timm_config, num_heads, None)
  if any(
      k.endswith(("patch_embeddings.projection.weight", "patch_embedding.weight")) for k in tensors
  ):
    raise CheckpointError(
        f"checkpoint '{path}': Hugging Face weights without their config.json; pass the model "
        "folder (config.json + model.safetensors) instead"
    )
  raise CheckpointError(
      f"checkpoint '{path}': no ViT patch embedding (neither timm's 'patch_embed.proj.weight' "
      f"nor Hugging Face's); tensors start with: {', '.join(sorted(tensors)[:4])}"
  )


def sidecar_path(npz_path: str) -> str:
  """Where import_weights puts what an .npz cannot hold: `x.npz` -> `x.json`."""
  return os.path.splitext(npz_path)[0] + ".json"


def sidecar_info(imported: Imported) -> dict[str, Any]:
  """The sidecar JSON of an imported model's .npz: its architecture, source, input normalisation
  and position-table resampling, which `init=x.npz` reads back (models/checkpoint_record.py)."""
  arch = {k: (list(v) if isinstance(v, tuple) else v) for k, v in imported.arch.items()}
  return {
      "format": "big_vision params-only npz, written by linvit_jax.models.import_weights",
      "source": imported.source,
      "family": imported.family,
      "model_config": arch,
      "preprocessing": imported.preprocessing,
      "posemb_resample": imported.posemb_resample,
  }
