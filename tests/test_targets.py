"""TPU generations (tpuprof.targets) against the real XLA:TPU compiler: for every generation, the device tpuprof
compiles for is the one users' jobs see (its kind, TensorCores and devices per chip, as libtpu's compile-only
topology describes them), the HBM the compiler offers it is the figure tpuprof uses, and a dump names the
generation. Then TPU7x (and the other names people use) through every command that takes a generation.

One session fixture compiles two tiny programs per generation (one that fits, with a dump; one far too large,
whose RESOURCE_EXHAUSTED message states the available HBM): about a second each.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from conftest import ROOT, SAMPLES, run_cli

from tpuprof import slices, targets
from tpuprof.errors import UserError
from tpuprof.sources import hlo_dump
from tpuprof.units import read_size

GiB = 1 << 30
OOM_FIXTURES = ROOT / "tests" / "fixtures" / "oom"
HLO_TEXT = SAMPLES / "dumps" / "tf_hlo_cpu" / "tf_conv18.hlo.txt"


class Compiled:
    """What libtpu says about one generation's device."""

    def __init__(self, name: str, folder: Path):
        import jax
        import jax.numpy as jnp

        from tpuprof.sources import tpu_compile

        self.devices = tpu_compile.topology_devices(name)
        self.device = self.devices[0]
        fits = tpu_compile.compile_jax(lambda x: x * 2, [jax.ShapeDtypeStruct((8, 128), jnp.float32)], name,
                                       folder / name)
        arguments = next(f for f in fits.files if f.endswith(".target_arguments.txt"))
        self.target_arguments = Path(arguments).read_text()
        # 1 TiB of input and twice that of outputs: no TPU holds it, and the compiler says what it has.
        huge = jax.ShapeDtypeStruct((1 << 30, 256), jnp.float32)
        with pytest.raises(tpu_compile.CompileResourceExhausted) as refused:
            tpu_compile.compile_jax(lambda x: (x * 2, x + 1), [huge], name)
        self.message = refused.value.message
        available = re.search(r"available HBM \(([\d.]+)([A-Z])\)", self.message)
        self.available_bytes = read_size(available.group(1), available.group(2)) if available else None

    @property
    def devices_per_chip(self) -> int:
        """Devices at the coordinates of device 0: one chip holds them all."""
        return sum(list(d.coords) == list(self.device.coords) for d in self.devices)


@pytest.fixture(scope="session")
def compiled(tmp_path_factory):
    from tpuprof.sources import tpu_compile

    if not tpu_compile.jax_available():
        pytest.fail("libtpu is missing: `make setup` installs jax[tpu]")
    folder = tmp_path_factory.mktemp("generations")
    cache: dict[str, Compiled] = {}

    def get(name: str) -> Compiled:
        if name not in cache:
            cache[name] = Compiled(name, folder)
        return cache[name]

    return get


@pytest.mark.parametrize("name", list(targets.TARGETS))
def test_each_generation_compiles_for_the_device_users_run_with_the_capacity_tpuprof_uses(compiled, name):
    target = targets.TARGETS[name]
    facts = compiled(name)
    # What the device is: libtpu's own description of it.
    assert facts.device.device_kind == target.jax_device_kind
    assert targets.from_device_type(facts.device.device_kind) == name
    assert facts.device.num_cores == target.cores_per_device
    assert facts.devices_per_chip == target.devices_per_chip
    assert target.device_kind == ("chip" if facts.devices_per_chip == 1 else "TensorCore")
    assert target.device.startswith("one chip" if facts.devices_per_chip == 1 else "one TensorCore")
    assert target.device_info()["cores_per_device"] == facts.device.num_cores
    # The capacity: the compiler's own words when a program is too large.
    assert facts.available_bytes == target.compiler_hbm_bytes, facts.message[:300]
    # The runtime keeps part of HBM: the compiler offers at most the device's published share, give or take the
    # rounding of the published figure to whole GiB (v5p: the docs say 95, the compiler offers 95.74G).
    assert target.compiler_hbm_bytes < target.published_hbm_bytes + GiB
    # A dump says which generation and chip config it was compiled for.
    arguments = hlo_dump.parse_target_arguments(facts.target_arguments)
    assert arguments.generation == name
    assert arguments.chip_config == (target.chip_config_name or "default")


