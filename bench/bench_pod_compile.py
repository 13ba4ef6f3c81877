"""How long a pod-scale compile takes on this machine (not part of the test suite).

    nice -n 10 .venv/bin/python bench/bench_pod_compile.py [MODEL] [SLICE] [SEQ] [BATCH_PER_CHIP] [MESH] [REMAT]

Default: llama3.1-70b (80 scanned layers) on v6e-256 (256 chips, 16x16), 8,192 tokens, 1 sequence per chip,
FSDP over all 256 chips, remat full (REMAT `offload`: the published MaxText recipe's host offload): `tpuprof
preflight --model llama3.1-70b --tpu v6e-256 --seq 8192 --batch-per-chip 1` without the cache. Prints one JSON line: the time to build the sharded ShapeDtypeStructs
and trace/lower the step, the XLA:TPU compile (libtpu, compile-only), the compiler's memory figures per chip,
and the process's peak resident memory.
"""

from __future__ import annotations

import json
import resource
import sys
import time


def main(argv: list[str]) -> None:
    model, slice_name, seq, batch, mesh, remat = (
        argv + ["llama3.1-70b", "v6e-256", "8192", "1", "fsdp=-1", "full"][len(argv):])[:6]
    from tpuprof import slices
    from tpuprof.sources import llm, tpu_compile

    chosen = slices.parse(slice_name)
    config, source = llm.load_config(model)
    devices = tpu_compile.topology_devices(slice_name)
    sizes = llm.parse_mesh(mesh, len(devices))
    step = llm.Step(config, source, int(seq), remat, "bf16", sizes)
    started = time.perf_counter()
    fn, args = llm.build(step, devices, int(batch))
    lowered = fn.lower(*args)
    lowered_s = time.perf_counter() - started
    started = time.perf_counter()
    compiled = lowered.compile(compiler_options=llm.compiler_options(llm.generation_of(devices)))  # as preflight --model
    compile_s = time.perf_counter() - started
    stats = compiled.memory_analysis()
    required = (stats.argument_size_in_bytes + stats.output_size_in_bytes - stats.alias_size_in_bytes
                + stats.temp_size_in_bytes + stats.generated_code_size_in_bytes)
    print(json.dumps({
        "model": config.name, "parameters": config.parameter_count(), "layers": config.num_hidden_layers,
        "slice": chosen.to_json(), "mesh": sizes, "seq": int(seq), "batch_per_chip": int(batch), "remat": remat,
        "loss_chunks": llm.loss_chunks(int(seq), int(batch), config.vocab_size // sizes["tensor"]),
        "lower_s": round(lowered_s, 1), "compile_s": round(compile_s, 1),
        "argument_gib_per_chip": round(stats.argument_size_in_bytes / 2**30, 2),
        "temp_gib_per_chip": round(stats.temp_size_in_bytes / 2**30, 2),
        "required_gib_per_chip": round(required / 2**30, 2),
        "hbm_gib_per_chip": round(chosen.target.compiler_hbm_bytes / 2**30, 2),
        "state_gib_per_chip_arithmetic": round(llm.state_bytes_per_device(config, sizes) / 2**30, 2),
        "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
    }))


if __name__ == "__main__":
    main(sys.argv[1:])
