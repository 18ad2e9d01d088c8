"""Turning a softmax teacher into a linear student: parameter surgery, copy the same
(`surgery`); the calibration that initialises fresh attention (`calibrate`); the distillation
losses (`distill`) and the distill stage's loss (`distill_stage`); the stage kinds (`stages`);
optimizers and LoRA (`optim`, `lora`); the stage runner (`train`) with its pure jitted step
(`train_step`), metrics drain (`stage_log`), checkpoints (`stage_outputs`) and Ctrl-C /
preemption handling (`preemption`). May import runtime, configuration, models and data; nothing
here evaluates, exports or drives a run.
"""
