r"""`python -m linvit_jax.import_weights SRC OUT.npz`: a PyTorch-ecosystem ViT as a big_vision npz.

SRC is a Hugging Face model folder (Dinov2Model, Dinov2WithRegistersModel, ViTModel / DeiT,
SiglipVisionModel or a SiglipModel's vision tower), a timm folder (config.json + model.safetensors)
or a bare timm `.safetensors` state dict. Torch is not needed. Writes OUT.npz (big_vision's
params-only layout, loadable by `vit.load` and by big_vision itself where it has the same
architecture) and OUT.json beside it: the model config (GELU form, LayerNorm epsilon, registers),
the input normalisation and how the position table is resized, which `init=OUT.npz` reads back.
`init=` of every config also takes SRC directly, so this step is only needed to keep an npz.

Both files are written only when the whole source converted (the npz atomically, the JSON after
it). A bad source is one `error:` line naming the file and what is wrong, exit 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from linvit_jax import checkpoints
from linvit_jax import gfile
from linvit_jax.errors import UserError
from linvit_jax.models import foreign


def import_weights(src: str, out: str, num_heads: int | None = None) -> foreign.Imported:
  """Converts `src` and writes `out` (.npz) with its sidecar JSON; returns what was imported."""
  if not out.endswith(".npz"):
    raise UserError(f"output '{out}': expected a path ending in .npz")
  imported = foreign.read(src, num_heads=num_heads)
  checkpoints.save_npz(out, imported.params)
  gfile.write_text(foreign.sidecar_path(out), json.dumps(foreign.sidecar_info(imported), indent=1))
  return imported


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
      prog="python -m linvit_jax.import_weights",
      description=__doc__.split("\n\n")[0].split(": ", 1)[-1],
  )
  parser.add_argument("src", help="Hugging Face / timm model folder, or a .safetensors file")
  parser.add_argument("out", help="the big_vision .npz to write (its .json goes beside it)")
  parser.add_argument(
      "--num_heads", type=int, default=None, help="heads, for a timm file that cannot say"
  )
  args = parser.parse_args(argv)
  try:
    imported = import_weights(args.src, args.out, args.num_heads)
  except UserError as e:
    print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
    return 2
  a = imported.arch
  print(
      f"{imported.family}: width {a['width']}, depth {a['depth']}, heads {a['num_heads']}, "
      f"patch {a['patch_size'][0]}, pool {a['pool_type']}, registers {a['reg_tokens']}, "
      f"{'tanh' if a['gelu_approximate'] else 'exact'} GELU -> {os.path.abspath(args.out)}"
  )
  return 0


if __name__ == "__main__":
  sys.exit(main())
