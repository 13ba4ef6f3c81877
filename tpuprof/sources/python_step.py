"""The user's training step given as Python objects (the API's `tpuprof.preflight(fn_or_model, *args)`), turned
into the same `tpu_compile.Spec` as a `file.py:factory` text: a JAX function and its example arguments, a
compiled Keras model with example inputs and labels, or a factory `f(batch_size)`.
"""

from __future__ import annotations

from tpuprof.errors import UserError


def spec_from_objects(value, example_args: tuple):
    """A SPEC for `tpuprof.preflight(...)` called with objects instead of `file.py:factory`:

    - a JAX function (jitted or not) and its example arguments (arrays or jax.ShapeDtypeStructs);
    - a compiled Keras model (TensorFlow backend) and example inputs and labels (arrays or tf.TensorSpecs);
    - a factory `f(batch_size)` returning either of those (or a tf.function and its TensorSpecs), as in a file.

    Another batch size than the example's is made by changing the leading dimension of the batch: the
    arguments every array of which has the same leading dimension as the last argument (inputs and labels);
    the others (parameters, optimizer state) stay as given. Where a parameter shares that leading dimension (a
    hidden size equal to the batch), the function is traced to tell them apart (_jax_factory).
    """
    import inspect

    from tpuprof.sources import tpu_compile

    name = getattr(value, "__name__", None) or type(value).__name__
    if tpu_compile.is_keras_model(value):
        if len(example_args) != 2:
            raise UserError("preflight of a Keras model takes the model, example inputs and example labels: "
                            "tpuprof.preflight(model, x, y, tpu=...).")
        factory, example_batch, digest = _keras_factory(value, *example_args)
        name = getattr(value, "name", None) or name
    elif example_args:
        if not callable(value):
            raise UserError(f"preflight takes a JAX function or a Keras model, not a {type(value).__name__}.")
        factory, example_batch, digest, batch_from = _jax_factory(value, example_args)
        return tpu_compile.Spec(name, None, name, factory, digest, False, False, batch_from=batch_from), example_batch
    elif callable(value):  # a factory, as in file.py:factory
        try:
            parameters = inspect.signature(value).parameters
        except (TypeError, ValueError):
            parameters = {}
        digest = _file_digest(value)
        return tpu_compile.Spec(name, None, name, value, digest, "dtype" in parameters, "mesh" in parameters), None
    else:
        raise UserError(f"preflight takes a file.py:factory text, a JAX function and its example arguments, a Keras "
                        f"model with example inputs and labels, or a factory; not a {type(value).__name__}.")
    return tpu_compile.Spec(name, None, name, factory, digest, False, False), example_batch


def _batch_words(leaves_of: list, batched: list[bool]) -> str | None:
    """Which example arguments are taken to lead with the batch, in words: a time-major input leads with its
    sequence, which tpuprof cannot tell apart from a batch."""
    shapes = ", ".join(f"{i} ({'x'.join(map(str, leaves[0].shape))})"
                       for i, (leaves, lead) in enumerate(zip(leaves_of, batched), 1) if lead)
    if not shapes:
        return None
    return (f"the leading dimension of example argument(s) {shapes}, taken as the batch (examples/s and cost "
            "count it: arrays whose batch is not their first dimension are not counted right)")


def _batch_dim(leaves) -> int | None:
    dims = {tuple(leaf.shape)[0] for leaf in leaves if len(getattr(leaf, "shape", ())) >= 1}
    return dims.pop() if len(dims) == 1 else None


def _jax_factory(fn, args: tuple):
    import jax

    leaves_of = [jax.tree_util.tree_leaves(arg) for arg in args]
    example_batch = _batch_dim(leaves_of[-1])
    batched = [example_batch is not None and bool(leaves) and _batch_dim(leaves) == example_batch
               and all(len(getattr(leaf, "shape", ())) >= 1 for leaf in leaves) for leaves in leaves_of]

    def resize(leaf, batch_size):
        return jax.ShapeDtypeStruct((batch_size, *tuple(leaf.shape)[1:]), leaf.dtype)

    def resized(batch_size: int, scaled_args: list[bool]) -> list:
        return [jax.tree_util.tree_map(lambda leaf: resize(leaf, batch_size), arg) if scaled else arg
                for arg, scaled in zip(args, scaled_args)]

    chosen: list[list[bool]] = []

    def factory(batch_size: int):
        if batch_size == example_batch or example_batch is None:
            return fn, list(args)
        if not chosen:
            chosen.append(_scaled_that_trace(fn, batched, lambda scaled: resized(batch_size, scaled)))
        return fn, resized(batch_size, chosen[0])

    try:  # the program's own text at the example shapes: a changed function or shape is another program
        abstract = [jax.tree_util.tree_map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype), arg)
                    for arg in args]
        jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
        text = jitted.lower(*abstract).as_text()
        digest = _hash(text, [scaled for scaled in batched])
    except Exception:  # noqa: BLE001 - no stable key: compile without reusing the cache
        digest = _unique()
    return factory, example_batch, digest, _batch_words(leaves_of, batched)


def _scaled_that_trace(fn, batched: list[bool], resized) -> list[bool]:
    """Which arguments to resize: all that lead with the batch, unless the function then fails to trace (a
    parameter whose leading dimension is a hidden size equal to the batch, resized with the inputs); then fewer,
    from the front (parameters come before inputs and labels), until it traces. Tracing is the program's own
    check of the shapes, and costs no compile."""
    import jax

    candidates = [i for i, scaled in enumerate(batched) if scaled]
    choices = [[i in candidates[k:] for i in range(len(batched))] for k in range(len(candidates))]
    for choice in choices:
        try:
            jax.eval_shape(fn, *resized(choice))
        except Exception:  # noqa: BLE001 - the user's function rejects these shapes: try the next choice
            continue
        return choice
    return batched  # none traces: the compile reports the function's own error


def _keras_factory(model, x, y):
    from tpuprof.errors import import_tensorflow
    from tpuprof.sources.tpu_compile import _is_tensor_spec

    tf = import_tensorflow("Preflight of a Keras model")  # its train step is traced as a tf.function

    def spec(value):
        if _is_tensor_spec(value):
            return value
        return tf.TensorSpec(tuple(value.shape), tf.as_dtype(value.dtype))

    x_spec, y_spec = spec(x), spec(y)
    example_batch = x_spec.shape[0]

    def factory(batch_size: int):
        return (model, tf.TensorSpec((batch_size, *x_spec.shape[1:]), x_spec.dtype),
                tf.TensorSpec((batch_size, *y_spec.shape[1:]), y_spec.dtype))

    try:
        import json

        optimizer = getattr(model, "optimizer", None)
        config = json.dumps([model.to_json(), optimizer.get_config() if optimizer else None, repr(model.loss),
                             str(x_spec.dtype), list(x_spec.shape[1:]), str(y_spec.dtype), list(y_spec.shape[1:])],
                            default=str)
        digest = _hash(config)
    except Exception:  # noqa: BLE001 - no stable key: compile without reusing the cache
        digest = _unique()
    return factory, example_batch, digest


def _file_digest(function) -> str:
    """A factory's cache key, as for `file.py:factory`: the hash of the file that defines it. A factory
    defined where no file holds it (a notebook cell) gets a key of its own: it is compiled afresh."""
    import hashlib
    import inspect

    try:
        return hashlib.sha256(open(inspect.getsourcefile(function), "rb").read()).hexdigest()
    except (OSError, TypeError):
        return _unique()


def _hash(*parts) -> str:
    import hashlib
    import json

    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()


def _unique() -> str:
    import uuid

    return uuid.uuid4().hex
