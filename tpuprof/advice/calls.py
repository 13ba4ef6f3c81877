"""The concrete call for each kind of fix, in the API of the framework the job ran with.

Keys are the frameworks of `tpuprof.analyses.framework` (jax, keras, tf2, tf1, pytorch_xla, vllm); None is the
framework-neutral wording used when the input does not say which framework ran. A missing entry means the fix
does not apply to that framework (vLLM serves: it has no backward pass to rematerialise).
"""

from __future__ import annotations

CALLS: dict[str, dict[str | None, str]] = {
    "bf16": {
        "jax": "compute in bfloat16: dtype=jnp.bfloat16 in the layers (Flax: nn.Dense(..., dtype=jnp.bfloat16)), "
               "parameters may stay float32 (param_dtype)",
        "keras": "keras.mixed_precision.set_global_policy('mixed_bfloat16') before building the model",
        "tf2": "tf.keras.mixed_precision.set_global_policy('mixed_bfloat16') before building the model",
        "tf1": "build the model inside `with tf.tpu.bfloat16_scope():` (cast the features to tf.bfloat16, the "
               "loss back to tf.float32)",
        "pytorch_xla": "XLA_USE_BF16=1 in the environment, or the forward pass under "
                       "torch.autocast('xla', dtype=torch.bfloat16)",
        "vllm": "--dtype bfloat16 (and --kv-cache-dtype fp8 for the KV cache)",
        None: "mixed precision: keep activations in bfloat16, parameters in float32",
    },
    "remat": {
        "jax": "jax.checkpoint(layer, policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable) around "
               "each repeated block (Flax: nn.remat(Block)); jax.checkpoint_policies.nothing_saveable saves most",
        "keras": "build the model under `with keras.RematScope(mode='full'):` (Keras >= 3.9), or keras.remat(fn) "
                 "around a block",
        "tf2": "tf.recompute_grad(block) around each repeated block",
        "tf1": "tf.recompute_grad(block) around each repeated block",
        "pytorch_xla": "torch_xla.utils.checkpoint.checkpoint(block, x) around each repeated block",
        None: "activation checkpointing (rematerialisation) around the repeated blocks",
    },
    "attention": {
        "jax": "a fused attention kernel that never stores the scores: "
               "jax.experimental.pallas.ops.tpu.splash_attention (or .flash_attention), or "
               "jax.nn.dot_product_attention(q, k, v, implementation=...)",
        "keras": "keras.ops.dot_product_attention(q, k, v, flash_attention=True)",
        "pytorch_xla": "torch_xla.experimental.custom_kernel.flash_attention(q, k, v, causal=True)",
        "vllm": "keep the Pallas paged-attention backend and lower --max-model-len / --max-num-batched-tokens",
        None: "a flash/splash attention kernel that computes softmax(QK^T)V block by block",
    },
    "sharding": {
        "jax": "shard parameters and optimizer state over the devices (FSDP): jax.device_put(state, "
               "NamedSharding(mesh, P('fsdp'))) and matching in_shardings/out_shardings in jax.jit",
        "keras": "keras.distribution.set_distribution(keras.distribution.ModelParallel(layout_map=...)) "
                 "(Keras 3 on JAX)",
        "tf2": "tf.distribute.TPUStrategy with a larger slice, or DTensor layouts that shard the variables",
        "tf1": "a larger TPU slice (TPUEstimator replicates the model on every core): shard the model with "
               "Mesh TensorFlow, or shrink it",
        "pytorch_xla": "torch_xla.distributed.fsdp.XlaFullyShardedDataParallel(model) (or SPMD: "
                       "torch_xla.distributed.spmd.mark_sharding on the weights)",
        "vllm": "--tensor-parallel-size N over more chips",
        None: "shard parameters and optimizer state over the devices (FSDP / ZeRO)",
    },
    "donation": {
        "jax": "jax.jit(train_step, donate_argnums=(0,)) so the new state reuses the old state's buffers",
        None: "donate the step's state inputs so its outputs reuse their buffers",
    },
    "batch_size": {
        "jax": "a smaller per-chip batch; keep the global batch with gradient accumulation "
               "(optax.MultiSteps(optimizer, every_k_schedule=k))",
        "keras": "a smaller batch_size; keep the effective batch with "
                 "keras.optimizers.Adam(..., gradient_accumulation_steps=k)",
        "tf2": "a smaller per-replica batch (global batch / number of cores)",
        "tf1": "a smaller train_batch_size in TPUEstimator (it is split over the cores)",
        "pytorch_xla": "a smaller per-device batch; accumulate gradients over k micro-batches before "
                       "optimizer.step() (xm.optimizer_step), with xm.mark_step() after each micro-batch",
        "vllm": "lower --max-num-seqs / --max-num-batched-tokens",
        None: "a smaller per-chip batch (gradient accumulation keeps the global batch)",
    },
    "live_buffers": {
        "jax": "delete arrays no longer needed, donate the step's inputs (jax.jit(..., donate_argnums=...)), "
               "load weights sharded instead of onto one device; see what is alive with jax.live_arrays() and "
               "jax.profiler.save_device_memory_profile('mem.prof')",
        "keras": "keras.backend.clear_session() between models, load weights sharded "
                 "(keras.distribution) instead of onto one device, delete models no longer needed",
        "tf2": "tf.keras.backend.clear_session() between models; delete tensors no longer needed",
        "tf1": "one graph and one session per process; the TPU system is shared by every session",
        "pytorch_xla": "call xm.mark_step() once per step (after optimizer.step()) so the graph and its "
                       "tensors do not grow, del tensors no longer needed, check xm.get_memory_info(device)",
        # The allocation failed while xm.mark_step() ran the step's graph: that call is already there.
        "pytorch_xla_in_mark_step": "the step's graph failed at xm.mark_step(), which runs it: del tensors no longer "
                                    "needed before it (old batches, outputs kept for logging), move .item()/print of "
                                    "device tensors after it, check xm.get_memory_info(device)",
        "vllm": "lower --gpu-memory-utilization (the share of HBM vLLM takes for the KV cache) or "
                "--max-model-len",
        None: "free arrays no longer needed and load weights sharded instead of onto one device",
    },
    "fragmentation": {
        "jax": "jax.lax.scan over the layers (Flax: nn.scan) so every layer reuses the same buffers, and keep "
               "the large temporaries of one size (pad sequence lengths to one bucket)",
        None: "loop over the layers (scan) instead of unrolling them so every layer reuses the same buffers, "
              "and keep the large temporaries of one size (pad sequence lengths to one bucket)",
    },
    "scratch": {
        "jax": "smaller block_shape in the pallas_call BlockSpecs (or the kernel's block sizes) so one block's "
               "operands fit in VMEM",
        "pytorch_xla": "smaller block sizes for the Pallas kernel (torch_xla.experimental.custom_kernel), or "
                       "XLA_FLAGS that break the fusion",
        "vllm": "lower --max-num-batched-tokens (the ragged paged-attention kernel's query and KV blocks grow "
                "with it) and report the kernel's block sizes to tpu-inference",
        None: "smaller block/tile sizes in the custom kernel, or break the fusion",
    },
    "offload": {
        "jax": "jax.checkpoint(layer, policy=jax.checkpoint_policies.offload_dot_with_no_batch_dims("
               "'device', 'pinned_host')) to keep saved activations in host memory",
        None: "offload saved activations or optimizer state to host memory",
    },
}


def call(kind: str, framework: str | None) -> str | None:
    """The call for KIND in FRAMEWORK; the neutral wording when the framework has no entry of its own;
    None when the fix does not apply to it (remat in vLLM)."""
    calls = CALLS.get(kind, {})
    if framework in calls:
        return calls[framework]
    if framework == "vllm" and kind in ("remat", "donation", "offload"):
        return None
    if kind == "donation" and framework in ("keras", "tf1", "tf2", "pytorch_xla"):
        return None  # their runtimes update variables in place: nothing for the user to donate
    return calls.get(None)
