"""ssd: a readable reference kit for Speculative Speculative Decoding (Kumar, Dao & May, ICLR 2026).

Every method has one shape, ``generate(pair, prompt_ids, config, generator) -> (new_tokens, trace)``:

    >>> import torch, ssd
    >>> pair = ssd.load_pair()                      # the offline qwen2.5-coder pair: 0.5B draft, 1.5B target
    >>> ids = ssd.encode(pair.tokenizer, "def fib(n):")
    >>> tokens, trace = ssd.generate_sd(pair, ids, ssd.DecodeConfig(k=4), torch.Generator().manual_seed(0))
    >>> trace.to_frame()                            # one row per round
"""
from .decoding import DecodeConfig, generate_ar, generate_sd
from .methods import METHODS, get_method
from .models import Pair, load_pair, tiny_pair
from .prompts import Prompt, encode, load_prompts
from .trace import Round, Trace

__all__ = [
    "DecodeConfig", "generate_ar", "generate_sd", "METHODS", "get_method", "Pair", "load_pair", "tiny_pair",
    "Prompt", "encode", "load_prompts", "Round", "Trace",
]
