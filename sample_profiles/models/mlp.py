"""A per-token JAX MLP regressor (x: [batch, 128 tokens, 1024]) as one SGD training step.

Only matmuls and elementwise ops, so it compiles in about a second at any batch size; per example it
keeps a few MiB of activations for the backward pass, so on v5e the largest batch that fits is a few
thousand. `factory(batch_size, dtype)` for `tpuprof preflight`; `too_large(batch_size)` has four
32768 x 32768 f32 layers (16 GiB of weights), more than any v5e chip holds at any batch size.
"""

TOKENS = 128
FEATURES = 1024
HIDDEN = 2048
LAYERS = 3


def _step(params, x, y):
    import jax
    import jax.numpy as jnp

    def loss_fn(params):
        h = x
        for w in params[:-1]:
            h = jax.nn.relu(h @ w)
        return jnp.mean((h @ params[-1] - y).astype(jnp.float32) ** 2)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    return [p - (0.01 * g).astype(p.dtype) for p, g in zip(params, grads)], loss


def _build(batch_size, features, hidden, layers, dtype, tokens=TOKENS):
    import jax
    import jax.numpy as jnp

    dtype = jnp.dtype(dtype)
    sizes = [features] + [hidden] * layers + [1]
    params = [jax.ShapeDtypeStruct((a, b), dtype) for a, b in zip(sizes[:-1], sizes[1:])]
    x = jax.ShapeDtypeStruct((batch_size, tokens, features), dtype)
    y = jax.ShapeDtypeStruct((batch_size, tokens, 1), dtype)
    return _step, (params, x, y)


def factory(batch_size: int, dtype: str = "float32"):
    return _build(batch_size, FEATURES, HIDDEN, LAYERS, dtype)


def too_large(batch_size: int):
    return _build(batch_size, 32768, 32768, 4, "float32", tokens=1)
