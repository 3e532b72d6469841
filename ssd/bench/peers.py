"""The peers we measure against: transformers' own ``generate`` (hf-ar) and its assisted generation (hf-sd).

They take the same arguments as our methods so the bench can interleave them: hf-ar a batch too (transformers pads
it on the left and masks the padding), hf-sd one prompt (transformers' assisted generation refuses a batch).
transformers does not expose its rounds, so their trace carries only the wall time (``rounds`` is empty) and the
arrival of the first new tokens, through a streamer (``FirstTokens``): the peer's prompt pass, so that decode-only
speed compares with ours (whose AR and SD also fuse the prompt's pass into the first round).
"""
from __future__ import annotations

import contextlib
import time

import torch
from transformers import GenerationConfig
from transformers.generation.streamers import BaseStreamer

from ..core.decoding import DecodeConfig, batchable, check_prompts, cut
from ..core.trace import Trace


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


class FirstTokens(BaseStreamer):
    """When transformers' generate hands out its first new tokens, and how many per row. Its streamer gets the prompt
    first, then each step's tokens ([b]: generate) or each assisted round's ([1, n]: assisted generation)."""

    def __init__(self, start: float):
        self.start, self.puts, self.seconds, self.tokens = start, 0, None, 0

    def put(self, value) -> None:
        self.puts += 1
        if self.puts == 2:
            self.seconds = time.perf_counter() - self.start
            self.tokens = value.shape[-1] if value.dim() > 1 else 1

    def end(self) -> None:
        pass


def _hf_generate(method: str, pair, prompts, config: DecodeConfig, generator: torch.Generator, **kwargs):
    """transformers' generate over a batch: prompts left-padded with the pad id, its attention mask marking them;
    each row's new tokens cut after its first EOS (transformers pads a finished row with the pad id)."""
    prompts = check_prompts(pair, prompts, config)
    # transformers samples from the global RNG: seed it from our generator so a seed still fixes the tokens.
    torch.manual_seed(int(torch.randint(2**31 - 1, (1,), generator=generator)))
    width = max(len(p) for p in prompts)
    pad = kwargs["generation_config"].pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=pair.target.device)  # [b, width]
    attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts],
                                  device=pair.target.device)  # [b, width]
    start = time.perf_counter()
    first = FirstTokens(start)
    with torch.inference_mode():
        out = pair.target.generate(input_ids=input_ids, attention_mask=attention_mask, streamer=first, **kwargs)
    wall = time.perf_counter() - start
    new = [cut(row, len(row), pair.eos_token_ids)[0] for row in out[:, width:].tolist()]  # transformers pads the rest
    return new, [Trace(method, prompt_len=len(p), wall_s=wall, batch_size=len(prompts), prefill_s=first.seconds,
                       prefill_tokens=min(first.tokens, len(row))) for p, row in zip(prompts, new)]


@batchable
def generate_hf_ar(pair, prompts, config: DecodeConfig, generator: torch.Generator):
    """transformers' own generate with the target alone, over a batch (left padding, its attention mask)."""
    return _hf_generate("hf-ar", pair, prompts, config, generator, generation_config=generation_config(pair, config))


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


@batchable
def generate_hf_sd(pair, prompts, config: DecodeConfig, generator: torch.Generator):
    """transformers' assisted generation with our draft and a fixed K (no adaptive schedule, no early exit)."""
    if len(prompts) > 1:
        raise ValueError(f"hf-sd takes one prompt at a time, given {len(prompts)}: transformers' assisted generation "
                         "is only supported for batch size 1")
    if not isinstance(config.k, int):
        raise ValueError(f"k={config.k!r}: hf-sd drafts a fixed K; give an integer k (k='auto' is the kit's own "
                         "choice, for sd, sd-1core, ssd and ssd-pipeline)")
    with fixed_draft_length(pair.draft, config.k):
        return _hf_generate("hf-sd", pair, prompts, config, generator,
                            generation_config=generation_config(pair, config), assistant_model=pair.draft)
