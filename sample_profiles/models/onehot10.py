"""An MLP classifier whose loss takes a one-hot of 10 classes, as one SGD training step.

`one_hot(labels, 10)` makes [batch, 10] buffers. Written row-major, 10 classes would tile to 128 lanes;
libtpu 0.0.42.1 instead lays them out {0,1} (batch minor), so the 10 classes are the second-minor dim
and tile to 16 (1.6x). The sample dump shows what the compiler really did. `factory(batch_size, dtype)`.
"""

FEATURES = 256
HIDDEN = 512
CLASSES = 10


def loss_fn(params, x, labels):
    import jax
    import jax.numpy as jnp

    h = jax.nn.relu(x @ params["w1"])
    logits = h @ params["w2"]
    one_hot = jax.nn.one_hot(labels, CLASSES, dtype=logits.dtype)
    # The one-hot is used twice (loss and accuracy-style weighting) so XLA materialises it.
    weights = 1.0 + one_hot.sum(axis=0, keepdims=True)
    return -(one_hot * jax.nn.log_softmax(logits) * weights).sum() / x.shape[0]


def train_step(params, x, labels):
    import jax

    loss, grads = jax.value_and_grad(loss_fn)(params, x, labels)
    params = jax.tree_util.tree_map(lambda p, g: p - 0.01 * g, params, grads)
    return params, loss


def factory(batch_size: int, dtype: str = "float32"):
    import jax
    import jax.numpy as jnp

    dtype = jnp.dtype(dtype)
    params = {
        "w1": jax.ShapeDtypeStruct((FEATURES, HIDDEN), dtype),
        "w2": jax.ShapeDtypeStruct((HIDDEN, CLASSES), dtype),
    }
    x = jax.ShapeDtypeStruct((batch_size, FEATURES), dtype)
    labels = jax.ShapeDtypeStruct((batch_size,), jnp.int32)
    return train_step, (params, x, labels)
