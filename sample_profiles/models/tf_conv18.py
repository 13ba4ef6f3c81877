"""A small TensorFlow conv net with 18 channels: `factory(batch_size)` -> (tf.function, TensorSpecs).

Its HLO as TensorFlow emits it for the CPU has no TPU layouts: the `tf_hlo_cpu` sample, for the
memory command's `--target` estimation mode.
"""

IMAGE = 64
CHANNELS = 18
CLASSES = 10


def factory(batch_size: int):
    import tensorflow as tf

    gen = tf.random.Generator.from_seed(0)
    w1 = tf.Variable(gen.normal((3, 3, 3, CHANNELS)) * 0.1)
    w2 = tf.Variable(gen.normal((3, 3, CHANNELS, CHANNELS)) * 0.1)
    dense = tf.Variable(gen.normal((CHANNELS, CLASSES)) * 0.1)
    variables = [w1, w2, dense]

    @tf.function(jit_compile=True)
    def train_step(images, labels):
        with tf.GradientTape() as tape:
            x = tf.nn.relu(tf.nn.conv2d(images, w1, 1, "SAME"))
            x = tf.nn.relu(tf.nn.conv2d(x, w2, 1, "SAME"))
            logits = tf.reduce_mean(x, axis=(1, 2)) @ dense
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))
        for variable, gradient in zip(variables, tape.gradient(loss, variables)):
            variable.assign_sub(0.01 * gradient)
        return loss

    specs = [tf.TensorSpec((batch_size, IMAGE, IMAGE, 3), tf.float32), tf.TensorSpec((batch_size,), tf.int32)]
    return train_step, specs