def test_v4_is_the_megacore_chip_a_v4_vm_runs():
    """A real v4 OOM log (EasyDeL #166): "Used 63.80G of 30.75G hbm": the capacity of one device on a v4 VM is
    the one tpuprof compiles for (the test above checks the compiler states it too)."""
    log = (OOM_FIXTURES / "easydel_166_v4_falcon.txt").read_text()
    capacity = re.search(r"Used [\d.]+G of ([\d.]+)G hbm", log).group(1)
    v4 = targets.get("v4")
    assert read_size(capacity, "G") == v4.compiler_hbm_bytes
    assert (v4.chip_config_name, v4.device_kind, v4.cores_per_device, v4.devices_per_chip) == ("megacore", "chip", 2, 1)


def test_tpu7x_has_two_devices_per_chip_each_with_half_of_it(compiled):
    facts = compiled("tpu7x")
    assert len(facts.devices) == 8  # tpu7x:2x2x1: 4 chips
    assert sorted(d.core_on_chip for d in facts.devices) == [0, 0, 0, 0, 1, 1, 1, 1]
    tpu7x = targets.get("tpu7x")
    assert tpu7x.published_hbm_bytes == 96 * GiB and tpu7x.peak_bf16_tflops_per_device == 2307 / 2
    assert tpu7x.hbm_gbps_per_device == 7380 / 2


@pytest.mark.parametrize("name, expected", [
    ("v7x", "tpu7x"), ("tpu7x", "tpu7x"), ("TPU7x", "tpu7x"), ("ironwood", "tpu7x"), ("tpu7x-8", "tpu7x"),
    ("v5litepod-8", "v5e"), ("v5lite", "v5e"), ("TPU v5 lite", "v5e"), ("v6e-8", "v6e"), ("v6e-256", "v6e"),
    ("trillium", "v6e"), ("v5p-8", "v5p"), ("v4-8", "v4"), ("v2-8", "v2"), ("v3-8", "v3"), ("v5e:2x2", "v5e"),
])
def test_common_names(name, expected):
    assert targets.get(name).name == expected


def test_topologies_are_spelled_as_libtpu_does_and_carry_the_chip_config():
    assert slices.parse("v7x:2x2x1").topology == "tpu7x:2x2x1"
    assert slices.parse("trillium:2x4").topology == "v6e:2x4"
    assert slices.parse("v4").topology == "v4:2x2x1" and slices.parse("v4-8").compile_label == "v4:2x2x1 megacore"
    with pytest.raises(UserError, match="unknown TPU target 'v9'.*tpu7x"):
        targets.get("v9")


def test_capture_device_types_name_their_generation():
    assert targets.from_device_type("TPU v7x") == "tpu7x"  # what XProf reads on TPU7x planes
    assert targets.from_device_type("TPU v6 Lite") == "v6e" and targets.from_device_type("TPU v5 Lite") == "v5e"
    assert targets.from_device_type("TPU v9") is None


def test_roofline_peaks_are_per_capture_plane():
    """A capture has one plane per device: a v4 plane is the megacore chip (the chip's peaks), a TPU7x plane
    one of its two TensorCores (half)."""
    from tpuprof.analyses.roofline import roof_for

    assert roof_for("v4").peak_flops_per_s == 275e12 and roof_for("v5p").peak_hbm_bytes_per_s == 2765e9
    assert roof_for("tpu7x").peak_flops_per_s == 2307e12 / 2 and roof_for("tpu7x").peak_hbm_bytes_per_s == 3690e9
    assert roof_for("v3").peak_flops_per_s == 123e12 / 2


def test_the_documented_table_is_the_one_in_targets():
    """docs/tpu-generations.md's table shows tpuprof.targets' figures (so the two cannot drift apart)."""
    readme = (ROOT / "docs" / "tpu-generations.md").read_text().split("# TPU generations", 1)[1]
    rows = [line.strip("|").split("|") for line in readme.splitlines() if re.match(r"\| (v\d|tpu7x)", line)]
    assert [row[0].split()[0] for row in rows] == list(targets.TARGETS)
    for name, kind, cores, per_chip, offered, published, peak, bandwidth in ([c.strip() for c in row] for row in rows):
        target = targets.get(name.split()[0])
        assert kind.startswith(("a chip" if target.device_kind == "chip" else "a TensorCore"))
        assert (int(cores), int(per_chip)) == (target.cores_per_device, target.devices_per_chip)
        assert read_size(offered.split()[0], "G") == target.compiler_hbm_bytes
        assert read_size(published.split()[0], "G") == target.published_hbm_bytes_per_chip
        assert (float(peak.split()[0]), float(bandwidth.split()[0])) == (target.peak_bf16_tflops, target.hbm_gbps)


