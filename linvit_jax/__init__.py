"""linvit_jax: turn a pretrained softmax ViT into a linear-attention ViT.

"Copy the same, distill the difference": operator-agnostic weights are copied from the teacher,
attention sublayers are distilled on their outputs, then the whole student is fine-tuned.

  import linvit_jax
  student = linvit_jax.convert("teacher.npz", images="photos/", workdir="w")  # or a HF folder
  student = linvit_jax.convert("hf:facebook/dinov2-small", images="photos/", workdir="w2", res=224)
  student = linvit_jax.load_student("w")            # later, without TensorFlow
  features = student.encode(["photo.jpg"])

`help(linvit_jax.convert)` lists its options; a wrong one raises `linvit_jax.UserError`.

Importing the package imports neither JAX's training stack nor TensorFlow: the API loads lazily.
"""

from typing import Any

__version__ = "0.1.0"
__all__ = ["convert", "load_student", "load_config", "Student", "UserError", "OptionError"]


def __getattr__(name: str) -> Any:
  if name in __all__:
    from linvit_jax import api

    return getattr(api, name)
  raise AttributeError(f"module 'linvit_jax' has no attribute {name!r}")
