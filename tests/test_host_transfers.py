"""A step that offloads activations pays for copying them to the host and back: the copies libtpu schedules
(async-start/async-done around a dynamic-update-slice into, or a dynamic-slice out of, a host-memory S(5) stack)
are counted byte for byte, timed at the host link's bandwidth and overlapped with the compute between start and
done (tpuprof.analyses.collectives.communication).

One real compile: a tiny Llama of 4 scanned layers with `--remat offload` on v6e-4 (each layer's input and q/k/v
kept on the host), served from the session's compile cache.
"""

from __future__ import annotations

import json
import re

import pytest

from conftest import run_cli

LAYERS, BATCH, SEQ = 4, 2, 256
TINY = {"model_type": "llama", "vocab_size": 1024, "hidden_size": 256, "intermediate_size": 512,
        "num_hidden_layers": LAYERS, "num_attention_heads": 4, "num_key_value_heads": 2}
ARGS = ("--tpu", "v6e-4", "--seq", str(SEQ), "--batch-per-chip", str(BATCH), "--remat", "offload")


def offloaded_bytes() -> int:
    """What the program's host stacks hold, built from the model: per layer its input (hidden) and q, k, v
    (heads x head_dim, 2 x kv heads x head_dim) for every token of this device's sequences, bf16."""
    head_dim = TINY["hidden_size"] // TINY["num_attention_heads"]
    per_token = TINY["hidden_size"] + (TINY["num_attention_heads"] + 2 * TINY["num_key_value_heads"]) * head_dim
    return LAYERS * BATCH * SEQ * per_token * 2


@pytest.fixture(scope="module")
def offload_target(compile_cache, tmp_path_factory):
    folder = tmp_path_factory.mktemp("offload")
    (folder / "config.json").write_text(json.dumps(TINY))
    result = run_cli("preflight", "--model", folder / "config.json", *ARGS, "--json", timeout=900,
                     env={"XDG_CACHE_HOME": str(compile_cache)})
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    from test_schemas import validate

    validate(document)
    return document["targets"][0], folder


def test_every_offloaded_byte_goes_out_and_comes_back_once_per_step(offload_target):
    target, _ = offload_target
    host = target["estimate"]["host_transfers"]
    assert offloaded_bytes() == 3 * 2**20
    assert host["to_host_bytes"] == offloaded_bytes() == target["host_bytes"]
    assert host["from_host_bytes"] == offloaded_bytes()
    assert host["copies"] == 2 * LAYERS * 4  # four arrays per layer, out in the forward pass, back in the backward
    assert "32 GB/s" in host["method"] and "estimated" in host["method"] and "scaling book" in host["method"]


def test_the_copies_take_their_bytes_over_the_host_link_and_the_step_pays_what_compute_does_not_hide(offload_target):
    target, _ = offload_target
    estimate = target["estimate"]
    host = estimate["host_transfers"]
    link = 32e9  # v6e: the JAX scaling book's PCIe figure per chip (tpuprof.targets), one device per chip
    assert host["ms"] == pytest.approx(2 * offloaded_bytes() / link * 1e3, rel=1e-3)
    assert 0 <= host["exposed_ms"] <= host["ms"]
    # The point and the band's low end add the exposed part, the high end all of it.
    assert estimate["step_ms"] == pytest.approx(
        estimate["compute_ms"] + estimate["exposed_collective_ms"] + host["exposed_ms"], abs=2e-4)
    assert estimate["step_ms_high"] - estimate["step_ms_low"] >= host["ms"] - host["exposed_ms"] - 2e-4


