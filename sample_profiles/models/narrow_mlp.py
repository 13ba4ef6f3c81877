"""mlp.py's training step with 256-wide layers over 1,024 tokens (x: [batch, 1024, 256]).

About as much activation memory per example as mlp.py's `factory` (the largest batch on v5e is about 4,900), at
a third of its compile time: libtpu's code generation grows with the matmuls' width, not with the batch (2-2.5 s
here against about 6 s for 1024-wide layers on this project's 2-core machine). What the test suite's max-batch
searches compile.
"""

from mlp import LAYERS, _build


def factory(batch_size: int, dtype: str = "float32"):
    return _build(batch_size, 256, 256, LAYERS, dtype, tokens=1024)
