"""Entry points for experiments beyond one conversion: the ablation (which parts of a teacher
are worth copying, one arm per start) and the token-count study over ablations, which run whole
conversions through the driver (`linvit_jax.run`); and the compounding study (per layer, how much
of an exported student's final gap to its teacher that layer's attention causes), which reads an
export as `linvit_jax.compare` does; and the window-share study (per layer and resolution, the
teacher's softmax mass on the key set a window / sinks student treats exactly, beside the
student's share of it), which reads a teacher alone or with such an export. `study_cli` holds
what their command lines share. They draw through `evaluation.plots`: the top floor, imported by
nothing in the library.
"""
