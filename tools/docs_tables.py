"""Every table of figures in README.md and docs/*.md, made from committed results files.

  python tools/docs_tables.py           # rewrite every table in place
  python tools/docs_tables.py --check   # exit 1 naming the first table that differs

A table lives between markers in the Markdown:

  <!-- table:NAME -->
  | ... generated, not edited by hand ... |
  <!-- /table -->

(the README's `<!-- ablation:begin -->` … `<!-- ablation:end -->` block, which
tools/update_token_study_readme.py writes from the ablation's workdirs, is the table `ablation`),
and `TABLES[NAME]` says which committed files (results JSON, or a Markdown file that another tool
generates) it is made from, and how. A marker whose NAME is not registered, or a registered table
that no document holds, is an error too. Figures with no committed results file do not belong in
these tables: say in prose that they cannot be reproduced from this checkout, or leave them out.

This module finds, checks and rewrites the tables and holds their registry; the renderers are
docs_tables_runs.py's (tables from single runs' records and the benchmark, lever and stability
JSONs) and docs_tables_photos.py's (the test-photo tables from study JSONs). A new table: its
renderer in one of them, its row in TABLES, its markers in a document.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import pathlib
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python tools/docs_tables.py` puts tools/, not the root, first
  sys.path.insert(0, str(ROOT))

from tools import docs_tables_photos as photos  # noqa: E402
from tools import docs_tables_runs as runs  # noqa: E402
from tools.docs_tables_runs import Load  # noqa: E402

MARKER = re.compile(
    r"(?P<open><!-- (?:table:(?P<name>[\w.-]+)|(?P<alias>ablation):begin) -->\n)(?P<body>.*?)"
    r"(?P<close><!-- (?:/table|ablation:end) -->)",
    re.S,
)
# The documents whose tables are kept: the README and every docs/*.md.
DOCS = ("README.md", "docs/*.md")


@dataclasses.dataclass(frozen=True)
class Table:
  sources: tuple[str, ...]  # repository-relative files it is made from (committed)
  render: Callable[[Load], str]  # the Markdown between the markers, without the final newline


TABLES: dict[str, Table] = {
    "default_seeds": Table(tuple(p for _, p, _ in runs.DEFAULT_RUNS), runs.default_seeds),
    "default_cost": Table((runs.README_RUN,), runs.default_cost),
    "speed": Table((runs.HYBRID_SPEED, "bench/common.py"), runs.speed),
    "default_history": Table(tuple(runs.history_path(k) for _, k in runs.HISTORY), runs.history),
    "first_runs": Table(tuple(p for _, p in runs.FIRST_RUNS), runs.first_runs),
    "ablation": Table((runs.ABLATION_DOC,), runs.ablation),
    "levers_112": Table((runs.LEVERS_112,), runs.levers_112),
    "levers_112_align": Table((runs.LEVERS_112,), runs.levers_112_align),
    "distill_stability": Table((runs.DISTILL_STABILITY,), runs.distill_stability),
    "test_photos": Table((photos.TEST_PHOTOS,), photos.test_photos),
    "deploy_res": Table((photos.DEPLOY_STUDY,), photos.test_pairs(*photos.DEPLOY_ARMS)),
    "default_seed_spread": Table(
        (photos.DEPLOY_STUDY,), photos.test_pairs(("base", "seed 0"), ("base_seed1", "seed 1"))
    ),
    "deploy_res_cost": Table((photos.DEPLOY_STUDY,), photos.deploy_res_cost),
    "default_full_test": Table((photos.FULL_STUDY,), photos.study_test(photos.FULL_STUDY, "full")),
    "default_full_goals": Table((photos.FULL_STUDY,), photos.goals(photos.FULL_STUDY, "full")),
    "default_full_cost": Table((photos.FULL_STUDY,), photos.study_cost(photos.FULL_STUDY, "full")),
    "fixture_conversions": Table((photos.FIXTURE_STUDY,), photos.fixtures),
    "fmnist_full_test": Table((photos.FULL_STUDY,), photos.study_test(photos.FULL_STUDY, "fmnist")),
    "default_full_seeds": Table(
        (photos.FULL_STUDY,),
        photos.seed_spread(photos.FULL_STUDY, ("full", "full_seed1", "full_seed2")),
    ),
    "w_structure_pair": Table((photos.FULL_STUDY, photos.STRUCTURE_RUN), photos.structure_pair),
    "default_full_other_folder": Table(
        (photos.FULL_STUDY,),
        photos.other_folder(("full", "full_seed1", "full_seed2"), "full_lomiri"),
    ),
    "default_full_resolution_curves": Table((photos.RESOLUTION_CURVES,), photos.resolution_curves),
    "default_full_rerun": Table((photos.FULL_STUDY,), photos.rerun),
    "default_full_rerun_cost": Table((photos.FULL_STUDY,), photos.rerun_cost),
    "data_study": Table((photos.DATA_STUDY,), photos.data_study(photos.DATA_ARMS)),
    "data_study_compounding": Table((photos.COMPOUNDING,), photos.compounding),
    "data_study_count": Table((photos.DATA_STUDY,), photos.data_study(photos.COUNT_ARMS)),
    "data_study_count_paired": Table(
        (photos.DATA_STUDY,), photos.paired(photos.DATA_STUDY, photos.COUNT_PAIRS)
    ),
    "data_study_full_count_fit": Table(
        (photos.DATA_STUDY,), photos.fit_by_count(photos.FULL_COUNT_ARMS)
    ),
    "data_study_fit_shared": Table(
        (photos.DATA_STUDY,), photos.fit_on_shared(photos.FULL_COUNT_ARMS, photos.README_ARM)
    ),
    "data_study_count_fit": Table(
        (photos.DATA_STUDY,), photos.fit_by_count(photos.COUNT_ARMS, photos.COUNT_PHOTOS)
    ),
    "readme_goals": Table(
        (photos.DATA_STUDY, "tools/docs_tables_runs.py"),
        photos.cross_goals(
            photos.DATA_STUDY, photos.README_HYBRID_ARM, photos.README_HYBRID_OPERATOR
        ),
    ),
    "readme_goals_fit": Table(
        (photos.DATA_STUDY,), photos.fit_gap(photos.DATA_STUDY, photos.README_HYBRID_ARM)
    ),
    "readme_default_goals": Table(
        (photos.DATA_STUDY,), photos.cross_goals(photos.DATA_STUDY, photos.README_ARM)
    ),
    "readme_default_fit": Table(
        (photos.DATA_STUDY,), photos.fit_gap(photos.DATA_STUDY, photos.README_ARM)
    ),
    "readme_default_test": Table(
        (photos.DATA_STUDY,), photos.study_test(photos.DATA_STUDY, photos.README_ARM)
    ),
    "readme_default_cost": Table(
        (photos.DATA_STUDY,), photos.study_cost(photos.DATA_STUDY, photos.README_ARM)
    ),
    "data_study_paired": Table(
        (photos.DATA_STUDY,), photos.paired(photos.DATA_STUDY, photos.PAIRS)
    ),
    "people_paired": Table(
        (photos.DATA_STUDY,), photos.paired(photos.DATA_STUDY, photos.PEOPLE_PAIRS, "people")
    ),
    "window_share": Table((photos.WINDOW_SHARE,), photos.window_share),
    "operators_pareto": Table(
        (photos.DATA_STUDY, "tools/docs_tables_runs.py", "bench/common.py"),
        photos.pareto(photos.DATA_STUDY, photos.PARETO),
    ),
    "nf128_fit": Table((photos.DATA_STUDY,), photos.fit_gap(photos.DATA_STUDY, photos.NF128_ARM)),
    "nf128_cost": Table(
        (photos.DATA_STUDY,), photos.study_cost(photos.DATA_STUDY, photos.NF128_ARM)
    ),
    "hybrid_fit": Table((photos.DATA_STUDY,), photos.fit_gap(photos.DATA_STUDY, photos.HYBRID_ARM)),
    "hybrid_cost": Table(
        (photos.DATA_STUDY,), photos.study_cost(photos.DATA_STUDY, photos.HYBRID_ARM)
    ),
    "readme_seeds": Table(
        (photos.DATA_STUDY,), photos.seed_spread(photos.DATA_STUDY, photos.README_SEEDS)
    ),
    "readme_seed_paired": Table(
        (photos.DATA_STUDY,), photos.paired(photos.DATA_STUDY, photos.KEY_PAIRS[:1])
    ),
    "hybrid_keys": Table(
        (photos.DATA_STUDY, *photos.HYBRID_KEYS, "tools/docs_tables_runs.py", "bench/common.py"),
        photos.hybrid_keys(photos.DATA_STUDY, photos.KEY_ARMS, photos.HYBRID_KEYS),
    ),
    "hybrid_keys_paired": Table(
        (photos.DATA_STUDY,), photos.paired(photos.DATA_STUDY, photos.KEY_PAIRS)
    ),
    "key_pooling_teacher": Table((photos.KEY_POOLING,), photos.key_pooling),
    "hybrid_seeds": Table(
        (photos.DATA_STUDY,), photos.arm_seeds(photos.DATA_STUDY, photos.HYBRID_SEED_ARMS)
    ),
    "hybrid_seeds_paired": Table(
        (photos.DATA_STUDY,), photos.paired(photos.DATA_STUDY, photos.HYBRID_SEED_PAIRS)
    ),
    "two_layers": Table(
        (photos.DATA_STUDY,), photos.arm_seeds(photos.DATA_STUDY, photos.TWO_LAYER_ARMS)
    ),
    "two_layers_goals": Table(
        (photos.DATA_STUDY, "tools/docs_tables_runs.py"),
        photos.cross_goals(photos.DATA_STUDY, "HYB2_s0", {"softmax_layers": 2, "key_grid": 32}),
    ),
    "worst_photos": Table(
        (photos.WORST_COMPOUNDING, photos.DATA_STUDY),
        photos.worst_photos(photos.WORST_COMPOUNDING, photos.DATA_STUDY, "HYB2_s0"),
    ),
    "pick_gains": Table((photos.PICK_GAINS,), photos.pick_gains(photos.PICK_GAINS)),
    "cls_levers": Table(
        (photos.DATA_STUDY,), photos.arm_seeds(photos.DATA_STUDY, photos.CLS_LEVER_ARMS)
    ),
    "cls_levers_paired": Table(
        (photos.DATA_STUDY,), photos.paired(photos.DATA_STUDY, photos.CLS_LEVER_PAIRS)
    ),
    "two_layers_paired": Table(
        (photos.DATA_STUDY,), photos.paired(photos.DATA_STUDY, photos.TWO_LAYER_PAIRS)
    ),
    "operators_paired": Table(
        (photos.DATA_STUDY,), photos.paired(photos.DATA_STUDY, photos.OPERATOR_PAIRS)
    ),
    "align_full_budget": Table(
        (photos.DATA_STUDY,), photos.data_study(photos.ALIGN_ARMS, "`align`")
    ),
    "align_full_budget_fit": Table(
        (photos.DATA_STUDY,),
        photos.fit_by_count(photos.ALIGN_ARMS, first_column="`align`"),
    ),
    "align_full_budget_paired": Table(
        (photos.DATA_STUDY,), photos.paired(photos.DATA_STUDY, photos.ALIGN_PAIRS)
    ),
}


# ------------------------------------------------------------------------------------------------
# Finding, checking and rewriting the tables.


def documents(root: pathlib.Path = ROOT) -> list[pathlib.Path]:
  out: list[pathlib.Path] = []
  for pattern in DOCS:
    out.extend(sorted(root.glob(pattern)))
  return out


def _loader(root: pathlib.Path) -> Load:
  cache: dict[str, Any] = {}

  def load(path: str) -> Any:
    if path not in cache:
      text = (root / path).read_text(encoding="utf-8")
      cache[path] = json.loads(text) if path.endswith(".json") else text
    return cache[path]

  return load


def render_document(text: str, load: Load, where: str = "") -> str:
  """`text` with every table's body regenerated."""

  def sub(m: re.Match[str]) -> str:
    name = m.group("name") or m.group("alias")
    if name not in TABLES:
      raise KeyError(f"{where}: <!-- table:{name} --> is not in tools/docs_tables.py's TABLES")
    return m.group("open") + TABLES[name].render(load) + "\n" + m.group("close")

  return MARKER.sub(sub, text)


