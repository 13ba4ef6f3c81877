"""The MoE step's expert side keeps each device's own routing groups (issue #33).

One layout-only compile (seconds): a small Mixtral-shaped config on v5e-4, fsdp over the 4 devices, at a batch
whose layout cannot fit, so that the compile stops at libtpu's buffer assignment.
"""

from __future__ import annotations

import json
import math

from conftest import run_cli

from tpuprof.sources import llm

# Two scanned MoE layers of 8 experts, top-2; one routing group per sequence of 512 tokens.
MIXTRAL = {"model_type": "mixtral", "vocab_size": 512, "hidden_size": 256, "intermediate_size": 512,
           "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2, "num_local_experts": 8,
           "num_experts_per_tok": 2}


def test_the_expert_mlp_holds_the_devices_own_groups_not_the_slices(compile_cache, tmp_path):
    """With the dispatched tokens constrained on their experts alone, the SPMD partitioner met the expert weights
    (divided over fsdp) by gathering the groups of every device: the published Mixtral 8x7B v6e-256 recipe was
    laid out in 1,087 GiB per device, its expert MLP's activations bf16[8,24576,160,14336] (96 groups per device
    x 256 devices). Here the expert side [experts, groups, capacity, width] must hold this device's groups
    (2,048 sequences per chip x 512 tokens / 512), never the slice's 4 x 2,048."""
    (tmp_path / "config.json").write_text(json.dumps(MIXTRAL))
    batch, seq, devices = 2048, 512, 4
    result = run_cli("preflight", "--model", str(tmp_path / "config.json"), "--tpu", "v5e-4", "--seq", str(seq),
                     "--batch-per-chip", str(batch), "--json", timeout=900,
                     env={"XDG_CACHE_HOME": str(compile_cache)})
    assert result.returncode == 0, result.stderr
    target = json.loads(result.stdout)["targets"][0]
    assert target["mesh"] == {"data": 1, "fsdp": devices, "tensor": 1, "expert": 1}
    assert not target["fits"] and target["fast"]["stage"] == "buffer_assignment"
    experts, top_k, width = 8, 2, 512
    groups = batch * seq // llm.MOE_GROUP
    capacity = math.ceil(top_k * llm.MOE_GROUP * llm.CAPACITY_FACTOR / experts)
    shapes = [b["shape"].split("{")[0] for b in target["memory"]["buffers"]]
    own = f"bf16[{experts},{groups},{capacity},{width}]"
    assert own in shapes, shapes[:10]
    whole = [s for s in shapes if s.startswith(f"bf16[{experts},{groups * devices},")]
    assert not whole, whole
    # Nothing the layout holds is as large as one of the slice's expert activations.
    largest = target["memory"]["buffers"][0]["size_bytes"]
    assert largest < experts * groups * devices * capacity * width * 2
