"""An int8 x int8 -> int32 matmul with odd dimensions.

int8 arrays tile as (32,128) with (4,1) packing on a TPU: 1000 x 300 rounds up to 1024 x 384 and
300 x 77 to 320 x 128, so the padding is visible. `factory(batch_size)` uses the batch as rows.
"""

K = 300
N = 77


def matmul(a, b):
    import jax
    import jax.numpy as jnp

    return jax.lax.dot_general(a, b, (((1,), (0,)), ((), ())), preferred_element_type=jnp.int32)


def factory(batch_size: int = 1000):
    import jax
    import jax.numpy as jnp

    a = jax.ShapeDtypeStruct((batch_size, K), jnp.int8)
    b = jax.ShapeDtypeStruct((K, N), jnp.int8)
    return matmul, (a, b)
