"""A small JAX training loop with the JAX profiler server on, for capture tests.

Bottleneck built in (the ground truth lives here, not in the tests):
- `--slow-loader-ms MS`: the batches come from a plain Python loader that sleeps MS ms per batch before
  handing it over, so the device waits for input every step: INPUT-BOUND. In a capture the sleep is a gap
  with no events inside each `train` step annotation, before the jitted step runs.
- `--slow-loader-ms 0` (default): the loader is free and the jitted step (a 3-layer MLP, forward + backward
  + SGD update) fills the step: COMPUTE-BOUND.

- `--new-shape-every-step`: the batch grows by one example every step, so the jitted step sees a new
  input shape each time and JAX traces and compiles it again: COMPILE-BOUND (the loader is free).

- `--idle`: the profiler server starts and no step ever runs: a capture collects no trace event (the
  "job idle / between steps" case a capture tool must explain).

Every step is wrapped in `jax.profiler.StepTraceAnnotation("train", step_num=i)`, which is how XProf and
tpuprof find step boundaries in a JAX capture; `--no-step-annotation` leaves it out, as many training loops do
(the steps are then the jitted step's calls), with the same bottleneck.

Usage: python jax_job.py --port 6010 [--seconds 60] [--slow-loader-ms 20 | --new-shape-every-step | --idle]
Prints `READY` (flushed) once the profiler server is up and training steps are running, then trains until
`--seconds` have elapsed (or the process is killed).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # a CPU job: never initialise libtpu here
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True, help="profiler server port")
    parser.add_argument("--seconds", type=float, default=60.0, help="train this long, then exit")
    parser.add_argument("--slow-loader-ms", type=float, default=0.0, help="sleep per batch in the loader (input-bound)")
    parser.add_argument("--new-shape-every-step", action="store_true",
                        help="grow the batch by one example per step: a compilation every step (compile-bound)")
    parser.add_argument("--idle", action="store_true", help="start the profiler server, then never train")
    parser.add_argument("--no-step-annotation", action="store_true",
                        help="no StepTraceAnnotation around the steps (the bottleneck stays the same)")
    return parser.parse_args(argv)


def loader(batch, features, classes, sleep_ms):
    """An endless host-side loader; the sleep stands in for slow decoding / augmentation in Python."""
    import numpy as np

    rng = np.random.default_rng(0)
    pool_x = rng.standard_normal((16, batch, features), dtype=np.float32)
    pool_y = rng.integers(0, classes, size=(16, batch), dtype=np.int32)
    i = 0
    while True:
        if sleep_ms > 0:
            time.sleep(sleep_ms / 1000.0)
        yield pool_x[i % 16], pool_y[i % 16]
        i += 1


def main(argv=None) -> int:
    args = parse_args(argv)
    import jax
    import jax.numpy as jnp

    jax.profiler.start_server(args.port)
    if args.idle:
        print("READY", flush=True)
        time.sleep(args.seconds)
        return 0

    features, hidden, classes, batch = 256, 512, 10, 128
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    params = [
        (jax.random.normal(keys[0], (features, hidden)) * 0.05, jnp.zeros(hidden)),
        (jax.random.normal(keys[1], (hidden, hidden)) * 0.05, jnp.zeros(hidden)),
        (jax.random.normal(keys[2], (hidden, classes)) * 0.05, jnp.zeros(classes)),
    ]

    def loss_fn(params, x, y):
        for w, b in params[:-1]:
            x = jax.nn.relu(x @ w + b)
        w, b = params[-1]
        logits = x @ w + b
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1))

    @jax.jit
    def train_step(params, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads), loss

    deadline = time.monotonic() + args.seconds
    batches = loader(batch, features, classes, args.slow_loader_ms)
    step = 0
    while time.monotonic() < deadline:
        annotation = contextlib.nullcontext() if args.no_step_annotation else \
            jax.profiler.StepTraceAnnotation("train", step_num=step)
        with annotation:
            x, y = next(batches)
            if args.new_shape_every_step:  # one more example each step: a shape jit has not seen yet
                x = jnp.concatenate([x, x[: step % batch + 1]])[: batch + step]
                y = jnp.concatenate([y, y[: step % batch + 1]])[: batch + step]
            params, loss = train_step(params, x, y)
            loss.block_until_ready()  # the step ends when the device is done, as in a real loop
        if step == 0:
            print("READY", flush=True)
        step += 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