def test_a_generation_without_a_published_host_link_counts_the_bytes_and_says_they_are_not_timed(offload_target):
    from tpuprof.analyses import step_estimate
    from tpuprof.analyses.collectives import TO_HOST
    from tpuprof.documents_preflight import _host_transfers, not_modelled

    target, _ = offload_target
    cost = step_estimate.load(target["dump_dir"])
    untimed = step_estimate.estimate(cost, "tpu7x")
    assert untimed.communication.host_bytes(TO_HOST) == offloaded_bytes()
    assert untimed.host_s == 0 and untimed.exposed_host_s == 0
    host = _host_transfers(untimed)["host_transfers"]
    assert host["ms"] is None and host["exposed_ms"] is None and host["method"].startswith("not timed")
    # ... and the step's list of what it does not time names them (the table's "not timed" warnings read it).
    assert not_modelled(untimed)[0] == f"{2 * LAYERS * 4} copies between HBM and the host (no host link bandwidth " \
                                       "published for tpu7x)"
    assert not any("copies between HBM" in line for line in not_modelled(step_estimate.estimate(cost, "v6e")))
    # v5e, v5p and v4 take the scaling book's typical 16 GB/s per chip.
    assert step_estimate.estimate(cost, "v5e").host_s == pytest.approx(2 * offloaded_bytes() / 16e9)


def test_the_table_shows_the_host_transfers(offload_target, compile_cache):
    _, folder = offload_target
    table = run_cli("preflight", "--model", folder / "config.json", *ARGS, timeout=900,
                    env={"XDG_CACHE_HOME": str(compile_cache), "COLUMNS": "200"})
    assert table.returncode == 0, table.stderr
    assert re.search(r"host transfers \(exposed\)\s+\S+ ms \(\S+ ms\): 3\.00 MiB out, 3\.00 MiB back", table.stdout), \
        table.stdout


@pytest.fixture(scope="module")
def copied_to_the_host(tmp_path_factory):
    """jax.device_put to pinned host memory and back inside one jit on v6e:2x2: XLA's copy-start/copy-done
    between HBM and S(5), each device's [1024, 1024] bf16 part (2 MiB) out and back."""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    from tpuprof.sources import tpu_compile

    mesh = Mesh(np.array(tpu_compile.topology_devices("v6e:2x2")).reshape(-1), ("d",))
    device = NamedSharding(mesh, P("d", None))
    host = device.with_memory_kind("pinned_host")

    def step(x, w):
        y = jnp.tanh(x @ w)
        saved = jax.device_put(y, host)
        return jnp.tanh(y @ w) @ w + jax.device_put(saved, device)

    args = [jax.ShapeDtypeStruct((4096, 1024), jnp.bfloat16, sharding=device),
            jax.ShapeDtypeStruct((1024, 1024), jnp.bfloat16, sharding=NamedSharding(mesh, P(None, None)))]
    folder = tmp_path_factory.mktemp("copies") / "dump"
    jax.jit(step, out_shardings=device).lower(*args).compile(
        {"xla_dump_to": str(folder), "xla_dump_hlo_as_proto": True, "xla_dump_hlo_as_text": True})
    return folder


@pytest.mark.compile
def test_a_copy_to_host_memory_and_back_is_timed_on_the_host_link(copied_to_the_host):
    from tpuprof.analyses import step_estimate
    from tpuprof.analyses.collectives import FROM_HOST, TO_HOST

    text = next(copied_to_the_host.glob("*after_optimizations.txt")).read_text()
    assert re.search(r"copy-start = \(bf16\[1024,1024\]\{[^}]*S\(5\)\}", text)  # the form this test is about
    estimate = step_estimate.estimate(step_estimate.load(copied_to_the_host), "v6e")
    host = estimate.communication
    part = 1024 * 1024 * 2
    # Out and back once each; the prefetch of a weight into VMEM (S(1)) is no host transfer.
    assert [(t.direction, t.bytes) for t in host.host_transfers] == [(TO_HOST, part), (FROM_HOST, part)]
    assert host.host_bytes(TO_HOST) == host.host_bytes(FROM_HOST) == part
    assert estimate.host_s == pytest.approx(2 * part / 32e9)
    assert 0 <= estimate.exposed_host_s <= estimate.host_s
    assert estimate.point_s == pytest.approx(estimate.compute_point_s + estimate.exposed_collective_s
                                             + estimate.exposed_host_s)
