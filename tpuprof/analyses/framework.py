"""Which framework ran the job, and whether it trained or served, from what the user gave us.

An OOM log carries the framework in its traceback and error types (`jaxlib...XlaRuntimeError`, `torch_xla`,
`tpu_estimator.py`, `keras_nlp`); a dump carries it in the module name (`jit_train_step`,
`a_inference_train_step_441__`) and the op metadata (`jit(train_step)/transpose(jvp(...))`, `gradient_tape/...`,
`aten::...`). Advice then names that framework's call (`jax.checkpoint`, `torch_xla.distributed.fsdp`,
`tf.tpu.bfloat16_scope()`), or stays framework-neutral when the evidence is not there.

Frameworks: jax (JAX, Flax, EasyDeL...), keras (Keras 3, any backend), tf2 (TensorFlow 2 without Keras),
tf1 (TensorFlow 1 / TPUEstimator), pytorch_xla, vllm (vLLM / tpu-inference). Training: True (a backward
pass or an optimizer is in the evidence), False (generation, serving, prediction), None (cannot tell).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable

from tpuprof.models.suggestion import FRAMEWORK_NAMES  # noqa: F401 (the analyses and advice read it here)

# URLs name projects, not what ran: a pasted link to github.com/pytorch/xla is no evidence of PyTorch/XLA.
_URL = re.compile(r"https?://\S+")

# First match wins, so the more specific frameworks come first: vLLM runs on PyTorch/XLA or JAX, Keras 3 on
# JAX or TensorFlow, and JAX logs name "external/org_tensorflow/..." paths of the XLA sources they embed.
_TEXT_MARKERS = (
    ("vllm", r"\b(?i:vllm)\b|tpu_inference|tpu-inference|\(EngineCore(?:_DP\d+)? pid=\d+\)"),
    ("pytorch_xla", r"torch_xla|pt-xla|xla_client/xla_util|XRTCompile|/job:tpu_worker|xm\.mark_step|xla_spawn"
                    r"|\btorch\b|Bad StatusOr access"),
    ("tf1", r"tpu_estimator|TPUEstimator|tensorflow/contrib|tf\.contrib|tensorflow_core/|training_loop: "
            r"|t2t-trainer|tf\.Session|Error recorded from (?:training_loop|outfeed|infeed)"),
    ("keras", r"\bkeras(?:_nlp|_hub|_cv)?\b|multi_step_on_iterator|\.fit\(|mixed_bfloat16"),
    ("jax", r"jaxlib|XlaRuntimeError|JaxRuntimeError|jax\._src|\bjax\b|\bflax\b|Flax\w+|pjit\(|\bjit\(|"
            r"EasyDel|easydel|UnfilteredStackTrace|JAX-internal frames"),
    ("tf2", r"tensorflow/python|tensorflow\.python|ResourceExhaustedError|__inference_|TPUStrategy|\btf\.function"
            r"|/job:worker|Compilation failure: Ran out of memory"),
)

# Evidence of a backward pass or an optimizer step, and of generation or serving.
_TRAINING = re.compile(
    r"train_step|training_loop|\btrain(?:ing|er)?\b|jvp\(|transpose\(jvp|value_and_grad|\bgrad\b|gradient_tape"
    r"|backward|optimizer|\badam\b|Adafactor|apply_gradients|--do_train|\.fit\(|t2t-trainer|train_steps=", re.I)
_INFERENCE = re.compile(
    r"\bgenerate\b|_generate|generation|\bsampl(?:e|er|ing)\b|\bdecode\b|\bserv(?:e|ing)\b|\bvllm\b"
    # TensorFlow names every traced function "__inference_<name>" ("{{function_node _inferencedistributedfunction1}}"
    # in TF 2.2, Keras's training step too): not a sign of serving.
    r"|(?<!__)(?<!node _)inference(?!_train_step)"
    r"|\bpredict(?:ion)?\b|\binfer\b|apply_fn|from_preset|max-model-len|prefill", re.I)


@dataclass
class Job:
    framework: str | None = None
    training: bool | None = None
    evidence: list[str] = field(default_factory=list)

    @property
    def framework_name(self) -> str:
        return FRAMEWORK_NAMES.get(self.framework or "", "")

    def to_json(self) -> dict:
        out: dict = {"framework": self.framework, "training": self.training}
        if self.evidence:
            out["evidence"] = list(self.evidence)
        return out


def from_text(text: str) -> Job:
    """The job of an OOM log: its traceback, error types and the op names of its allocations."""
    text = _URL.sub("", text or "")
    job = Job()
    for name, pattern in _TEXT_MARKERS:
        match = re.search(pattern, text)
        if match:
            job.framework = name
            job.evidence.append(f"{FRAMEWORK_NAMES[name]}: '{match.group(0).strip()}' in the log")
            break
    job.training, why = _training(text, vllm=job.framework == "vllm")
    if why:
        job.evidence.append(why)
    return job


def from_module(module_name: str, op_names: Iterable[str], source_lines: Iterable[str] = ()) -> Job:
    """The job of a compiled module: its name and the framework op names and source files of its buffers."""
    names = [n for n in op_names if n]
    sources = [s for s in source_lines if s]
    # Each distinct line once, in the order of its first occurrence: a model's layers repeat their op names, and
    # the searches below ask only whether and where first a pattern occurs, line by line.
    text = "\n".join(dict.fromkeys([module_name, *names[:5000], *sources[:2000]]))
    job = Job()
    if any(n.startswith(("aten::", "xla::")) or "/aten__" in n for n in set(names)) or "torch" in text:
        job.framework = "pytorch_xla"
        job.evidence.append("PyTorch/XLA: aten ops in the metadata")
    elif re.search(r"\bkeras\b|compile_loss|multi_step_on_iterator|/keras/", text):
        job.framework = "keras"
        job.evidence.append("Keras: Keras op names (compile_loss, keras sources) in the metadata")
    elif re.search(r"tensorflow/python|gradient_tape|__inference_|^a_inference_|XLA_Args", text, re.M):
        job.framework = "tf2"
        job.evidence.append("TensorFlow: tf.function module and TensorFlow op names in the metadata")
    elif re.search(r"^(?:jit|pjit|xla_computation)[_(]|\bjit\(|\bpjit\(|jvp\(", text, re.M):
        job.framework = "jax"
        job.evidence.append(f"JAX: the module '{module_name}' and jit(...) op names")
    job.training, why = _training(text, vllm=False)
    if why:
        job.evidence.append(why)
    return job


def _training(text: str, vllm: bool) -> tuple[bool | None, str]:
    if vllm:
        return False, "inference: vLLM serves models"
    training = _TRAINING.search(text)
    if training:
        return True, f"training: '{training.group(0)}'"
    inference = _INFERENCE.search(text)
    if inference:
        return False, f"inference: '{inference.group(0)}'"
    return None, ""
