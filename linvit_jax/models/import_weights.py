r"""`python -m linvit_jax.models.import_weights SRC OUT.npz`: a PyTorch-ecosystem ViT as a big_vision npz.

SRC is a Hugging Face model folder (Dinov2Model, Dinov2WithRegistersModel, ViTModel / DeiT,
SiglipVisionModel or a SiglipModel's vision tower), a timm folder (config.json + model.safetensors)
or a bare timm `.safetensors` state dict. Torch is not needed. Writes OUT.npz (big_vision's
params-only layout, loadable by `vit.load` and by big_vision itself where it has the same
architecture) and OUT.json beside it: the model config (GELU form, LayerNorm epsilon, registers),
the input normalisation and how the position table is resized, which `init=OUT.npz` reads back.
`init=` of every config also takes SRC directly, so this step is only needed to keep an npz.

Both files are written only when the whole source converted (the npz atomically, the JSON after
it). A bad source, an output path that cannot be written (checked before the conversion) or a
`--num_heads` that does not divide the width is one `error:` line naming what is wrong, exit 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING, NoReturn

from linvit_jax.runtime import errors
from linvit_jax.runtime import gfile
from linvit_jax.runtime.errors import UserError

if TYPE_CHECKING:
  from linvit_jax.models.foreign_layout import Imported


def import_weights(src: str, out: str, num_heads: int | None = None) -> Imported:
  """Converts `src` and writes `out` (.npz) with its sidecar JSON; returns what was imported."""
  # Imported here, not at the top: they load ml_dtypes (~1 s), and --help should answer at once.
  from linvit_jax.models import checkpoints
  from linvit_jax.models import foreign

  _check_output(out)  # before the conversion, which can take a while for a big model
  if num_heads is not None and (isinstance(num_heads, bool) or int(num_heads) < 1):
    raise UserError(f"--num_heads {num_heads}: expected a positive integer")
  imported = foreign.read(src, num_heads=num_heads)  # checks the heads against the width
  try:
    checkpoints.save_npz(out, imported.params)
    gfile.write_text(
        foreign.sidecar_path(out), json.dumps(foreign.sidecar_info(imported), indent=1)
    )
  except OSError as e:  # a full disk, no permission: what the user fixes
    raise UserError(f"output '{out}': cannot write it ({e.strerror or e})") from e
  return imported


def _check_output(out: str) -> None:
  """An output path the npz cannot be written to is named before any work: not .npz, a folder,
  or under a regular file (makedirs would fail with a traceback after the whole conversion)."""
  if not out.endswith(".npz"):
    raise UserError(f"output '{out}': expected a path ending in .npz")
  if gfile.is_remote(out):
    return
  path = os.path.abspath(out)
  if os.path.isdir(path):
    raise UserError(f"output '{out}' is a folder; expected the path of the .npz file to write")
  parent = os.path.dirname(path)
  while not os.path.exists(parent):  # the nearest existing ancestor; the rest is created
    parent = os.path.dirname(parent)
  if not os.path.isdir(parent):
    raise UserError(f"output '{out}': '{parent}' is a file, not a folder")
  if not os.access(parent, os.W_OK | os.X_OK):
    raise UserError(f"output '{out}': cannot write in '{parent}' (permission denied)")


class _Parser(argparse.ArgumentParser):
  """argparse whose usage errors are the project's one `error:` line (exit 2), not usage text."""

  def error(self, message: str) -> NoReturn:
    self.exit(2, f"error: {message} (--help lists the arguments)\n")


def main(argv: list[str] | None = None) -> int:
  parser = _Parser(
      prog="python -m linvit_jax.models.import_weights",
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
    return errors.say(e)
  a = imported.arch
  print(
      f"{imported.family}: width {a['width']}, depth {a['depth']}, heads {a['num_heads']}, "
      f"patch {a['patch_size'][0]}, pool {a['pool_type']}, registers {a['reg_tokens']}, "
      f"{'tanh' if a['gelu_approximate'] else 'exact'} GELU -> {os.path.abspath(args.out)}"
  )
  return 0


if __name__ == "__main__":
  sys.exit(main())
