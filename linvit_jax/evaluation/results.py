"""A run's results: one typed record of what was measured, and its JSON layout (results.json).

The driver fills a `Results` step by step; the summary, the export's card, the ablation, the docs
tables, the tools and the bench read it through its fields and accessors (`after(stage)`,
`fidelity(stage)`, `final()`), never by building key strings: the per-stage key spellings
(`fidelity_after_<stage>`, `end_to_end_hybrid_after_<stage>`, ...) live in `to_json` and
`from_json` only.

The layout. Version 1 is results.json as every run so far wrote it, and it carries no version key
(the committed docs/*_results.json are version 1): a future layout writes `"version": N` and
`from_json` upgrades the older ones. A key the record does not know (a retired measure such as
`window_share`, or one a newer writer added) is kept in `extra` and written back after the known
ones: a read and a write lose nothing. A missing key reads as "not measured" (None, or empty): an
older run lacks the measures added after it, and its readers skip them. A file of a newer layout
than this code reads is an error: its keys may mean something else.

Adding a measure: a `measure(...)` field here, and its evaluator in report.MEASURES; the summary
and the card show it without a change (a generic line) until someone writes it a nicer one.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import json
from collections.abc import Iterator, Mapping
from typing import Any

VERSION = 1  # the layout without a version key: every results.json before this module
CONVERTED = "converted"  # the tag of the scoring right after surgery, before any stage

# JSON keys the per-stage block is spelled with (read and written here only).
_TOP1_CONVERTED = "student_top1_converted"
_TOP1_AFTER = "student_top1_after_"
_TOP1_BEFORE_FINETUNE = "student_top1_before_finetune"
_LAYERS = "fidelity_"  # + tag: teacher-forced, per layer
_END_TO_END = "end_to_end_"  # + tag: the student's own forward
_SOFTMAX_LAYERS = "softmax_layers"
_SOFTMAX_GAINS = "softmax_layers_fix_gains"  # per layer, when picked by sensitivity


@dataclasses.dataclass
class Fidelity:
  """The student vs its teacher on the held-out sample: per layer, teacher-forced
  (evaluate.attention_fidelity: cosine, nmse, ...) and end to end (evaluate.end_to_end_fidelity:
  cls_cosine, patch_cosine, block_cosine, ...)."""

  layers: list[dict[str, Any]] | None = None
  end_to_end: dict[str, Any] | None = None

  def scalars(self) -> dict[str, float]:
    """The end-to-end figures that are single numbers (block_cosine, a list, left out)."""
    return {k: v for k, v in (self.end_to_end or {}).items() if isinstance(v, float)}


@dataclasses.dataclass
class Stage:
  """What a run measured after one of its stages (or, named CONVERTED, right after surgery)."""

  name: str
  top1: float | None = None  # None: not labelled
  fidelity: Fidelity | None = None  # None: no teacher
  # The top-1 before a stage that fine-tunes (finetune, align). Read from a results.json, only the
  # first such stage has it (its key's place), holding the last value (Results.top1_before_finetune).
  top1_before: float | None = None
  softmax_layers: list[int] | None = None  # the hybrid swap after this stage
  softmax_gains: list[float] | None = None  # layer_swap.fix_gains, when they picked the layers
  hybrid: Fidelity | None = None  # scored again after that swap

  @property
  def tag(self) -> str:
    return CONVERTED if self.name == CONVERTED else f"after_{self.name}"


def measure(label: str, card: str | None = None) -> Any:
  """A field an evaluator after the stages fills (report.MEASURES): `label` names it in the
  summary, `card` its key in the export's fidelity block (None: not exported)."""
  return dataclasses.field(default=None, metadata={"measure": True, "label": label, "card": card})


