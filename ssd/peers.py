"""The peers we measure against: transformers' own ``generate`` (hf-ar) and its assisted generation (hf-sd).

They take the same arguments as our methods so the bench can interleave them. transformers does not expose its
rounds, so their trace carries only the wall time (``rounds`` is empty).
"""
from __future__ import annotations

import contextlib
import time

import torch
from transformers import GenerationConfig

from .decoding import DecodeConfig, check_prompt
from .trace import Trace


def generation_config(pair, config: DecodeConfig, **extra) -> GenerationConfig:
    """Plain sampling from the target's distribution (or greedy), with every logits processor switched off.

    transformers fills unset (None) fields from the model's own generation_config, which for instruct models often
    sets top_k, top_p or a repetition penalty; each is set explicitly here so all methods sample the same p.
    """
    eos = list(pair.eos_token_ids) or None
    sampling = dict(temperature=config.temperature, top_k=0, top_p=1.0, typical_p=1.0) if config.temperature > 0 else {}
    return GenerationConfig(
        max_new_tokens=config.max_new_tokens,
        do_sample=config.temperature > 0,
        repetition_penalty=1.0,
        eos_token_id=eos,
        pad_token_id=eos[0] if eos else 0,
        **sampling,
        **extra,
    )


def _hf_generate(method: str, pair, prompt_ids, config: DecodeConfig, generator: torch.Generator, **kwargs):
    tokens = check_prompt(pair, prompt_ids, config)
    # transformers samples from the global RNG: seed it from our generator so a seed still fixes the tokens.
    torch.manual_seed(int(torch.randint(2**31 - 1, (1,), generator=generator)))
    input_ids = torch.tensor([tokens], device=pair.target.device)
    start = time.perf_counter()
    with torch.inference_mode():
        out = pair.target.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), **kwargs)
    trace = Trace(method, prompt_len=len(tokens), wall_s=time.perf_counter() - start)
    return out[0, len(tokens):].tolist(), trace


def generate_hf_ar(pair, prompt_ids, config: DecodeConfig, generator: torch.Generator):
    """transformers' own generate with the target alone."""
    return _hf_generate("hf-ar", pair, prompt_ids, config, generator, generation_config=generation_config(pair, config))


@contextlib.contextmanager
def fixed_draft_length(draft, k: int):
    """transformers reads K and its schedule from the *assistant's* generation_config (default: 20 tokens, adapted
    each round), not from the config passed to generate; set them there for the call, then restore them."""
    settings = dict(num_assistant_tokens=k, num_assistant_tokens_schedule="constant", assistant_confidence_threshold=0.0)
    saved = {key: getattr(draft.generation_config, key, None) for key in settings}
    for key, value in settings.items():
        setattr(draft.generation_config, key, value)
    try:
        yield
    finally:
        for key, value in saved.items():
            setattr(draft.generation_config, key, value)


def generate_hf_sd(pair, prompt_ids, config: DecodeConfig, generator: torch.Generator):
    """transformers' assisted generation with our draft and a fixed K (no adaptive schedule, no early exit)."""
    if not isinstance(config.k, int):
        raise ValueError(f"k={config.k!r}: hf-sd drafts a fixed K; give an integer k (k='auto' is the kit's own "
                         "choice, for sd, sd-1core, ssd and ssd-pipeline)")
    with fixed_draft_length(pair.draft, config.k):
        return _hf_generate("hf-sd", pair, prompt_ids, config, generator,
                            generation_config=generation_config(pair, config), assistant_model=pair.draft)
