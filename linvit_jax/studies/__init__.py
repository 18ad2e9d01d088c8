"""Entry points for experiments beyond one conversion: the ablation (which parts of a teacher
are worth copying, one arm per start) and the token-count study over ablations. They run whole
conversions through the driver (`linvit_jax.run`) and draw through `evaluation.plots`: the top
floor, imported by nothing in the library.
"""