@dataclasses.dataclass(eq=False)
class Results(collections.abc.Mapping):
  """A run's results. As a Mapping it reads as its results.json (to_json), for code that checks
  the file's content; library code reads the fields."""

  config: dict[str, Any] = dataclasses.field(default_factory=dict)  # the run's config, resolved
  timing_s: dict[str, float] = dataclasses.field(default_factory=dict)  # part or stage -> seconds
  labelled: bool = False
  knn_skipped: str | None = None  # why k-NN was not measured, and the fix
  student_kept_fresh: list[str] | None = None  # student.dont_load's params
  teacher_scored: bool = False  # whether the teacher's top-1 was measured (None when unlabelled)
  teacher_top1: float | None = None
  converted: Stage | None = None  # right after surgery (a run with a teacher)
  stages: list[Stage] = dataclasses.field(default_factory=list)
  top1_before_finetune: float | None = None  # before the last stage that fine-tunes
  student_top1: float | None = None  # the final one (None: not labelled)
  histories: dict[str, list[dict[str, Any]]] | None = None  # stage -> its logged rows
  images_seen: int | None = None
  student_attention: Any = None  # vit.Model(attention=...) of the exported student
  # After the stages (report.MEASURES, in this order).
  knn: dict[str, Any] | None = measure("k-NN retention", card="knn")
  eval_view_fidelity: dict[str, Any] | None = measure("eval-view fidelity", card="eval_view")
  test: dict[str, Any] | None = measure("test photos", card="test")
  exact_share: list[float | None] | None = measure("exact-set share of attention mass")
  student_images_per_s: float | None = measure("student images/s")
  teacher_images_per_s: float | None = measure("teacher images/s")
  resolution: list[dict[str, Any]] | None = measure("other resolutions", card="resolutions")
  matmul_gflops: float | None = measure("matmul GFLOP/s")  # the steps' GFLOP/s are read against it
  student_logits_sample: list[Any] | None = None  # the exported student's output on 4 images
  version: int = VERSION
  extra: dict[str, Any] = dataclasses.field(default_factory=dict)  # keys this code does not know

  # -------------------------------------------------------------------------------- accessors

  def after(self, stage: str) -> Stage | None:
    """What was measured after `stage` (CONVERTED: right after surgery); None if not run."""
    if stage == CONVERTED:
      return self.converted
    return next((s for s in self.stages if s.name == stage), None)

  def fidelity(self, stage: str) -> Fidelity | None:
    """The fidelity measured after `stage` (CONVERTED: after surgery), before any hybrid swap."""
    point = self.after(stage)
    return point.fidelity if point is not None else None

  def top1_after(self, stage: str) -> float | None:
    point = self.after(stage)
    return point.top1 if point is not None else None

  def scorings(self) -> list[tuple[str, Fidelity]]:
    """Every fidelity measurement in the order it was made, by tag: 'converted',
    'after_<stage>', 'hybrid_after_<stage>'."""
    out = []
    for point in ([self.converted] if self.converted else []) + self.stages:
      if point.fidelity is not None:
        out.append((point.tag, point.fidelity))
      if point.hybrid is not None:
        out.append((f"hybrid_{point.tag}", point.hybrid))
    return out

  def final(self) -> tuple[str, Fidelity] | None:
    """(tag, fidelity) of the last measurement: the student as exported."""
    scorings = [(t, f) for t, f in self.scorings() if f.end_to_end is not None]
    return scorings[-1] if scorings else None

  @property
  def softmax_layers(self) -> list[int]:
    """The layers the hybrid swap kept softmax ([] without one)."""
    return next((s.softmax_layers for s in self.stages if s.softmax_layers is not None), [])

  def add_time(self, part: str, seconds: float) -> None:
    """timing_s[part] += seconds (a part timed in pieces keeps its first place)."""
    self.timing_s[part] = self.timing_s.get(part, 0.0) + seconds

  @classmethod
  def measure_fields(cls) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if f.metadata.get("measure")]

  def measures(self) -> list[tuple[dataclasses.Field, Any]]:
    """(field, value) of each measure that was taken, in the record's order."""
    return [
        (f, getattr(self, f.name))
        for f in self.measure_fields()
        if getattr(self, f.name) is not None
    ]

  # ----------------------------------------------------------------------------------- JSON

  def to_json(self) -> dict[str, Any]:
    """results.json's dict: the record's fields in their order, the stages as per-stage keys."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(self):
      value = getattr(self, f.name)
      if f.name == "teacher_scored":
        continue
      if f.name == "teacher_top1":
        if self.teacher_scored:
          out["teacher_top1"] = value
      elif f.name == "converted":
        if value is not None:
          out[_TOP1_CONVERTED] = value.top1
          _put_fidelity(out, CONVERTED, value.fidelity)
      elif f.name == "stages":
        _put_stages(out, value, self.top1_before_finetune)
      elif f.name == "top1_before_finetune":
        if value is not None and _TOP1_BEFORE_FINETUNE not in out:  # no stage marks its place
          out[_TOP1_BEFORE_FINETUNE] = value
      elif f.name in _ALWAYS:
        out[f.name] = value
      elif f.name == "version":
        if value != 1:  # layout 1 is the one without a version key
          out["version"] = value
      elif f.name == "extra":
        out.update({k: v for k, v in value.items() if k not in out})
      elif value is not None:
        out[f.name] = value
    return out

  def dumps(self) -> str:
    """results.json's text (numpy scalars as floats)."""
    return json.dumps(self.to_json(), indent=1, default=float)

  @classmethod
  def from_json(cls, data: Mapping[str, Any]) -> Results:
    """The record of a results.json dict, of this layout or an older one (see the module doc)."""
    version = data.get("version", 1)
    if not isinstance(version, int) or version > VERSION:
      raise ValueError(
          f"results.json of layout version {version!r}: this code reads up to {VERSION} "
          "(a newer linvit_jax wrote it)"
      )
    names = {f.name for f in dataclasses.fields(cls)} - _NOT_KEYS
    fields: dict[str, Any] = {"version": version, "extra": {}, "stages": []}
    stages: dict[str, Stage] = {}
    current: Stage | None = None  # the stage whose keys come last: the hybrid swap's
    before = None  # student_top1_before_finetune: the next stage's
    for key, value in data.items():
      if key in names:
        fields[key] = value
        if key == "teacher_top1":
          fields["teacher_scored"] = True
        continue
      if key == "version":
        continue
      if key == _TOP1_BEFORE_FINETUNE:
        before = fields["top1_before_finetune"] = value
        continue
      if key == _SOFTMAX_LAYERS and current is not None:
        current.softmax_layers = value
        continue
      if key == _SOFTMAX_GAINS and current is not None:
        current.softmax_gains = value
        continue
      parsed = _parse_stage_key(key)
      if parsed is None:
        fields["extra"][key] = value
        continue
      what, name, hybrid = parsed
      if name == CONVERTED:
        point = fields.setdefault("converted", Stage(CONVERTED))
      else:
        if name not in stages:
          stages[name] = Stage(name, top1_before=before)
          before = None
          fields["stages"].append(stages[name])
        point = stages[name]
      current = point
      if what == "top1":
        point.top1 = value
        continue
      attr = "hybrid" if hybrid else "fidelity"
      fid = getattr(point, attr) or Fidelity()
      setattr(point, attr, fid)
      if what == "layers":
        fid.layers = value
      else:
        fid.end_to_end = value
    return cls(**fields)

  # ------------------------------------------------------------- a read-only results.json view

  def __getitem__(self, key: str) -> Any:
    return self.to_json()[key]

  def __iter__(self) -> Iterator[str]:
    return iter(self.to_json())

  def __len__(self) -> int:
    return len(self.to_json())


