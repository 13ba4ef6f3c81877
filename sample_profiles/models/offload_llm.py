"""A Llama-shaped toy of 2,000 scanned layers trained with `--remat offload` (each layer's input and q/k/v
kept in the host's memory, the rest recomputed), the host-memory out-of-memory sample.

Each layer offloads (hidden + heads x head_dim + 2 x kv heads x head_dim) x 2 bytes = 1.5 KiB per token, so 8
sequences of 8,192 tokens on a v6e device need 2,000 x 65,536 x 1.5 KiB = 187.5 GiB of host memory, more than
libtpu gives one v6e device (128 GiB), while HBM holds the small weights and one layer at a time.
`factory(batch_size)` builds tpuprof's LLM train step (tpuprof/sources/llm.py) for one v6e-4 host, FSDP over
its 4 chips, `batch_size` sequences per chip.
"""

CONFIG = {"model_type": "llama", "vocab_size": 1024, "hidden_size": 256, "intermediate_size": 512,
          "num_hidden_layers": 2000, "num_attention_heads": 4, "num_key_value_heads": 2}
SEQ = 8192
SLICE = "v6e-4"


def factory(batch_size: int = 8):
    from tpuprof.sources import llm, tpu_compile

    config = llm.parse_config(CONFIG, "offload-toy-2000-layers", __file__)
    devices = tpu_compile.topology_devices(SLICE)
    step = llm.Step(config, __file__, SEQ, "offload", "bf16", llm.parse_mesh(None, len(devices)))
    return llm.build(step, devices, batch_size)
