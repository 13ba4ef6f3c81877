"""Transformer blocks (multi-head attention + MLP, pre-LayerNorm) as one SGD training step.

`factory(batch_size, dtype)` is one bfloat16 block (the `transformer_bf16_v6e` sample);
`build(batch_size, layers=..., ...)` makes deeper stacks (the 48-layer benchmark module). Layers are
unrolled in Python, not scanned, so every layer has its own instructions as in many real models.
"""

D_MODEL = 512
HEADS = 8
SEQ = 512
MLP = 4 * D_MODEL


def init_shapes(layers, d_model, mlp, dtype):
    import jax

    def layer():
        return {
            "ln1": jax.ShapeDtypeStruct((d_model,), dtype),
            "qkv": jax.ShapeDtypeStruct((d_model, 3 * d_model), dtype),
            "out": jax.ShapeDtypeStruct((d_model, d_model), dtype),
            "ln2": jax.ShapeDtypeStruct((d_model,), dtype),
            "up": jax.ShapeDtypeStruct((d_model, mlp), dtype),
            "down": jax.ShapeDtypeStruct((mlp, d_model), dtype),
        }

    return [layer() for _ in range(layers)]


def _layer_norm(x, scale):
    import jax.numpy as jnp

    x32 = x.astype(jnp.float32)
    mean = x32.mean(-1, keepdims=True)
    var = ((x32 - mean) ** 2).mean(-1, keepdims=True)
    return ((x32 - mean) * (var + 1e-6) ** -0.5).astype(x.dtype) * scale


def block(p, x, heads):
    import jax
    import jax.numpy as jnp

    b, s, d = x.shape
    h = _layer_norm(x, p["ln1"])
    q, k, v = jnp.split(h @ p["qkv"], 3, axis=-1)
    q, k, v = (t.reshape(b, s, heads, d // heads) for t in (q, k, v))
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k).astype(jnp.float32) / (d // heads) ** 0.5
    mask = jnp.tril(jnp.ones((s, s), bool))
    weights = jax.nn.softmax(jnp.where(mask, scores, -1e9), axis=-1).astype(x.dtype)
    attention = jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(b, s, d)
    x = x + attention @ p["out"]
    h = _layer_norm(x, p["ln2"])
    return x + jax.nn.gelu(h @ p["up"]) @ p["down"]


def make_step(heads):
    import jax
    import jax.numpy as jnp

    def loss_fn(params, x, target):
        for p in params:
            x = block(p, x, heads)
        return jnp.mean((x.astype(jnp.float32) - target.astype(jnp.float32)) ** 2)

    def train_step(params, x, target):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, target)
        params = jax.tree_util.tree_map(lambda p, g: p - (0.01 * g).astype(p.dtype), params, grads)
        return params, loss

    return train_step


def build(batch_size, layers=1, d_model=D_MODEL, heads=HEADS, seq=SEQ, mlp=None, dtype="bfloat16"):
    import jax
    import jax.numpy as jnp

    dtype = jnp.dtype(dtype)
    params = init_shapes(layers, d_model, mlp or 4 * d_model, dtype)
    x = jax.ShapeDtypeStruct((batch_size, seq, d_model), dtype)
    return make_step(heads), (params, x, x)


def factory(batch_size: int, dtype: str = "bfloat16"):
    return build(batch_size, dtype=dtype)