# Written even when None: the final top-1 (None: not labelled) and the run's frame.
_ALWAYS = frozenset({"config", "timing_s", "labelled", "student_top1"})
# Fields that are no JSON key of their own.
_NOT_KEYS = frozenset(
    {"teacher_scored", "converted", "stages", "top1_before_finetune", "version", "extra"}
)


def as_record(results: Results | Mapping[str, Any]) -> Results:
  """A Results from either a record or a results.json dict (an older file, a test's dict)."""
  return results if isinstance(results, Results) else Results.from_json(results)


def read(path: str) -> Results:
  """The record of a results.json file (local path; gs:// through gfile)."""
  from linvit_jax.runtime import gfile  # a leaf helper: no floor above

  with gfile.open(path) as f:
    return Results.from_json(json.load(f))


def _put_fidelity(out: dict[str, Any], tag: str, fid: Fidelity | None) -> None:
  if fid is None:
    return
  if fid.layers is not None:
    out[_LAYERS + tag] = fid.layers
  if fid.end_to_end is not None:
    out[_END_TO_END + tag] = fid.end_to_end


def _put_stages(out: dict[str, Any], stages: list[Stage], before: float | None) -> None:
  """The per-stage keys in the order the driver measures them; student_top1_before_finetune
  (one key, `before`) sits before the first stage that fine-tuned from a top-1."""
  for s in stages:
    if s.top1_before is not None and before is not None and _TOP1_BEFORE_FINETUNE not in out:
      out[_TOP1_BEFORE_FINETUNE] = before
    out[_TOP1_AFTER + s.name] = s.top1
    _put_fidelity(out, s.tag, s.fidelity)
    if s.softmax_layers is not None:
      out[_SOFTMAX_LAYERS] = s.softmax_layers
    if s.softmax_gains is not None:
      out[_SOFTMAX_GAINS] = s.softmax_gains
    _put_fidelity(out, f"hybrid_{s.tag}", s.hybrid)


