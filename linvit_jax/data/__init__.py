"""Input data: TFDS / embedded / JFT-style datasets, big_vision-style preprocessing strings.

input_pipeline.py  make_train_iterator, make_eval_iterator, num_examples (the entry points)
preprocess.py      get_preprocess_fn(pp_string), the op registry (`register`)
ops_image.py, ops_general.py, jft.py (multi_hot)   the ops
fashion_mnist.py   the embedded Fashion-MNIST as local TFDS dataset `fashion_mnist_local`
jft.py             JFT-style TFRecords: reader, writer, counts
inference_pp.py    an exported student's eval pp in PIL + numpy (no TensorFlow)

May import runtime only: no config schema, no model, no trainer.
"""
