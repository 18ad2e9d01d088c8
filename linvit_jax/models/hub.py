"""Hub names as checkpoints: `hf:facebook/dinov2-small`, `timm:vit_small_patch14_dinov2`.

  resolve("hf:facebook/dinov2-small")          -> ~/.cache/huggingface/hub/models--facebook--
                                                   dinov2-small/snapshots/<commit>
  resolve("timm:vit_small_patch14_dinov2.lvd142m") -> the snapshot of the repo timm/<name>

A hub name is read through huggingface_hub's own download and cache (`snapshot_download`), so a
model fetched once, by this library or by `hf download`, is found again offline
(`HF_HUB_OFFLINE=1`, or no network). Only what `linvit_jax.models.foreign` reads is fetched:
config.json, preprocessor_config.json and the safetensors weights (and README.md, for the
licence). `@<revision>` after the name picks a branch, tag or commit. huggingface_hub is an
optional dependency: `pip install 'linvit_jax[hub]'`.

No import beyond the standard library and errors.py at module level: the models layer asks
`is_hub_name` of every checkpoint path.
"""

from __future__ import annotations

import functools
import os
import re

from linvit_jax.runtime.errors import UserError

# The hub repository of each prefix: `timm:<name>` is the repo `timm/<name>`.
PREFIXES = {"hf": "", "timm": "timm/"}
# What linvit_jax.models.foreign reads from a model folder (sharded weights included), and the
# model card whose front matter names the licence (artifacts/provenance.teacher_info).
FILES = (
    "README.md",
    "config.json",
    "preprocessor_config.json",
    "model.safetensors",
    "model.safetensors.index.json",
    "model-*.safetensors",
)
_NAME = re.compile(r"(hf|timm):([\w.-]+(?:/[\w.-]+)?)(?:@([\w./-]+))?")
_TRUE = ("1", "ON", "YES", "TRUE")


class HubError(UserError, OSError):
  """A hub name that cannot be read: not cached while offline, no such repository, no access."""

  def __str__(self) -> str:
    return self.args[0]


class HubNotInstalledError(UserError, ImportError):
  """A hub name was given but huggingface_hub is not installed."""


def is_hub_name(path: str) -> bool:
  """Whether `path` is a hub name (`hf:org/name`, `timm:name`, optionally `@revision`) rather
  than a local path (an existing file or folder of that name wins)."""
  return bool(_NAME.fullmatch(path)) and not os.path.exists(path)


def repo_id(name: str) -> tuple[str, str | None]:
  """(the hub repository, the revision or None) of hub name `name`."""
  match = _NAME.fullmatch(name)
  if not match:
    raise HubError(
        f"checkpoint {name!r}: not a hub name (hf:<org>/<name> or timm:<name>, optionally "
        "@<revision>)"
    )
  prefix, repo, revision = match.groups()
  if prefix == "timm" and "/" in repo:
    raise HubError(f"checkpoint {name!r}: timm:<name> names a repo of the timm org, without '/'")
  return PREFIXES[prefix] + repo, revision


def offline() -> bool:
  """Whether huggingface_hub may not reach the network: HF_HUB_OFFLINE, read now (its own
  constant is read once, at import)."""
  value = os.environ.get("HF_HUB_OFFLINE")
  if value is not None:
    return value.upper() in _TRUE
  try:
    from huggingface_hub import constants
  except ImportError:
    return False
  return bool(constants.HF_HUB_OFFLINE)


@functools.cache
def _resolve(name: str, cache_dir: str | None, is_offline: bool) -> str:
  repo, revision = repo_id(name)
  try:
    import huggingface_hub
    from huggingface_hub import utils as hf_errors  # its errors, here since 0.15
  except ImportError:
    raise HubNotInstalledError(
        f"checkpoint {name!r}: reading a hub name needs huggingface_hub: "
        "pip install 'linvit_jax[hub]' (or pass a downloaded model folder)"
    ) from None
  # `hf` is huggingface_hub's CLI (`huggingface-cli download` in older releases).
  fetch = f"`hf download {repo}" + (f" --revision {revision}`" if revision else "`")
  try:
    return huggingface_hub.snapshot_download(
        repo,
        revision=revision,
        cache_dir=cache_dir,
        allow_patterns=list(FILES),
        local_files_only=is_offline,
    )
  except hf_errors.GatedRepoError:
    raise HubError(
        f"checkpoint {name!r}: the hub repo {repo} is gated: accept its terms on "
        f"huggingface.co/{repo}, log in (`hf auth login`), then {fetch}"
    ) from None
  except hf_errors.RepositoryNotFoundError:
    raise HubError(
        f"checkpoint {name!r}: no hub repo {repo} (or it is private: log in with "
        "`hf auth login`)"
    ) from None
  except hf_errors.RevisionNotFoundError:
    raise HubError(f"checkpoint {name!r}: the hub repo {repo} has no revision {revision}") from None
  except (hf_errors.LocalEntryNotFoundError, OSError) as e:
    why = "HF_HUB_OFFLINE is set" if is_offline else "the hub could not be reached"
    where = cache_dir or huggingface_hub.constants.HF_HUB_CACHE
    raise HubError(
        f"checkpoint {name!r}: {repo} is not in the Hugging Face cache ({where}) and {why}; "
        f"fetch it with {fetch} (into this cache) or run once online ({type(e).__name__})"
    ) from None


def resolve(name: str) -> str:
  """The local model folder of hub name `name`: huggingface_hub's cached snapshot, downloaded
  first when it is not cached and the network may be used. Raises HubError in one line."""
  # The cache and offline mode are read per call (the environment may change after import);
  # the answer is kept per process: every reader of the checkpoint asks.
  return _resolve(name, os.environ.get("HF_HUB_CACHE") or None, offline())
