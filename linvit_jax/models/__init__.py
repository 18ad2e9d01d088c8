"""The ViT and what it is read from: the Flax model (`vit`) with its softmax and kernelized linear
attentions (`attention`: the spec and the module; `attention_ops`: the operators; `exact_set`:
the window / sinks hybrid; `feature_maps`, `variants`), per-layer reads of a forward (`probe`),
big_vision's params checkpoints (`checkpoints`, `vit_checkpoint`, `layout`), position tables
resized as each framework does (`posemb`), timm / Hugging Face weights (`foreign`: the entry;
`foreign_files`, `foreign_layout`, `foreign_hf`, `foreign_timm`; `hub`, `import_weights`) and one
read of a checkpoint (`checkpoint_record`).
May import runtime only: no config schema, no data, no trainer.
"""
