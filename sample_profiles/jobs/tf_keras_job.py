"""A small Keras 3 (TensorFlow backend) training job with the TF profiler server on, for capture tests.

Bottlenecks built in (choose with flags; the ground truth lives here, not in the tests):
- `--slow-map-ms MS`: every example passes through a Python `tf.py_function` that sleeps MS ms in a
  sequential `map` (Keras adds only its own small prefetch), so every step waits for input: INPUT-BOUND. The sleep shows up in a
  capture as `EagerPyFunc` inside `Iterator::...::Map` events.
- `--cache`: the mapped data are cached and prefetched, so after the first epoch the input costs ~0 and the
  step is spent in the model: COMPUTE-BOUND.
- neither flag: a plain sequential map, no cache (input and compute both visible, no sleep).
- `--tiny`: a model of a few hundred FLOPs on tiny batches, so per-step host overhead (Python, dispatch)
  dominates; compare `--steps-per-execution 1` (HOST-OVERHEAD-BOUND) with `--steps-per-execution 64`
  (the same work with the host loop amortised over 64 steps).

Usage: python tf_keras_job.py --port 6009 [--seconds 60] [--slow-map-ms 20] [--cache]
       [--steps-per-execution K] [--tiny]
Prints `READY` (flushed) once the profiler server is up and training steps are running, then trains until
`--seconds` have elapsed (or the process is killed).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")  # CPU job: never probe for GPUs


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True, help="profiler server port")
    parser.add_argument("--seconds", type=float, default=60.0, help="train this long, then exit")
    parser.add_argument("--slow-map-ms", type=float, default=0.0, help="sleep per example in the map (input-bound)")
    parser.add_argument("--cache", action="store_true", help="cache + prefetch the data (compute-bound)")
    parser.add_argument("--steps-per-execution", type=int, default=1)
    parser.add_argument("--tiny", action="store_true", help="tiny model: per-step host overhead dominates")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    import numpy as np
    import tensorflow as tf

    import keras

    tf.profiler.experimental.server.start(args.port)

    if args.tiny:
        features, hidden, classes, batch, examples = 4, 8, 2, 8, 512
    else:
        features, hidden, classes, batch, examples = 256, 512, 10, 64, 4096
    rng = np.random.default_rng(0)
    x = rng.standard_normal((examples, features), dtype=np.float32)
    y = rng.integers(0, classes, size=(examples,), dtype=np.int64)

    def slow_identity(features_, label):
        time.sleep(args.slow_map_ms / 1000.0)
        return features_, label

    def preprocess(features_, label):
        features_ = features_ * 2.0 - 1.0
        if args.slow_map_ms > 0:
            features_, label = tf.py_function(slow_identity, [features_, label], [tf.float32, tf.int64])
            features_.set_shape([features]); label.set_shape([])
        return features_, label

    data = tf.data.Dataset.from_tensor_slices((x, y)).map(preprocess)  # sequential: num_parallel_calls=None
    if args.cache:
        data = data.cache()
    data = data.repeat().batch(batch, drop_remainder=True)
    if args.cache:
        data = data.prefetch(tf.data.AUTOTUNE)

    model = keras.Sequential([
        keras.Input((features,)),
        keras.layers.Dense(hidden, activation="relu"),
        keras.layers.Dense(hidden, activation="relu"),
        keras.layers.Dense(classes),
    ])
    model.compile(
        optimizer=keras.optimizers.SGD(0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        steps_per_execution=args.steps_per_execution,
        jit_compile=False,  # CPU: XLA autoclustering adds nothing here and slows start-up
    )

    deadline = time.monotonic() + args.seconds

    class Heartbeat(keras.callbacks.Callback):
        """Say READY once real steps have run; stop when the time is up."""

        ready = False

        def on_train_batch_end(self, batch_index, logs=None):
            if not self.ready:
                print("READY", flush=True)
                self.ready = True
            if time.monotonic() >= deadline:
                self.model.stop_training = True

    model.fit(data, epochs=1, steps_per_epoch=10**9 // args.steps_per_execution * args.steps_per_execution,
              callbacks=[Heartbeat()], verbose=0, shuffle=False)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # A tf.data iterator that ran a tf.py_function can deadlock in interpreter shutdown (TF 2.21):
    # leave without running it.
    os._exit(code)
