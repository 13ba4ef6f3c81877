"""A JAX training loop that recompiles every step, for the `jax_recompile` sample capture.

Bottleneck built in: the batch grows by one example every step, so the jitted step sees a new input
shape each time and JAX traces and compiles it again: COMPILE-BOUND. The loader is free (no sleep).
(sample_profiles/jobs/ has no such mode; this job lives beside the capture it made.)

Usage: python job.py --port 6011 [--seconds 60]; prints READY once the profiler server is up and a step ran.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args(argv)
    import jax
    import jax.numpy as jnp
    import numpy as np

    jax.profiler.start_server(args.port)

    @jax.jit
    def train_step(w, x):
        loss, grad = jax.value_and_grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)
        return w - 0.01 * grad, loss

    w = jnp.ones((256, 256)) * 0.01
    deadline = time.monotonic() + args.seconds
    step = 0
    while time.monotonic() < deadline:
        x = np.ones((64 + step, 256), np.float32)  # a new batch size, so a new shape, every step
        with jax.profiler.StepTraceAnnotation("train", step_num=step):
            w, loss = train_step(w, x)
            loss.block_until_ready()
        if step == 0:
            print("READY", flush=True)
        step += 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
