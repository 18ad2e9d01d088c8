"""Copy the same: transplant a softmax teacher's parameters into a linear-attention student.

A *policy* is an ordered list of `(path_regex, action)` rules, action 'copy' (take the teacher's
value) or 'keep' (keep the student's init). The first rule whose regex *fully* matches a leaf's
path decides (re.fullmatch, as big_vision's `dont_load`); every student leaf must be matched, so a
policy ends with a catch-all.

Paths are '/'-joined in per-block form, whatever the layout of either tree: block 3's query kernel
is `f"{layout.block_path(3)}/{layout.ATTN}/query/kernel"` (names and regexes: models/layout.py).
A scanned tree (`layout.SCANNED_PREFIX` paths with a leading depth axis) is viewed as blocks
0..L-1, so the same rules serve both layouts, and teacher and student may differ in layout. The
output always has the STUDENT's layout (and dtypes: a copied leaf is cast to the student leaf's
dtype if they differ, and the report says so).

Named policies, one per ablation arm (`POLICIES`, `get_policy`):

    copy_same            embedding, cls, pos_embedding, every LayerNorm, MlpBlock, encoder_norm, MAP
                         head, pre_logits and head copied; encoder attention (q/k/v/out) keeps the
                         student's init. The default: "copy the same, distill the difference".
    copy_all             q/k/v/out copied too (the "copy the attention weights" arm).
    copy_attention_only  only q/k/v/out copied; everything else keeps the student's init.
    copy_none            nothing copied (the random-init arm).

Feature-map and lever parameters (`layout.LINEAR_ONLY` under the attention module) are 'keep' in
every named policy: the teacher has none. A custom policy that copies a leaf the teacher
lacks, or copies across a shape mismatch, is a `SurgeryError` naming the path (and both shapes).

    params, report = transplant(teacher_params, student_init, "copy_same")
    print(report.summary()); report.to_json(workdir + "/surgery.json"); report.table()

A fine-tune on a new label set keeps the student's head by prepending a rule:
`get_policy("copy_same", prepend=[("head/.*", "keep")])`.

Everything here is pure: inputs are never mutated; leaves are numpy or jax arrays.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from linvit_jax.models import attention as attn_lib
from linvit_jax.models import layout
from linvit_jax.models import vit
from linvit_jax.runtime import gfile
from linvit_jax.runtime import tree as tree_lib
from linvit_jax.runtime.errors import ConfigError
from linvit_jax.runtime.errors import UserError

Params = dict[str, Any]
Rule = tuple[str, str]
Policy = list[Rule]
ACTIONS = ("copy", "keep")

# Rules match per-block paths (a scanned tree is viewed per block first); names from models/layout.
_BLOCK = layout.PER_BLOCK_RE
# What only a linear student has (feature maps, the conv_v lever, the window or sinks gate): never
# in a softmax teacher.
FEATURE_MAP_RULE: Rule = (layout.attention_re(layout.LINEAR_ONLY, per_block=True), "keep")
ATTENTION_PROJECTIONS = layout.attention_re(layout.PROJECTIONS, per_block=True)

# Operator-agnostic parts of a big_vision ViT: identical function in the softmax and linear model.
_OPERATOR_AGNOSTIC: Policy = [
    (r"embedding/.*", "copy"),
    (r"cls", "copy"),
    (r"reg", "copy"),  # registers / DeiT's distillation token: prefix tokens, like cls
    (r"pos_embedding", "copy"),
    (_BLOCK + r"/LayerNorm_\d+/.*", "copy"),
    (_BLOCK + r"/MlpBlock_0/.*", "copy"),
    (r"Transformer/encoder_norm/.*", "copy"),
    (r"MAPHead_0/.*", "copy"),  # the pooling head's attention stays softmax (one query is O(N))
    (r"pre_logits/.*", "copy"),
    (r"head/.*", "copy"),
]

POLICIES: dict[str, Policy] = {
    "copy_same": [FEATURE_MAP_RULE, (ATTENTION_PROJECTIONS, "keep")]
    + _OPERATOR_AGNOSTIC
    + [(r".*", "keep")],
    "copy_all": [FEATURE_MAP_RULE, (r".*", "copy")],
    "copy_attention_only": [FEATURE_MAP_RULE, (ATTENTION_PROJECTIONS, "copy"), (r".*", "keep")],
    "copy_none": [(r".*", "keep")],
}


class SurgeryError(UserError, ValueError):
  """A policy that cannot be applied; the message names the path (and shapes)."""


def get_policy(
    name_or_rules: str | Sequence[Sequence[str]], prepend: Sequence[Sequence[str]] = ()
) -> Policy:
  """A named policy or explicit rules, validated, with `prepend` rules taking precedence."""
  if isinstance(name_or_rules, str):
    if name_or_rules not in POLICIES:
      raise SurgeryError(f"unknown surgery policy {name_or_rules!r}; known: {sorted(POLICIES)}")
    rules = POLICIES[name_or_rules]
  else:
    rules = name_or_rules
  out: Policy = []
  for i, rule in enumerate([*prepend, *rules]):
    if isinstance(rule, str) or len(rule) != 2:
      raise SurgeryError(f"surgery rule #{i} {rule!r} must be a (path_regex, action) pair")
    pattern, action = rule
    if action not in ACTIONS:
      raise SurgeryError(
          f"surgery rule #{i} ({pattern!r}, {action!r}): action must be one of " f"{ACTIONS}"
      )
    try:
      re.compile(pattern)
    except re.error as e:
      raise SurgeryError(f"surgery rule #{i}: bad regex {pattern!r}: {e}") from None
    out.append((str(pattern), str(action)))
  return out


# ------------------------------------------------------------------------------------------------
# The report.


@dataclasses.dataclass(frozen=True)
class Row:
  path: str  # per-block path
  action: str  # 'copy' | 'keep'
  shape: tuple[int, ...]  # the student leaf's shape (per block for scanned trees)
  rule: str  # the regex that decided
  note: str = ""  # e.g. a dtype cast on copy


@dataclasses.dataclass
class SurgeryReport:
  """One row per student leaf (per block for scanned trees), in path order."""

  rows: list[Row]
  policy: Policy
  unused_teacher: list[str]  # teacher leaves nothing was copied from (e.g. extra blocks, head)

  def counts(self) -> dict[str, int]:
    """Leaves per action, plus parameter counts: {'copy', 'keep', 'copy_params', 'keep_params'}."""
    out = {a: 0 for a in ACTIONS} | {f"{a}_params": 0 for a in ACTIONS}
    for r in self.rows:
      out[r.action] += 1
      out[f"{r.action}_params"] += int(np.prod(r.shape, dtype=np.int64))
    return out

  def action_of(self, path: str) -> str:
    for r in self.rows:
      if r.path == path:
        return r.action
    raise KeyError(f"no leaf {path!r} in the surgery report")

  def copied_attention(self) -> bool:
    """Whether any encoder attention projection (q/k/v/out) came from the teacher: then the
    data-dependent out-projection calibration of a fresh attention does not apply."""
    return any(
        r.action == "copy" and re.fullmatch(ATTENTION_PROJECTIONS, r.path) for r in self.rows
    )

  def summary(self) -> str:
    """One line for a run's output: "150 tensors copied, 48 fresh (attention)"; the fresh ones
    are grouped as attention (projections, feature maps, levers), by module in the encoder
    (LayerNorm, MlpBlock, encoder_norm) or by top-level name (embedding, head, ...)."""
    fresh: dict[str, int] = {}
    attention = re.compile(layout.attention_re(per_block=True))
    for r in self.rows:
      if r.action != "keep":
        continue
      parts = r.path.split("/")
      if attention.fullmatch(r.path):
        group = "attention"
      elif parts[0] == "Transformer" and len(parts) > 2:
        in_block = parts[1].startswith(layout.SCANNED_BLOCK)
        group = re.sub(r"_\d+$", "", parts[2] if in_block else parts[1])
      else:
        group = parts[0]
      fresh[group] = fresh.get(group, 0) + 1
    c = self.counts()
    line = f"{c['copy']} tensors copied, {c['keep']} fresh"
    if len(fresh) == 1:
      line += f" ({next(iter(fresh))})"
    elif fresh:  # the largest group first
      groups = sorted(fresh.items(), key=lambda item: (-item[1], item[0]))
      line += f" ({', '.join(f'{n} {group}' for group, n in groups)})"
    return line

  def table(self, max_rows: int | None = None) -> str:
    """Aligned text table with a summary line; `max_rows` elides the middle of long tables."""
    header = ("path", "action", "shape", "rule")
    lines = [
        (
            r.path,
            r.action,
            "x".join(map(str, r.shape)) or "scalar",
            r.rule + (f"  ({r.note})" if r.note else ""),
        )
        for r in self.rows
    ]
    if max_rows is not None and len(lines) > max_rows:
      head = max(max_rows // 2, 1)
      tail = max(max_rows - head, 1)
      lines = (
          lines[:head] + [(f"... {len(lines) - head - tail} rows ...", "", "", "")] + lines[-tail:]
      )
    widths = [
        max(len(h), *(len(l[i]) for l in lines)) if lines else len(h) for i, h in enumerate(header)
    ]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths[:-1]) + "  {}"
    c = self.counts()
    summary = (
        f"copied {c['copy']} leaves ({c['copy_params']:,} params), kept {c['keep']} leaves "
        f"({c['keep_params']:,} params)"
    )
    if self.unused_teacher:
      summary += f"; {len(self.unused_teacher)} teacher leaves unused"
    return "\n".join([fmt.format(*header), *(fmt.format(*l) for l in lines), summary])

  def to_dict(self) -> dict[str, Any]:
    return {
        "policy": [list(r) for r in self.policy],
        "counts": self.counts(),
        "rows": [dataclasses.asdict(r) | {"shape": list(r.shape)} for r in self.rows],
        "unused_teacher": list(self.unused_teacher),
    }

  def to_json(self, path: str) -> None:
    gfile.write_text(path, json.dumps(self.to_dict(), indent=1))  # local or gs://

  def __str__(self) -> str:
    return self.table()


# ------------------------------------------------------------------------------------------------
# Per-block views of either layout.


@dataclasses.dataclass(frozen=True)
class _Ref:
  """A leaf seen per block: `leaf[index]` of a scanned leaf (`stacked` is its own path)."""

  leaf: Any
  index: int | None = None
  stacked: str | None = None

  def value(self):
    return self.leaf if self.index is None else self.leaf[self.index]

  @property
  def shape(self) -> tuple[int, ...]:
    s = tuple(np.shape(self.leaf))
    return s if self.index is None else s[1:]


def _per_block_view(tree: Mapping[str, Any], what: str) -> dict[str, _Ref]:
  if not isinstance(tree, Mapping):
    raise SurgeryError(f"{what} params must be a nested dict, got {type(tree).__name__}")
  if "params" in tree and len(tree) == 1:
    raise SurgeryError(f"{what} params have a single 'params' key: pass variables['params']")
  view: dict[str, _Ref] = {}
  for path, leaf in tree_lib.flatten(tree, error=SurgeryError).items():
    if path.startswith(layout.SCANNED_PREFIX):
      if not np.ndim(leaf):
        raise SurgeryError(
            f"{what} '{path}' is under the scanned '{layout.SCANNED_BLOCK}' but has no leading "
            "depth axis"
        )
      rest = path[len(layout.SCANNED_PREFIX) :]
      for i in range(np.shape(leaf)[0]):
        view[f"{layout.block_path(i)}/{rest}"] = _Ref(leaf, i, path)
    else:
      view[path] = _Ref(leaf)
  return view


def _stack(values: Sequence[Any]) -> Any:
  if all(isinstance(v, np.ndarray) for v in values):
    return np.stack(values)
  return jnp.stack([jnp.asarray(v) for v in values])


def _cast(value: Any, dtype: Any) -> Any:
  if np.dtype(value.dtype) == np.dtype(dtype):
    return value
  return value.astype(dtype)


def _hint(path: str) -> str:
  if path.endswith("pos_embedding"):
    return (
        " (a different image size or patch grid: load the teacher at the student's resolution"
        " with vit.load, which resamples the position embedding)"
    )
  if path.startswith("head/"):
    return " (a different label set: prepend the rule ('head/.*', 'keep'))"
  return ""


# ------------------------------------------------------------------------------------------------
# The transplant.


def transplant(
    teacher_params: Mapping[str, Any],
    student_params: Mapping[str, Any],
    policy: str | Sequence[Sequence[str]] = "copy_same",
) -> tuple[Params, SurgeryReport]:
  """Student-layout params where each leaf is the teacher's ('copy') or the student's ('keep').

  Args:
    teacher_params: the softmax teacher's params (nested dict, per-block or scanned).
    student_params: the student's freshly initialised params (nested dict, per-block or scanned).
    policy: a name in `POLICIES` or a list of (path_regex, action) rules (first match wins).

  Returns:
    (params, report): params with the student's structure, layout, shapes and dtypes; the report
    has one row per student leaf.

  Raises:
    SurgeryError: a student leaf no rule matches; a copy rule for a leaf the teacher lacks; a
      copy across different shapes (the message names the path and both shapes).
  """
  rules = get_policy(policy)
  teacher = _per_block_view(teacher_params, "teacher")
  student = _per_block_view(student_params, "student")
  rows, sources = _decide(student, teacher, rules)
  chosen = _assemble(student, sources)
  unused = sorted((p for p in teacher if p not in sources), key=_natural_key)
  return tree_lib.unflatten(chosen, error=SurgeryError), SurgeryReport(rows, rules, unused)


def _decide(
    student: Mapping[str, _Ref], teacher: Mapping[str, _Ref], rules: Policy
) -> tuple[list[Row], dict[str, _Ref]]:
  """(one report row per student leaf, per-block path -> the teacher ref it copies); every leaf
  the policy cannot be applied to is named in one SurgeryError."""
  compiled = tree_lib.compile_patterns([p for p, _ in rules])
  rows: list[Row] = []
  sources: dict[str, _Ref] = {}
  problems: list[str] = []
  for path in sorted(student, key=_natural_key):
    s = student[path]
    hit = tree_lib.first_match(path, compiled)
    if hit is None:
      problems.append(
          f"'{path}' is matched by no rule (end the policy with a catch-all such as "
          "('.*', 'keep'))"
      )
      continue
    pattern, action = rules[hit]
    note = ""
    if action == "copy":
      t = teacher.get(path)
      problem = _copy_problem(path, pattern, t, s)
      if problem:
        problems.append(problem)
        continue
      t_dtype, s_dtype = np.dtype(t.leaf.dtype), np.dtype(s.leaf.dtype)
      if t_dtype != s_dtype:
        note = f"cast {t_dtype} -> {s_dtype}"
      sources[path] = t
    rows.append(Row(path, action, s.shape, pattern, note))
  if problems:
    raise SurgeryError(
        f"surgery policy cannot be applied ({len(problems)} problem"
        f"{'s' if len(problems) > 1 else ''}):\n  " + "\n  ".join(problems)
    )
  return rows, sources


def _copy_problem(path: str, pattern: str, t: _Ref | None, s: _Ref) -> str | None:
  """Why the teacher's leaf `t` cannot be copied into student leaf `s` (None: it can)."""
  if t is None:
    return f"'{path}': rule ({pattern!r}, 'copy') but the teacher has no such leaf" + (
        " (feature maps are student-only: keep them)" if "/feature_map_" in path else ""
    )
  if t.shape != s.shape:
    return (
        f"'{path}': rule ({pattern!r}, 'copy') but shapes differ: teacher "
        f"{t.shape}, student {s.shape}{_hint(path)}"
    )
  return None


