"""The registry of decoding methods: every entry has the shape generate(pair, prompt_ids, config, generator)."""
from __future__ import annotations

import torch

from .decoding import generate_ar, generate_sd
from .peers import generate_hf_ar, generate_hf_sd
from .ssd import generate_ssd


def generate_sd_1core(pair, prompt_ids, config, generator):
    """SD with one torch thread: what one device of the pipeline does alone, the fair baseline for ssd-pipeline."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tokens, trace = generate_sd(pair, prompt_ids, config, generator)
    finally:
        torch.set_num_threads(threads)
    trace.method = "sd-1core"
    return tokens, trace


def generate_ssd_pipeline(pair, prompt_ids, config, generator):
    """SSD with the drafter in a second process or device: ssd.pipeline.generate_ssd_pipeline. Imported on first use:
    torch.distributed's import costs a second, and no other method needs it."""
    from .pipeline import generate_ssd_pipeline as generate

    return generate(pair, prompt_ids, config, generator)


METHODS = {
    "ar": generate_ar,  # the target alone: the reference
    "sd": generate_sd,  # speculative decoding
    "sd-1core": generate_sd_1core,  # speculative decoding on one thread (the per-device comparison)
    "ssd": generate_ssd,  # speculative speculative decoding, one process (needs an SSDConfig)
    "ssd-pipeline": generate_ssd_pipeline,  # SSD with the drafter in a second process / device (ssd.pipeline)
    "hf-ar": generate_hf_ar,  # transformers' generate (peer)
    "hf-sd": generate_hf_sd,  # transformers' assisted generation (peer)
}


def get_method(name: str):
    if name not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}; got {name!r}")
    return METHODS[name]


def parse_methods(spec: str) -> list[str]:
    """'ar,sd' -> ['ar', 'sd'], each checked."""
    names = [m.strip() for m in spec.split(",") if m.strip()]
    if not names:
        raise ValueError("methods is empty: give a comma-separated list such as ar,sd")
    for name in names:
        get_method(name)
    return names
