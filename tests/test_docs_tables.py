"""The tables of figures in README.md and docs/*.md are what their committed results files give.

tools/docs_tables.py makes them; here its check runs on the repository, and on a copy of the
documents with one number edited by hand, which it must catch and name.
"""

from __future__ import annotations

import json
import pathlib
import shutil

import pytest

from tools import docs_tables
from tools import docs_tables_photos
from tools import docs_tables_runs

ROOT = docs_tables.ROOT


def test_every_table_matches_its_results_files():
  problems = docs_tables.check(ROOT)
  assert not problems, problems[0] + "\n(python tools/docs_tables.py rewrites the tables)"


@pytest.fixture
def copy(tmp_path) -> pathlib.Path:
  """The documents and every table's sources, copied into a stand-in repository."""
  files = {"README.md", *(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md"))}
  for table in docs_tables.TABLES.values():
    files.update(table.sources)
  for rel in files:
    (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / rel, tmp_path / rel)
  return tmp_path


def _edit_number(path: pathlib.Path, table: str) -> None:
  """Changes the last digit of the first decimal number inside `table`'s block in `path`."""
  text = path.read_text(encoding="utf-8")
  start = text.index(f"<!-- table:{table} -->")
  end = text.index("<!-- /table -->", start)
  block = text[start:end]
  i = next(i for i, c in enumerate(block) if c.isdigit() and block[i - 1] == "." and i > 30)
  while i + 1 < len(block) and block[i + 1].isdigit():
    i += 1
  digit = str((int(block[i]) + 1) % 10)
  path.write_text(text[: start + i] + digit + text[start + i + 1 :], encoding="utf-8")


def test_a_hand_edited_number_fails_the_check_naming_the_table(copy, capsys):
  assert docs_tables.main(["--check", "--root", str(copy)]) == 0
  _edit_number(copy / "docs" / "recipe.md", "default_seeds")
  assert docs_tables.main(["--check", "--root", str(copy)]) == 1
  err = capsys.readouterr().err
  assert "docs/recipe.md: table 'default_seeds' differs" in err, err
  assert "docs/vits14_lora8_w0_results.json" in err, err


def test_rewriting_restores_the_table(copy):
  _edit_number(copy / "docs" / "recipe.md", "default_history")
  assert docs_tables.check(copy)
  assert docs_tables.rewrite(copy) == ["docs/recipe.md"]
  assert docs_tables.check(copy) == []
  assert (copy / "docs" / "recipe.md").read_text() == (ROOT / "docs" / "recipe.md").read_text()


def test_a_results_file_that_changes_fails_the_check(copy):
  path = copy / "bench" / "results" / "hybrid_speed.json"
  result = json.loads(path.read_text())
  row = next(r for r in result["rows"] if (r["px"], r["case"]) == (896, "hybrid_keys32"))
  row["speedup"] += 1.0  # the README's speed table reads the default student's row
  path.write_text(json.dumps(result))
  problems = docs_tables.check(copy)
  assert problems and "table 'speed' differs" in problems[0], problems


def test_an_unregistered_table_is_an_error(copy):
  readme = copy / "README.md"
  readme.write_text(readme.read_text() + "\n<!-- table:nowhere -->\n| x |\n<!-- /table -->\n")
  assert any("table 'nowhere' is not registered" in p for p in docs_tables.check(copy))
  with pytest.raises(KeyError, match="nowhere"):
    docs_tables.rewrite(copy)


def test_flop_ratio_is_the_textbook_count():
  """softmax ÷ linear FLOPs of a ViT-S/14 block (attention + MLP), written out by hand: the
  projections and the MLP are 24·N·D² either way; softmax adds 4·N²·D, the hedgehog map
  (F = 2·Dh features from a Dh × Dh projection per head) 4·N·H·F·Dh + 4·N·H·F + 4·N·H·Dh·F/2."""
  d, h = 384, 6
  dh = d // h
  f = 2 * dh
  for size in (224, 448, 896):
    n = (size // 14) ** 2 + 1
    dense = 24.0 * n * d * d
    softmax = dense + 4.0 * n * n * d
    linear = dense + 4.0 * n * h * f * dh + 4.0 * n * h * f + 4.0 * n * h * dh * f / 2
    assert docs_tables_runs.flop_ratio(size) == pytest.approx(softmax / linear, rel=1e-12)


def test_flop_ratio_of_a_wider_map_a_hybrid_and_a_window():
  d, h, size = 384, 6, 896
  dh, n = d // h, (size // 14) ** 2 + 1
  dense = 24.0 * n * d * d
  softmax = dense + 4.0 * n * n * d
  f = 2 * 128  # num_features=128: a Dh × 128 projection, 256 features
  wide = dense + 4.0 * n * h * f * dh + 4.0 * n * h * f + 4.0 * n * h * dh * f / 2
  assert docs_tables_runs.flop_ratio(size, num_features=128) == pytest.approx(softmax / wide)
  linear = 12 * softmax / docs_tables_runs.flop_ratio(size)  # the default student's 12 blocks
  one = docs_tables_runs.flop_ratio(size, softmax_layers=1)
  assert one == pytest.approx(12 * softmax / (softmax + linear * 11 / 12))
  assert docs_tables_runs.flop_ratio(size, softmax_layers=12) == pytest.approx(1.0)
  # window=3: every patch scores and mixes 9 + 1 exact keys, the cls query all n, in each head.
  exact = 4.0 * ((n - 1) * 10 + n) * d
  window = docs_tables_runs.flop_ratio(size, window=3)
  assert window == pytest.approx(12 * softmax / (linear + 12 * exact))
  # one softmax layer with its 64×64 patch keys pooled to 32×32 (key_grid=32) or 16×16: it
  # scores the cls key and 1,024 or 256 pooled keys instead of all n
  for grid, keys in ((32, 1 + 32 * 32), (16, 1 + 16 * 16)):
    pooled = dense + 4.0 * n * keys * d
    got = docs_tables_runs.flop_ratio(size, softmax_layers=1, key_grid=grid)
    assert got == pytest.approx(12 * softmax / (pooled + linear * 11 / 12))
  assert docs_tables_runs.flop_ratio(224, softmax_layers=1, key_grid=16) == pytest.approx(
      docs_tables_runs.flop_ratio(224, softmax_layers=1)  # a 16×16 grid is left whole
  )


def test_pareto_marks_the_runs_no_other_of_their_budget_beats():
  study = {
      "slow_good": {"test": _table(0.05), "images_seen": 1600},  # 896: cls 0.96, 9×
      "fast_bad": {"test": _table(0.0), "images_seen": 1600},  # 0.91, 4×: beaten
      "other_budget": {"test": _table(0.0), "images_seen": 10000},  # alone in its budget
  }
  for run in study.values():
    for row in run["test"]["rows"]:
      row["size"] = {224: 224, 448: 896}[row["size"]]
  arms = [(name, name, {}) for name in study]
  lines = docs_tables_photos.pareto("s", arms)(lambda path: study).splitlines()
  rows = {line.split(" | ")[0][2:]: line for line in lines[2:]}
  assert rows["slow_good"].endswith("| 9.00× | 2.56× | yes | yes |")
  assert rows["fast_bad"].endswith("| 4.00× | 2.56× | yes |  |")
  assert rows["other_budget"].endswith("| yes | yes |") and "| 10,000 |" in rows["other_budget"]


def test_goals_table_turns_a_goal_met_when_the_run_meets_it(copy):
  """The goals verdicts read the study's numbers: raising the 896-px cls cosine past 0.92 and
  the k-NN retention past 99 % flips exactly those rows to "met"."""
  path = copy / docs_tables_photos.FULL_STUDY
  study = json.loads(path.read_text())
  before = docs_tables_photos.goals(docs_tables_photos.FULL_STUDY, "full")(
      lambda p: study if p == docs_tables_photos.FULL_STUDY else None
  )
  run = study["full"]
  row = next(r for r in run["test"]["rows"] if (r["size"], r["view"]) == (896, "whole"))
  row["cls_cosine"]["mean"] = 0.95
  run["knn"]["retention"] = 1.001
  after = docs_tables_photos.goals(docs_tables_photos.FULL_STUDY, "full")(lambda p: study)
  changed = [(a, b) for a, b in zip(before.splitlines(), after.splitlines()) if a != b]
  assert len(changed) == 2, changed
  assert all(b.endswith("| met |") and a.endswith("| not met |") for a, b in changed), changed
  assert "896 px | cls cosine" in changed[0][1] and "k-NN retention" in changed[1][1]


def _stat(per_photo):
  values = list(per_photo.values())
  worst = min(per_photo, key=per_photo.get)
  mean = sum(values) / len(values)
  return dict(mean=mean, lo=mean - 0.01, hi=mean + 0.01, worst=per_photo[worst],
              worst_photo=worst, n=len(values), per_photo=per_photo)  # fmt: skip


def _table(shift, n_test=3):
  rows = []
  for size in (224, 448):
    photos = {f"p{i}.jpg": 0.9 + 0.01 * (i % 3) + shift for i in range(n_test)}
    rows.append(dict(
        size=size, view="whole", cls_cosine=_stat(photos), patch_cosine=_stat(photos),
        dense=dict(drop_in=_stat(photos), probe_ratio=0.9 + shift),
        student_images_per_s=4.0 + 100 * shift, teacher_images_per_s=1.0,
    ))  # fmt: skip
  return dict(n_test=n_test, res=224, rows=rows)


def test_cross_goals_fit_gap_and_paired_read_the_study():
  study = {
      "ref": {"test": _table(0.0), "knn": {}, "timing_s": {"total": 100 * 60.0}},
      "arm": {"test": _table(0.05), "knn": {}, "timing_s": {"total": 110 * 60.0},
              "seen": _table(0.08, n_test=68), "in_source": _table(0.02, n_test=7),
              "people": _table(-0.03, n_test=15)},
  }  # fmt: skip
  study["ref"]["people"] = _table(-0.05, n_test=15)
  for run in study.values():  # measured at 224 px only: the people table has its own sizes
    run["people"]["rows"] = run["people"]["rows"][:1]
  load = lambda path: study  # noqa: E731
  ref = docs_tables_photos.cross_goals("s", "ref")(load)
  arm = docs_tables_photos.cross_goals("s", "arm")(load)
  # ref: cls 0.91 (< 0.97), worst 0.90 (met); arm: cls 0.96, patch 0.96 (met), run 110 min (not).
  assert "| 224 px | cls cosine | ≥ 0.97 | 0.910 [0.900, 0.920] | not met |" in ref
  assert "| 224 px | patch cosine | ≥ 0.96 | 0.960 [0.950, 0.970] | met |" in arm
  assert (
      "worst photo, cls / patch | ≥ 0.9 | 0.900 (p0.jpg)" in ref
      and "| ≤ 105 min | 100 min | met |" in ref
  )
  assert "| ≤ 105 min | 110 min | not met |" in arm and "FLOPs" in arm
  gap = docs_tables_photos.fit_gap("s", "arm")(load).splitlines()
  assert [line.split(" | ")[1] for line in gap[2:]] == ["68", "7", "3", "15"]
  assert "0.990 / 0.990" in gap[2]  # the seen photos' 224-px mean, 0.91 + 0.08
  assert gap[5].endswith(" test only) | 15 | 0.880 / 0.880 | — | 0.880 |"), gap[5]
  pairs = docs_tables_photos.paired("s", [("ref", "arm", "+0.05")])(load).splitlines()
  assert pairs[2].startswith("| +0.05 | 3 | +0.050 [+0.050, +0.050]"), pairs[2]
  # On the people photos instead: their own photo count and difference (-0.03 against -0.05).
  people = docs_tables_photos.paired("s", [("ref", "arm", "x")], photos="people")(load)
  assert people.splitlines()[0] == "| change | photos | 224 px: Δ cls | 224 px: Δ patch |"
  assert people.splitlines()[2].startswith("| x | 15 | +0.020 [+0.020, +0.020]"), people
  # Any labelled arms: the first column says what they vary, the rows fit minus cross-source.
  fit = docs_tables_photos.fit_by_count([("arm", "full rank")], first_column="`align`")(load)
  assert fit.startswith("| `align` | trained on, 224 px: cls / patch | 3 cross-source test")
  assert fit.splitlines()[2] == "| full rank | 0.990 / 0.990 | 0.960 / 0.960 | +0.030 / +0.030 |"
  # A label dict (e.g. photo counts) wins over the arms' own labels.
  counted = docs_tables_photos.fit_by_count([("arm", "full rank")], {"arm": 68})(load)
  assert counted.splitlines()[2].startswith("| 68 | 0.990 / 0.990 |")
