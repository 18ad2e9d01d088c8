"""Regenerates README.md's token-study block from finished ablation workdirs.

  python tools/update_token_study_readme.py workdirs/ablation_p7 workdirs/ablation_p4 \
      [--readme README.md]

The lines between `<!-- ablation:begin -->` and `<!-- ablation:end -->` become
`linvit_jax.studies.token_study`'s tables (Δ to the teacher per arm and token count, and the verdict per
claim), so no number in that block is typed by hand. `python -m linvit_jax.studies.token_study ... --out
docs` writes the same tables, with the runs and curves, to docs/ablation.md. This lives outside
the package because it edits the repository's own docs.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence

from linvit_jax.runtime import gfile
from linvit_jax.studies import token_study

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def replace_block(text: str, block: str, name: str = "ablation") -> str:
  """`text` with the lines between <!-- name:begin --> and <!-- name:end --> set to `block`."""
  pattern = re.compile(rf"(<!-- {name}:begin -->\n).*?(<!-- {name}:end -->)", re.S)
  if not pattern.search(text):
    raise ValueError(f"no <!-- {name}:begin --> ... <!-- {name}:end --> block to replace")
  return pattern.sub(lambda m: m.group(1) + block.rstrip("\n") + "\n" + m.group(2), text)


def main(argv: Sequence[str] | None = None) -> str:
  """Rewrites the README's block; returns the tables written into it."""
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("workdirs", nargs="+", help="ablation workdirs, one per token count")
  p.add_argument("--readme", default=README, help="README whose ablation block is regenerated")
  args = p.parse_args(argv)
  md = token_study.tables([token_study.load(w) for w in args.workdirs])
  text = gfile.read_text(args.readme)
  if text is None:
    raise FileNotFoundError(f"no README at {args.readme!r}")
  gfile.write_text(args.readme, replace_block(text, md))
  return md


if __name__ == "__main__":
  main(sys.argv[1:])
