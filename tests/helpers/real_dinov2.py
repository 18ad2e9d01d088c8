"""The real DINOv2-S/14 checkpoint in big_vision's layout, kept beside the checkout (it is too large
to ship): its path and architecture, for the tests that run on it and skip without it."""

from __future__ import annotations

import os

from tests.helpers import tiny_teacher

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The checkpoint is PATH + ".npz"; PATH + ".ref.npz" holds big_vision's outputs on a few images.
PATH = os.path.join(ROOT, "..", "shared", "fixtures", "real", "dinov2s14_focus_bv")
NPZ = PATH + ".npz"
# Its big_vision ViT fields: headless, with a cls token and a learned position table like the tiny
# teacher the convert_folder tests write, at ViT-S/14's size.
FIELDS = dict(
    tiny_teacher.TINY, patch_size=(14, 14), width=384, depth=12, mlp_dim=1536, num_heads=6
)
