"""linvit_jax: turn a pretrained softmax ViT into a linear-attention ViT.

"Copy the same, distill the difference": operator-agnostic weights are copied from the teacher,
attention sublayers are distilled on their outputs, then the whole student is fine-tuned.
"""

__version__ = "0.1.0"
