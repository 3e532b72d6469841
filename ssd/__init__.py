"""ssd: a readable reference kit for Speculative Speculative Decoding (Kumar, Dao & May, ICLR 2026).

Every method has one shape, ``generate(pair, prompt_ids, config, generator) -> (new_tokens, trace)``:

    >>> import torch, ssd
    >>> pair = ssd.load_pair()                      # the offline qwen2.5-coder pair: 0.5B draft, 1.5B target
    >>> ids = ssd.encode(pair.tokenizer, "def fib(n):")
    >>> tokens, trace = ssd.generate_sd(pair, ids, ssd.DecodeConfig(k=4), torch.Generator().manual_seed(0))
    >>> ssd.rounds_frame(trace)                     # one row per round

Given a list of prompts, a method decodes them as one batch (one forward per step over all of them) and returns a
list of token lists and a list of traces.
"""
import importlib

# The names below load on first use (PEP 562), so that `python -m ssd --help`, which imports this package first,
# answers before torch and transformers load.
_EXPORTS = {
    "DecodeConfig": "core.decoding", "generate_ar": "bench.methods", "generate_sd": "bench.methods",
    "SSDConfig": "core.speculation", "generate_ssd": "bench.methods", "Autotune": "core.tuning",
    "PipelineConfig": "pipeline.launch", "generate_ssd_pipeline": "pipeline.launch",
    "close_pipeline": "pipeline.launch", "close_pipelines": "pipeline.launch",
    "METHODS": "bench.methods", "get_method": "bench.methods",
    "Pair": "models.pair", "load_pair": "models.loading", "tiny_pair": "models.tiny",
    "Prompt": "bench.prompts", "encode": "bench.prompts", "load_prompts": "bench.prompts",
    "Round": "core.trace", "Trace": "core.trace", "rounds_frame": "bench.frames", "spans_frame": "bench.frames",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module 'ssd' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
