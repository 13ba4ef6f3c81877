"""A small NHWC conv net whose convolutions have 18 output channels, as one SGD training step.

18 channels in the minor (lane) dimension pad to 128 on a TPU: the activations take ~7x their
unpadded size, which is what the sample dump `conv18_f32_v5e` shows. `factory(batch_size, dtype)`
returns (step function, example arguments) for `tpuprof preflight`.
"""

IMAGE = 64
CHANNELS = 18
CLASSES = 10


def init_params(dtype):
    import jax
    import jax.numpy as jnp

    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
    return {
        "conv1": jax.random.normal(k1, (3, 3, 3, CHANNELS), dtype) * 0.1,  # HWIO
        "conv2": jax.random.normal(k2, (3, 3, CHANNELS, CHANNELS), dtype) * 0.1,
        "dense": jax.random.normal(k3, (CHANNELS, CLASSES), dtype) * 0.1,
    }


def loss_fn(params, images, labels):
    import jax
    import jax.numpy as jnp

    def conv(x, w):
        return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))

    x = jax.nn.relu(conv(images, params["conv1"]))
    x = jax.nn.relu(conv(x, params["conv2"]))
    logits = x.mean(axis=(1, 2)) @ params["dense"]
    logp = jax.nn.log_softmax(logits.astype(jnp.float32))
    return -jnp.take_along_axis(logp, labels[:, None], axis=1).mean()


def train_step(params, images, labels):
    import jax

    loss, grads = jax.value_and_grad(loss_fn)(params, images, labels)
    params = jax.tree_util.tree_map(lambda p, g: p - 0.01 * g, params, grads)
    return params, loss


def factory(batch_size: int, dtype: str = "float32"):
    import jax
    import jax.numpy as jnp

    dtype = jnp.dtype(dtype)
    params = jax.eval_shape(lambda: init_params(dtype))
    images = jax.ShapeDtypeStruct((batch_size, IMAGE, IMAGE, 3), dtype)
    labels = jax.ShapeDtypeStruct((batch_size,), jnp.int32)
    return train_step, (params, images, labels)
