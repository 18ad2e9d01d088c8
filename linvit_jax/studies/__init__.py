"""Entry points for experiments beyond one conversion: the ablation (which parts of a teacher
are worth copying, one arm per start) and the token-count study over ablations, which run whole
conversions through the driver (`linvit_jax.run`); and the compounding study (per layer, how much
of an exported student's final gap to its teacher that layer's attention causes), which reads an
export as `linvit_jax.compare` does. They draw through `evaluation.plots`: the top floor,
imported by nothing in the library.
"""
