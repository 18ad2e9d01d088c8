"""The Python API: `linvit_jax.convert(...)` and `linvit_jax.load_student(dir)`.

  student = linvit_jax.convert("vit.npz" | "hf_folder", images="photos/", workdir="w", res=224)
  student.encode(["cat.jpg"])

`convert` is the command line's run (`python -m linvit_jax.main --config convert_folder:...`)
called from Python: the options are that config's `:arg` names, the exported student lands in
`workdir` as it does from the CLI (resumable the same way), and the student comes back loaded.
"""

from __future__ import annotations

import os
from typing import Any

from linvit_jax import config_files
from linvit_jax.errors import UserError
from linvit_jax.export import Student  # noqa: F401  (re-exported)
from linvit_jax.export import load_student  # noqa: F401  (re-exported)


def load_config(config: str, **options: Any) -> Any:
  """A config file's ConfigDict from Python: `config` is a shipped name ('convert_folder', 'demo')
  or a path; `options` are its `:arg` fields (`max_images=2000, feature_map="elu1"`)."""
  path = config if os.path.isfile(config) else config_files.find_config(config)
  if path is None:
    raise UserError(
        f"config {config!r}: no such file and no shipped config of that name "
        f"(shipped: {', '.join(config_files.list_configs())})"
    )
  for key, value in options.items():
    text = str(value)
    if "," in text:
      raise UserError(f"option {key}={text!r}: a value may not contain ','")
  arg = ",".join(f"{k}={v}" for k, v in options.items())
  return config_files.load(path, arg)


def convert(
    teacher: str,
    *,
    workdir: str,
    images: str | None = None,
    config: str | None = None,
    **options: Any,
) -> Student:
  """Converts `teacher` (a big_vision .npz, short name, or a Hugging Face / timm folder or
  .safetensors file) to a linear-attention student and returns it, loaded.

  With `images` (a folder of photos) the run is `configs/convert_folder.py` (label-free); with
  `config` any config that takes `init=` (e.g. 'imagenet_vit' with `data_dir=`). `options` are the
  config's `:arg` names (`res=`, `max_images=`, `feature_map=`, `gelu=`, `norm=`, `policy=`, ...).
  """
  from linvit_jax import run as run_lib  # the training stack, imported only when converting

  if config is None:
    if images is None:
      raise UserError("convert: pass images=<folder of photos> (or config=<config name>)")
    config = "convert_folder"
  if images is not None:
    options["images"] = images
  cfg = load_config(config, init=teacher, **options)
  run_lib.run(cfg, workdir)
  return load_student(workdir)
