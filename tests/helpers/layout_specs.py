"""Specs that pickle, for compiles in a child process (tpu_compile.compile_until_layout): the child rebuilds the
program from the spec's name."""

from __future__ import annotations


class SortedProducts:
    """sum(sort(x @ x.T)) for x of [batch, 128] float32: the [batch, batch] product is a temporary the sort
    needs whole, so a large batch needs more HBM than a chip has and a small one compiles in seconds."""

    text = "tests.helpers.layout_specs:SortedProducts"

    def program(self, batch: int, dtype=None, target=None):
        import jax
        import jax.numpy as jnp

        from tpuprof.sources import tpu_compile

        def sorted_products(x):
            return jnp.sort(x @ x.T, axis=0).sum(axis=0)

        return tpu_compile.Program("jax", (sorted_products, [jax.ShapeDtypeStruct((batch, 128), jnp.float32)]),
                                   self.text)


class Doubled:
    """x * 2 with x donated: its output reuses the argument's buffer (an alias), in a second-long compile."""

    text = "tests.helpers.layout_specs:Doubled"

    def program(self, batch: int, dtype=None, target=None):
        import jax
        import jax.numpy as jnp

        from tpuprof.sources import tpu_compile

        doubled = jax.jit(lambda x: x * 2, donate_argnums=0)
        return tpu_compile.Program("jax", (doubled, [jax.ShapeDtypeStruct((batch, 1024), jnp.float32)]), self.text)


class Refuses:
    """A factory that rejects the batch: the child's UserError comes back as the parent's."""

    text = "tests.helpers.layout_specs:Refuses"

    def program(self, batch: int, dtype=None, target=None):
        from tpuprof.errors import UserError

        raise UserError(f"the factory takes no batch of {batch}.")


class SaysItsSettings:
    """A factory that refuses with what its compile process was started with: an environment variable of the
    parent's (TPUPROF_TEST_MARK) and a setting JAX reads from the environment when it is imported."""

    text = "tests.helpers.layout_specs:SaysItsSettings"

    def program(self, batch: int, dtype=None, target=None):
        import os

        import jax

        from tpuprof.errors import UserError

        raise UserError(f"mark {os.environ.get('TPUPROF_TEST_MARK')}, precision "
                        f"{jax.config.jax_default_matmul_precision}, compiled in {os.getpid()} of {os.getppid()}")