def check(root: pathlib.Path = ROOT) -> list[str]:
  """Problems found, first the first differing table; empty when every table is as generated."""
  load, problems, seen = _loader(root), [], set()
  for doc in documents(root):
    rel = doc.relative_to(root).as_posix()
    text = doc.read_text(encoding="utf-8")
    for m in MARKER.finditer(text):
      name = m.group("name") or m.group("alias")
      seen.add(name)
      if name not in TABLES:
        problems.append(f"{rel}: table '{name}' is not registered in tools/docs_tables.py")
        continue
      want = TABLES[name].render(load) + "\n"
      if m.group("body") != want:
        diff = "\n".join(
            difflib.unified_diff(
                m.group("body").splitlines(),
                want.splitlines(),
                "in the doc",
                "generated",
                lineterm="",
            )
        )
        problems.append(
            f"{rel}: table '{name}' differs from {', '.join(TABLES[name].sources)} "
            f"(python tools/docs_tables.py rewrites it):\n{diff}"
        )
  for name in sorted(set(TABLES) - seen):
    problems.append(f"table '{name}' is registered but no document has <!-- table:{name} -->")
  return problems


def rewrite(root: pathlib.Path = ROOT) -> list[str]:
  """Rewrites every table in place; returns the documents that changed."""
  load, changed = _loader(root), []
  for doc in documents(root):
    rel = doc.relative_to(root).as_posix()
    text = doc.read_text(encoding="utf-8")
    new = render_document(text, load, rel)
    if new != text:
      doc.write_text(new, encoding="utf-8")
      changed.append(rel)
  return changed


def main(argv: Sequence[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--check", action="store_true", help="change nothing; exit 1 if a table differs")
  p.add_argument("--root", default=str(ROOT), help="repository root (default: this checkout)")
  args = p.parse_args(argv)
  root = pathlib.Path(args.root)
  if args.check:
    problems = check(root)
    if problems:
      print(problems[0], file=sys.stderr)
      if len(problems) > 1:
        print(f"(and {len(problems) - 1} more)", file=sys.stderr)
      return 1
    print("every table matches its results files")
    return 0
  for rel in rewrite(root):
    print("rewrote", rel)
  return 0


if __name__ == "__main__":
  sys.exit(main())
