"""The machine and the file system, below everything else: user-facing errors (`errors`), local
and gs:// files (`gfile`), '/'-joined parameter paths (`tree`), the device mesh and shardings
(`sharding`), multi-process start-up (`distributed`), metrics writers (`metrics`), progress
bars for long work outside the training loop (`progress`), JAX's compilation cache and
TensorFlow's quiet import.
Imports no other part of linvit_jax.
"""
