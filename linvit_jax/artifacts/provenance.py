"""Where a student came from, in words that may be published: the teacher's name and licence
(read from what sits beside its checkpoint) and dataset or checkpoint names without their local
directories. The export's student_config.json and its model card say only these (never a local
path: the card is published)."""

from __future__ import annotations

import json
import os
import re
from typing import Any

from linvit_jax.models import foreign
from linvit_jax.runtime import gfile

# Hugging Face Hub licence identifiers a teacher's licence text is matched against.
HUB_LICENSES = (
    "apache-2.0",
    "mit",
    "bsd-3-clause",
    "bsd-2-clause",
    "cc0-1.0",
    "cc-by-4.0",
    "cc-by-sa-4.0",
    "cc-by-nc-4.0",
    "cc-by-nc-sa-4.0",
    "cc-by-nc-nd-4.0",
    "gpl-3.0",
    "lgpl-3.0",
    "agpl-3.0",
    "mpl-2.0",
    "openrail",
    "llama2",
    "llama3",
    "gemma",
    "unlicense",
)
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def public_name(name: str | None) -> str | None:
  """A dataset or checkpoint name without its local directories ('image_folder:/a/b' ->
  'image_folder:b', '/a/teacher.npz' -> 'teacher.npz'); a hub id ('org/model') as it is."""
  if not name:
    return name
  prefix, sep, rest = name.rpartition(":") if ":" in name and "://" not in name else ("", "", name)
  if "://" in rest or os.path.isabs(rest) or rest.startswith(("~", ".")) or os.sep in rest:
    if not (_HUB_ID.fullmatch(rest) and not os.path.exists(rest)):
      rest = os.path.basename(rest.rstrip("/" + os.sep)) or rest
  return f"{prefix}{sep}{rest}"


def hub_license(text: str | None) -> str | None:
  """The Hub licence id a licence text starts with ('MIT (as declared ...)' -> 'mit'), or None."""
  if not text:
    return None
  norm = str(text).strip().lower()
  for lic in sorted(HUB_LICENSES, key=len, reverse=True):
    for spelling in (lic, lic.replace("-", " ")):  # 'Apache-2.0' or 'Apache 2.0'
      if norm == spelling or (norm.startswith(spelling) and norm[len(spelling)] in " (,;.:"):
        return lic
  return None


def _front_matter_license(readme: str | None) -> str | None:
  if not readme or not readme.startswith("---"):
    return None
  for line in readme.split("\n---", 1)[0].splitlines()[1:]:
    key, _, value = line.partition(":")
    if key.strip() == "license" and value.strip():
      return value.strip().strip("'\"")
  return None


def _read_json(path: str) -> dict[str, Any]:
  try:
    info = json.loads(gfile.read_text(path) or "{}")
  except ValueError:
    return {}
  return info if isinstance(info, dict) else {}


def teacher_info(init: str | None) -> dict[str, Any]:
  """{"init", "name", "license", "license_note"} of a teacher checkpoint, read from what sits
  beside it: an .npz's sidecar JSON (same stem; "hub_id", "license" or "licence"), or a Hugging
  Face folder's config.json ("_name_or_path") and README.md front matter (`license:`). "name" is
  a hub id when known, else the file or folder's base name; "license" a Hub id or None."""
  if not init:
    return {"init": None, "name": None, "license": None, "license_note": None}
  path = init.rstrip("/" + os.sep)
  name, text = public_name(path), None
  if path.endswith(".npz"):
    side = _read_json(foreign.sidecar_path(path))
    name = side.get("hub_id") or os.path.basename(path)[: -len(".npz")]
    text = side.get("license") or side.get("licence")
  elif gfile.exists(os.path.join(path, "config.json")):
    conf = _read_json(os.path.join(path, "config.json"))
    hub = conf.get("_name_or_path") or conf.get("hf_hub_id") or ""
    if _HUB_ID.fullmatch(hub) and not os.path.isabs(hub) and not os.path.exists(hub):
      name = hub
    text = conf.get("license") or _front_matter_license(
        gfile.read_text(os.path.join(path, "README.md"))
    )
  text = str(text) if text else None
  return {"init": name, "name": name, "license": hub_license(text), "license_note": text}
