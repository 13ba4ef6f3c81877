"""Slice names (tpuprof.slices) as Cloud TPU names them, against libtpu's compile-only topologies: every
published slice of every generation gives the topology, chips and devices its docs state, and libtpu builds
that topology with that many devices (topology descriptions only, no compile: well under a second each)."""

from __future__ import annotations

import pytest

from conftest import run_cli

from tpuprof import slices, targets
from tpuprof.errors import UserError

# (name, topology, chips, devices): the Cloud TPU docs' own examples (see tpuprof/slices.py for the URLs).
PUBLISHED = [
    ("v2-8", "v2:2x2", 4, 8),
    ("v2-512", "v2:16x16", 256, 512),
    ("v3-32", "v3:4x4", 16, 32),
    ("v3-2048", "v3:32x32", 1024, 2048),
    ("v4-8", "v4:2x2x1", 4, 4),
    ("v4-32", "v4:2x2x4", 16, 16),  # "2x2x4 (16 chips, 2 TensorCores each)"
    ("v4-128", "v4:4x4x4", 64, 64),
    ("v5p-32", "v5p:2x2x4", 16, 16),  # "v5p-32 specifies ... 32 TensorCores (16 chips)"
    ("v5p-128", "v5p:4x4x4", 64, 64),
    ("v5p-12288", "v5p:16x16x24", 6144, 6144),
    ("v5litepod-1", "v5e:1x1", 1, 1),
    ("v5litepod-16", "v5e:4x4", 16, 16),
    ("v5e-64", "v5e:8x8", 64, 64),
    ("v6e-1", "v6e:1x1", 1, 1),
    ("v6e-8", "v6e:2x4", 8, 8),
    ("v6e-256", "v6e:16x16", 256, 256),
    ("tpu7x-2", "tpu7x:1x1x1", 1, 2),
    ("tpu7x-64", "tpu7x:2x4x4", 32, 64),
    ("tpu7x-128", "tpu7x:4x4x4", 64, 128),
]


@pytest.mark.parametrize("name,topology,chips,devices", PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_published_slice_names(name, topology, chips, devices):
    chosen = slices.parse(name)
    assert (chosen.topology, chosen.chips, chosen.devices, chosen.num_slices) == (topology, chips, devices, 1)
    assert chosen.to_json() == {"name": name.replace("v5e-", "v5litepod-"), "topology": topology,
                                "chips": chips, "devices": devices}


def test_every_slice_of_the_table_is_a_topology_libtpu_builds_with_that_many_devices():
    """The whole table (about 80 slices, up to 6,144 chips): libtpu agrees on the device count, so the names'
    units (TensorCores or chips) and the devices per chip are right for every generation."""
    from tpuprof.sources import tpu_compile

    table = slices.table()
    assert {s.generation for s in table} == set(targets.TARGETS)
    for chosen in table:
        devices = tpu_compile.topology_devices(chosen.name)
        assert len(devices) == chosen.devices, chosen
        assert chosen.devices == chosen.chips * chosen.target.devices_per_chip
        assert slices.parse(chosen.name) == chosen  # the canonical name parses back to itself


def test_generation_alone_and_explicit_topologies():
    bare = slices.parse("v6e")
    assert (bare.topology, bare.chips, bare.devices, bare.explicit) == ("v6e:2x2", 4, 4, False)
    explicit = slices.parse("v6e:16x16")
    assert (explicit.name, explicit.topology, explicit.chips, explicit.devices) == ("v6e:16x16", "v6e:16x16", 256, 256)
    assert slices.parse("ironwood:4x4x4").devices == 128  # aliases and topologies together
    assert slices.parse("trillium-16").topology == "v6e:4x4"


def test_multi_slice():
    two = slices.parse("2xv5p-128")
    assert (two.name, two.topology, two.chips, two.num_slices, two.total_chips) == ("v5p-128", "v5p:4x4x4", 64, 2, 128)
    assert two.to_json()["num_slices"] == 2
    assert targets.get("4xv6e-256").name == "v6e"


@pytest.mark.parametrize("name,says", [
    ("v5p-100", "'v5p-100' is not a v5p slice Cloud TPU offers (v5p names count TensorCores)"),
    ("v5p-3", "is not a v5p slice"),
    ("v6e-3", "'v6e-3' is not a v6e slice Cloud TPU offers (v6e names count chips)"),
    ("v9-8", "unknown TPU target 'v9-8'"),
    ("2xv6e", "a multi-slice job names its slices' size"),
    ("v6e:axb", "is not a chip layout"),
])
def test_bad_slice_names(name, says):
    with pytest.raises(UserError, match=None) as error:
        slices.parse(name)
    assert says in str(error.value)


def test_a_bad_slice_name_is_one_sentence_and_exit_2(tmp_path):
    spec = tmp_path / "m.py"
    spec.write_text("def f(batch_size):\n    raise SystemExit('not reached')\n")
    result = run_cli("preflight", f"{spec}:f", "--tpu", "v5p-100", "--batch", "8")
    assert result.returncode == 2 and result.stdout == ""
    assert "'v5p-100' is not a v5p slice Cloud TPU offers" in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
