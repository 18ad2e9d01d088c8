"""The ViT and what it is read from: the Flax model (`vit`) with its softmax and kernelized linear
attentions (`attention`, `feature_maps`, `variants`), per-layer reads of a forward (`probe`),
big_vision's params checkpoints (`checkpoints`, `vit_checkpoint`, `layout`), timm / Hugging Face
weights (`foreign`, `hub`, `import_weights`) and one read of a checkpoint (`checkpoint_record`).
May import runtime only: no config schema, no data, no trainer.
"""
