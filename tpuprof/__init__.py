"""tpuprof: will my model fit in TPU HBM, why not, and why is my step slow."""

__version__ = "0.1.0"