def _assemble(student: Mapping[str, _Ref], sources: Mapping[str, _Ref]) -> dict[str, Any]:
  """The chosen values by path in the student's layout (scanned leaves restacked): the teacher's
  where `sources` has one (cast to the student's dtype), else the student's."""
  chosen: dict[str, Any] = {}
  by_stacked: dict[str, list[str]] = {}
  for path, s in student.items():
    if s.stacked is None:
      t = sources.get(path)
      chosen[path] = _cast(t.value(), s.leaf.dtype) if t is not None else s.leaf
    else:
      by_stacked.setdefault(s.stacked, []).append(path)
  for stacked_path, block_paths in by_stacked.items():
    block_paths.sort(key=lambda p: student[p].index)
    chosen[stacked_path] = _assemble_stacked(student, sources, block_paths)
  return chosen


def _assemble_stacked(
    student: Mapping[str, _Ref], sources: Mapping[str, _Ref], block_paths: Sequence[str]
) -> Any:
  """One scanned student leaf from its blocks, in order. Blocks that all come from one scanned
  teacher leaf (or all stay) pass it through whole: no stacking, bitwise identical."""
  s_leaf = student[block_paths[0]].leaf
  refs = [sources.get(p) for p in block_paths]
  if all(r is None for r in refs):
    return s_leaf
  if (
      all(r is not None for r in refs)
      and len({id(r.leaf) for r in refs}) == 1
      and refs[0].stacked is not None
      and [r.index for r in refs] == list(range(len(refs)))
      and np.shape(refs[0].leaf)[0] == len(refs)
  ):
    return _cast(refs[0].leaf, s_leaf.dtype)
  return _stack(
      [
          _cast(r.value(), s_leaf.dtype) if r is not None else student[p].value()
          for p, r in zip(block_paths, refs)
      ]
  )


