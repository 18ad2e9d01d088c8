"""Turning a softmax teacher into a linear student: parameter surgery (copy the same), the
calibration that initialises feature maps, the distillation losses, LoRA, optimizers, the jitted
train step and its stage runner, the stage kinds and Ctrl-C / preemption handling. May import
runtime, configuration, models and data; nothing here evaluates, exports or drives a run.
"""