# --- every command that takes a generation -----------------------------------------------------------------

@pytest.mark.compile
def test_preflight_v4_and_tpu7x(compile_cache):
    """preflight on a sample SPEC: v4 against the megacore compiler, TPU7x by its common name."""
    from helpers.schema_check import validate

    result = run_cli("preflight", SAMPLES / "models" / "int8_matmul.py:factory", "--tpu", "v4,v7x", "--batch", "1000", "--json",
                     env={"XDG_CACHE_HOME": str(compile_cache)}, timeout=600)
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert validate(document) == "preflight"
    v4, tpu7x = document["targets"]
    assert (v4["target"], v4["topology"], v4["hbm_capacity_bytes"]) == ("v4", "v4:2x2x1", targets.get("v4").compiler_hbm_bytes)
    assert v4["hbm_capacity_bytes"] == read_size("30.75", "G")
    assert {k: v4["device"][k] for k in ("kind", "cores_per_device", "devices_per_chip")} == \
        {"kind": "chip", "cores_per_device": 2, "devices_per_chip": 1}
    assert (tpu7x["target"], tpu7x["topology"], tpu7x["hbm_capacity_bytes"]) == \
        ("tpu7x", "tpu7x:2x2x1", read_size("94.75", "G"))
    assert {k: tpu7x["device"][k] for k in ("kind", "cores_per_device", "devices_per_chip")} == \
        {"kind": "TensorCore", "cores_per_device": 1, "devices_per_chip": 2}
    assert v4["fits"] and tpu7x["fits"] and 0 < v4["required_bytes"] < v4["hbm_capacity_bytes"]


def test_memory_target_tpu7x_on_hlo_text():
    result = run_cli("memory", HLO_TEXT, "--target", "v7x", "--json")
    assert result.returncode == 0, result.stderr
    module = json.loads(result.stdout)["modules"][0]
    assert module["target"] == "tpu7x" and module["hbm_capacity_bytes"] == read_size("94.75", "G")


def test_oom_target_tpu7x_gives_the_capacity_the_message_lacks():
    """pytorch/xla #6674 says only "HLO temp 15.45G": with --target ironwood the batch scales to 94.75G."""
    result = run_cli("oom", OOM_FIXTURES / "pytorch_xla_6674_bf16_transpose.txt", "--target", "ironwood", "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert any("94.75G" in note for note in document["notes"])
    assert document["batch_estimate"]["scale"] == pytest.approx(94.75 / 15.45, abs=1e-3)


def test_report_target_tpu7x(tmp_path):
    page = tmp_path / "page.html"
    result = run_cli("report", HLO_TEXT, "--target", "tpu7x", "-o", page, "--json")
    assert result.returncode == 0, result.stderr
    assert "tpu7x, HBM 94.75 GiB" in page.read_text()


def test_an_unknown_generation_is_a_usage_error_naming_tpu7x():
    result = run_cli("memory", HLO_TEXT, "--target", "v9")
    assert result.returncode == 2 and "unknown TPU target 'v9'" in result.stderr and "tpu7x" in result.stderr


def test_python_api_takes_the_same_names():
    import tpuprof

    result = tpuprof.oom((OOM_FIXTURES / "pytorch_xla_6674_bf16_transpose.txt").read_text(), target="v7x")
    assert result.batch_estimate.scale == pytest.approx(94.75 / 15.45, abs=1e-3)
    (module,) = tpuprof.memory(HLO_TEXT, target="tpu7x").modules
    assert module.target == "tpu7x" and module.hbm_capacity_bytes == targets.get("tpu7x").compiler_hbm_bytes


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


def test_durations_rates_and_dollars_read_without_exponents():
    from tpuprof.units import fmt_count, fmt_ms, fmt_usd

    assert fmt_ms(1140.4, 959.2, 1750) == "1.14 s (0.959-1.75 s)"  # the band in the point's unit
    assert fmt_ms(18.84) == "18.8 ms" and fmt_ms(0.25) == "0.25 ms" and fmt_ms(2_500_000) == "2,500 s"
    assert fmt_count(14080.4) == "14,080" and fmt_count(10.4) == "10.4"
    assert fmt_usd(1234.5) == "$1,234" and fmt_usd(2) == "$2.00" and fmt_usd(0.2091) == "$0.209"
