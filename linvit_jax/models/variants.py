"""big_vision's ViT size names ("S/16", "B", "So400m/14", ...) decoded into model kwargs.

Kept apart from models/vit.py so that checkpoint checks (models/vit_checkpoint.py) can decode a
variant without importing flax.
"""

from typing import Any

# name: (width, depth, mlp_dim, num_heads). Same table as big_vision's vit.decode_variant
# (Table 2 of https://arxiv.org/abs/2106.04560, plus "mu" for tests and the *-opt shapes).
VARIANTS: dict[str, tuple[int, int, int, int]] = {
    "mu": (32, 1, 128, 2),
    "Ti": (192, 12, 768, 3),
    "S": (384, 12, 1536, 6),
    "M": (512, 12, 2048, 8),
    "B": (768, 12, 3072, 12),
    "L": (1024, 24, 4096, 16),
    "So400m": (1152, 27, 4304, 16),
    "H": (1280, 32, 5120, 16),
    "g": (1408, 40, 6144, 16),
    "g-opt": (1536, 40, 6144, 16),
    "G": (1664, 48, 8192, 16),
    "G-opt": (1536, 48, 8192, 16),
    "e": (1792, 56, 15360, 16),
}


def decode_variant(variant: str | None) -> dict[str, Any]:
  """ "S/16" -> {width, depth, mlp_dim, num_heads, patch_size=(16, 16)}; "S" omits patch_size.

  None gives {} so callers can always write `{**decode_variant(v), **explicit_kwargs}`
  (explicit kwargs win, as in big_vision's `Model(variant=..., **kw)`).
  """
  if variant is None:
    return {}
  name, sep, patch = variant.partition("/")
  if name not in VARIANTS:
    raise ValueError(
        f"unknown ViT variant {variant!r}: size {name!r} is not one of " f"{', '.join(VARIANTS)}"
    )
  width, depth, mlp_dim, num_heads = VARIANTS[name]
  out: dict[str, Any] = dict(width=width, depth=depth, mlp_dim=mlp_dim, num_heads=num_heads)
  if sep:
    if not patch.isdigit() or int(patch) <= 0:
      raise ValueError(
          f"bad ViT variant {variant!r}: patch size {patch!r} after '/' must "
          "be a positive integer, e.g. 'S/16'"
      )
    out["patch_size"] = (int(patch), int(patch))
  return out