def _natural_key(path: str) -> list[Any]:
  """Sorts block 10 after block 9 (digit runs compare as numbers)."""
  return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path)]


# ------------------------------------------------------------------------------------------------
# After the transplant: leaves kept fresh, and the hybrid swap.


def keep_fresh(params: Any, fresh: Any, patterns: Sequence[str]) -> tuple[Any, list[str]]:
  """params with every leaf whose path fully matches one of `patterns` (`student.dont_load`)
  taken from `fresh`, and the sorted paths so kept."""
  regexes = tree_lib.compile_patterns(tuple(patterns))
  flat, flat_fresh = tree_lib.flatten(params), tree_lib.flatten(fresh)
  kept = sorted(k for k in flat if tree_lib.matches(k, regexes))
  if not kept:
    raise ConfigError(
        f"student.dont_load={tuple(patterns)!r} matches no student parameter; "
        f"names look like {sorted(flat)[:3]}"
    )
  return tree_lib.unflatten({**flat, **{k: flat_fresh[k] for k in kept}}), kept


def worst_layers(fidelity_rows: list[dict[str, float]], k: int) -> list[int]:
  """The k layers with the lowest teacher-forced cosine (`evaluate.attention_fidelity` rows)."""
  return sorted(int(l) for l in np.argsort([r["cosine"] for r in fidelity_rows])[:k])


def to_softmax_layers(
    teacher_params: Any,
    student_model: Any,
    student_params: Any,
    layers: Sequence[int],
    key_grid: int = 0,
) -> tuple[Any, Any]:
  """The hybrid swap: the student with `layers` turned back into softmax attention holding the
  teacher's q/k/v/out (their feature-map params dropped), their patch keys pooled to at most
  key_grid² on larger grids (0: every key); other layers untouched."""
  if layout.is_scanned(student_params):
    raise ConfigError("student.softmax_layers needs a per-block (scan=False) student")
  specs = list(vit.layer_specs(student_model))
  for l in layers:
    specs[l] = attn_lib.AttentionSpec(kind="softmax", key_grid=key_grid)
  model = student_model.clone(attention=tuple(specs))
  params = dict(student_params)  # fresh containers along the edited paths; other leaves shared
  params["Transformer"] = dict(params["Transformer"])
  for l in layers:
    name = layout.block_name(l)
    block = dict(params["Transformer"][name])
    block[layout.ATTN] = dict(teacher_params["Transformer"][name][layout.ATTN])
    params["Transformer"][name] = block
  return model, params
