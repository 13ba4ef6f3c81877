"""`tpuprof serve --model NAME --tpu SLICE[,SLICE...]`: will a model serve on each slice with a serving engine's
settings, how many requests at once, which --gpu-memory-utilization is safe, how fast and at what cost, and the
command to launch it. It plans; it never starts a server. Wiring only: options (tpuprof.models.serve), analyses
(tpuprof.analyses.serve_plan), document (tpuprof.documents_serve), renderers (tpuprof.renderers.serve).
"""

from __future__ import annotations

import sys

from tpuprof.errors import UserError


def options(model: str, tpu, **settings):
    """ServeOptions for the CLI and the API alike: the model's config read here, at the edge (a name or a path it
    cannot read is an option error naming `model`), then every setting validated once by serve_options."""
    from tpuprof.models.options import template
    from tpuprof.models.serve import OptionError, serve_options
    from tpuprof.sources.llm import load_config
    from tpuprof.sources.llm_serve import checkpoint_architecture, checkpoint_quantization

    built_in, hub_id = _built_in_for(model)
    try:
        loaded = load_config(built_in)
    except UserError as error:
        if _looks_like_hub_id(model):  # what vLLM takes and `tpuprof oom` reads back from a log
            config_url = f"https://huggingface.co/{model}/blob/main/config.json"
            raise OptionError("model", f"{{option}} {model}: tpuprof reads no model hub: give the model's config.json "
                                       f"({config_url}) or its folder.") from None
        raise OptionError("model", "{option}: " + template(str(error))) from None
    architecture = checkpoint_architecture(loaded[1])
    why = _not_a_decoder(architecture)
    if why:
        raise OptionError("model", f"{{option}} {model}: {why}; serve plans decoder-only LLMs, whose KV cache it "
                                   "sizes.")
    return serve_options(loaded, tpu, checkpoint=checkpoint_quantization(loaded[1]), architecture=architecture,
                         hub_id=hub_id, **settings)


# Class name endings of the generative decoders the engines serve with a KV cache: Llama/Qwen/... ForCausalLM,
# GPT-2's LMHeadModel, and the multimodal wrappers whose language model tpuprof reads (Gemma 3, Llama 4, Qwen2.5-VL).
DECODER_ARCHITECTURE_ENDINGS = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")


def _not_a_decoder(architecture: str | None) -> str | None:
    """Why the config is not a decoder-only LLM (an encoder such as BertForMaskedLM), whose serving has no KV cache
    of the kind tpuprof sizes; None for a decoder. (An encoder-decoder config such as T5's names no
    num_attention_heads and is refused by the config reader.)"""
    if architecture and not architecture.endswith(DECODER_ARCHITECTURE_ENDINGS):
        return f"{architecture} is not a causal language model (its architecture is none of *ForCausalLM, " \
               "*LMHeadModel, *ForConditionalGeneration)"
    return None


def _built_in_for(model: str) -> tuple[str, str | None]:
    """(the built-in config, the hub id as the hub spells it) of a Hugging Face id serve knows the config of, unless a
    file or folder of that name exists; (MODEL, None) otherwise."""
    from pathlib import Path

    from tpuprof.analyses.serve_plan import built_in_for_hub_id

    if Path(model).expanduser().exists():
        return model, None
    return built_in_for_hub_id(model) or (model, None)


def _looks_like_hub_id(model: str) -> bool:
    import re
    from pathlib import Path

    return bool(re.fullmatch(r"[\w.-]+/[\w.-]+", model)) and not Path(model).expanduser().exists() \
        and not model.endswith(".json")


def result(options, on_compile=None):
    """The typed result `tpuprof.serve()` returns and the CLI prints."""
    from tpuprof.analyses import serve_plan
    from tpuprof.results import ServeResult
    from tpuprof.sources import tpu_compile

    if options.compile and not tpu_compile.jax_available():
        raise UserError(tpu_compile.INSTALL_HINT + " (or give --no-compile for the KV arithmetic alone)")
    return ServeResult(serve_plan.plan(options, on_compile=on_compile))


def run(model: str, tpu: str, *, as_json: bool = False, format_: str | None = None, compile_: bool = True,
        **settings) -> None:
    from tpuprof.models.serve import OptionError
    from tpuprof.renderers.formats import output_format, print_document

    format_ = output_format(as_json, format_)
    try:
        answer = result(options(model, tpu, compile=compile_, **settings), on_compile=_progress(format_))
    except OptionError as error:
        raise error.for_flags() from None
    if not print_document(answer, format_):
        from tpuprof.renderers.serve import print_table

        print_table(answer.to_dict())


def _progress(format_: str):
    """One line on stderr per compile when a person watches (a terminal), nothing otherwise."""
    if format_ != "table" or not sys.stderr.isatty():
        return None

    def report(program) -> None:
        what = (f"{program.tokens}-token backbone, {program.layers} layer(s)" if program.kind == "backbone"
                else f"logits for {program.requests} requests")
        print(f"tpuprof serve: compiling the {what} with libtpu", file=sys.stderr, flush=True)

    return report
