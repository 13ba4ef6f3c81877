"""A Keras (TensorFlow backend) MLP classifier: `factory(batch_size)` -> (compiled model, x spec, y spec).

tpuprof builds and compiles its train step (forward, loss, gradients, Adam update) for the TPU.
"""

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

FEATURES = 784
HIDDEN = 1000  # not a multiple of 128: the padding shows in the dump
CLASSES = 10


def factory(batch_size: int):
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((FEATURES,)),
        keras.layers.Dense(HIDDEN, activation="relu"),
        keras.layers.Dense(HIDDEN, activation="relu"),
        keras.layers.Dense(CLASSES),
    ])
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x_spec = tf.TensorSpec((batch_size, FEATURES), tf.float32)
    y_spec = tf.TensorSpec((batch_size,), tf.int32)
    return model, x_spec, y_spec


def tokens(batch_size: int):
    """A per-token Keras classifier over [batch, 128, 512] inputs: a few MiB of activations per
    example, so the largest batch that fits on one v5e chip is in the thousands."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((128, 512)),
        keras.layers.Dense(2048, activation="relu"),
        keras.layers.Dense(2048, activation="relu"),
        keras.layers.Dense(CLASSES),
    ])
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model, tf.TensorSpec((batch_size, 128, 512), tf.float32), tf.TensorSpec((batch_size, 128), tf.int32)
