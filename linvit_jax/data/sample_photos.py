"""Real photographs that ship inside installed packages, written out as a folder of image files.

  paths = write_sample_photos("/tmp/photos")          # 21 files: 10 colour, 11 gray
  make_eval_iterator(dataset="image_folder:/tmp/photos", split="all", ...)

For demos and tests of the `image_folder` dataset without any download: scikit-image's bundled
photographs (the files next to skimage.data; its pooch-fetched ones are never asked for) and
matplotlib's sample grace_hopper.jpg. The files are copied as they are (PNG or JPEG), so the folder
also exercises grayscale PNGs. Synthetic or binary pictures (checkerboard, horse silhouette,
logo, phantom, colour wheel) are left out.
"""

from __future__ import annotations

import os
import shutil
import sys

from linvit_jax.runtime import errors
from linvit_jax.runtime.errors import UserError

# skimage/data file names: real photographs only.
COLOR = (
    "astronaut.png",
    "chelsea.png",
    "coffee.png",
    "hubble_deep_field.jpg",
    "ihc.png",
    "motorcycle_left.png",
    "motorcycle_right.png",
    "retina.jpg",
    "rocket.jpg",
)
GRAY = (
    "brick.png",
    "camera.png",
    "cell.png",
    "clock_motion.png",
    "coins.png",
    "grass.png",
    "gravel.png",
    "microaneurysms.png",
    "moon.png",
    "page.png",
    "text.png",
)
_MATPLOTLIB_COLOR = ("grace_hopper.jpg",)
_WHICH = ("all", "color", "gray")


def _skimage_data_dir() -> str:
  try:
    import skimage.data  # # Optional dependency.
  except ImportError as err:
    raise ImportError(
        "write_sample_photos needs scikit-image for its bundled photographs: "
        "pip install scikit-image"
    ) from err
  return os.path.dirname(skimage.data.__file__)


def _matplotlib_file(name: str) -> str | None:
  try:
    from matplotlib import cbook

    path = str(cbook.get_sample_data(name, asfileobj=False))
  except (ImportError, OSError, ValueError):  # No matplotlib, or a build without sample data.
    return None
  return path if os.path.isfile(path) else None


def write_sample_photos(out_dir: str, *, which: str = "all") -> list[str]:
  """Copies the bundled photographs into out_dir (created if needed); returns the paths, sorted.

  Args:
    out_dir: destination folder; files of the same name are overwritten.
    which: "all", "color" (3-channel photos) or "gray" (1-channel photos).

  Raises:
    ImportError: scikit-image is not installed.
    FileNotFoundError: none of the photographs is in the installed packages.
  """
  if which not in _WHICH:
    raise ValueError(f"which must be one of {', '.join(_WHICH)}, got {which!r}")
  skimage_dir = _skimage_data_dir()
  names = (COLOR if which != "gray" else ()) + (GRAY if which != "color" else ())
  sources = [os.path.join(skimage_dir, n) for n in names]
  if which != "gray":
    sources += [_matplotlib_file(n) for n in _MATPLOTLIB_COLOR]
  # Older or newer releases may bundle fewer files: take what is there.
  sources = [s for s in sources if s and os.path.isfile(s)]
  if not sources:
    raise FileNotFoundError(
        f"no bundled photographs found (looked in {skimage_dir} for " f"{', '.join(names)})"
    )
  os.makedirs(out_dir, exist_ok=True)
  paths = []
  for src in sources:
    paths.append(os.path.join(out_dir, os.path.basename(src)))
    shutil.copyfile(src, paths[-1])
  return sorted(paths)


_USAGE = "python -m linvit_jax.data.sample_photos OUT_DIR [all|color|gray]"


def main(argv: list[str] | None = None) -> int:
  """`python -m linvit_jax.data.sample_photos OUT_DIR [all|color|gray]`; a wrong argument is one
  `error:` line and exit 2, with nothing written."""
  args = sys.argv[1:] if argv is None else argv
  if any(a in ("-h", "--help") for a in args):
    print(f"usage: {_USAGE}\n\n{__doc__.splitlines()[0]}")
    return 0
  try:
    if not args or args[0].startswith("-"):
      raise UserError(f"expected OUT_DIR first; usage: {_USAGE}")
    if len(args) > 2:
      extra = " ".join(repr(a) for a in args[2:])
      raise UserError(f"unexpected argument(s) {extra}; usage: {_USAGE}")
    which = args[1] if len(args) > 1 else "all"
    if which not in _WHICH:
      raise UserError(f"{which!r}: expected one of {', '.join(_WHICH)} after OUT_DIR")
    out_dir = args[0]
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
      raise UserError(f"OUT_DIR '{out_dir}' is a file, not a folder")
    try:
      paths = write_sample_photos(out_dir, which=which)
    except (ImportError, OSError) as e:  # a package missing, a file not writable
      raise errors.photo_writer_error(e) from e
  except UserError as e:
    return errors.say(e)
  print(f"wrote {len(paths)} photos to {out_dir}")
  promised = promised_names(which)
  missing = sorted(set(promised) - {os.path.basename(p) for p in paths})
  if missing:  # another release bundles fewer: a different folder than the README's, said
    print(
        f"WARNING: wrote {len(paths)} of the {len(promised)} sample photos; not installed: "
        f"{', '.join(missing)} (scikit-image / matplotlib of another release): not the README's "
        "folder, so its held-out split differs",
        file=sys.stderr,
    )
  return 0


def promised_names(which: str = "all") -> tuple[str, ...]:
  """The file names `write_sample_photos(which=...)` writes when every package bundles them."""
  names = (COLOR if which != "gray" else ()) + (GRAY if which != "color" else ())
  return names + (_MATPLOTLIB_COLOR if which != "gray" else ())


if __name__ == "__main__":
  sys.exit(main())