def _parse_stage_key(key: str) -> tuple[str, str, bool] | None:
  """(what, stage name, after a hybrid swap) of a per-stage key, None for any other key."""
  if key == _TOP1_CONVERTED:
    return "top1", CONVERTED, False
  if key.startswith(_TOP1_AFTER):
    return "top1", key[len(_TOP1_AFTER) :], False
  for prefix, what in ((_LAYERS, "layers"), (_END_TO_END, "end_to_end")):
    if not key.startswith(prefix):
      continue
    tag = key[len(prefix) :]
    hybrid = tag.startswith("hybrid_after_")
    tag = tag[len("hybrid_") :] if hybrid else tag
    if tag == CONVERTED:
      return what, CONVERTED, False
    if tag.startswith("after_"):
      return what, tag[len("after_") :], hybrid
  return None


def json_schema() -> dict[str, Any]:
  """results.json as a JSON Schema (draft 2020-12): the keys of this layout, the per-stage ones
  as patterns; any other key is allowed (kept in `extra`)."""
  number = {"type": ["number", "null"]}
  layers = {"type": "array", "items": {"type": "object"}}
  obj = {"type": "object"}
  props: dict[str, Any] = {
      "config": obj,
      "timing_s": {"type": "object", "additionalProperties": {"type": "number"}},
      "labelled": {"type": "boolean"},
      "knn_skipped": {"type": "string"},
      "student_kept_fresh": {"type": "array", "items": {"type": "string"}},
      "teacher_top1": number,
      _TOP1_CONVERTED: number,
      _LAYERS + CONVERTED: layers,
      _END_TO_END + CONVERTED: obj,
      _TOP1_BEFORE_FINETUNE: number,
      _SOFTMAX_LAYERS: {"type": "array", "items": {"type": "integer"}},
      _SOFTMAX_GAINS: {"type": "array", "items": {"type": "number"}},
      "student_top1": number,
      "histories": obj,
      "images_seen": {"type": "integer"},
      "student_attention": {},
      "student_logits_sample": {"type": "array"},
      "version": {"type": "integer"},
  }
  for f in Results.measure_fields():
    props[f.name] = {"description": f.metadata["label"]}
  return {
      "$schema": "https://json-schema.org/draft/2020-12/schema",
      "title": "linvit_jax results.json",
      "type": "object",
      "required": sorted(_ALWAYS),
      "properties": props,
      "patternProperties": {
          f"^{_TOP1_AFTER}.+$": number,
          f"^{_LAYERS}(hybrid_)?after_.+$": layers,
          f"^{_END_TO_END}(hybrid_)?after_.+$": obj,
      },
  }
