"""The registry of decoding methods: every entry has the shape generate(pair, prompt_ids, config, generator).

Every method takes one prompt (a list of ids) or a batch of them (a list of lists), and then returns a list of
each; a batch's rows share every forward (``ssd.core.cached_model``).

A bench can run one method at several settings side by side: a method *variant* names a method and the settings it
overrides, ``METHOD:FIELD=VALUE[:FIELD=VALUE]``, e.g. ``sd:k=2``, ``ar:batch_size=8`` or
``ssd-pipeline:k=auto:budget=auto``
(``VARIANT_FIELDS`` are the fields a variant may set).
"""
from __future__ import annotations

import dataclasses

import torch

from ..checks import check_method, parse_variant
from ..core.decoding import batchable, generate_ar, generate_sd
from .peers import generate_hf_ar, generate_hf_sd
from ..core.speculation import generate_ssd


@batchable
def generate_sd_1core(pair, prompts, config, generator):
    """SD with one torch thread: what one device of the pipeline does alone, the fair baseline for ssd-pipeline."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        answers, traces = generate_sd(pair, prompts, config, generator)
    finally:
        torch.set_num_threads(threads)
    for trace in traces:
        trace.method = "sd-1core"
    return answers, traces


def generate_ssd_pipeline(pair, prompt_ids, config, generator):
    """SSD with the drafter in a second process or device: ssd.pipeline.launch.generate_ssd_pipeline. Imported on first use:
    torch.distributed's import costs a second, and no other method needs it."""
    from ..pipeline.launch import generate_ssd_pipeline as generate

    return generate(pair, prompt_ids, config, generator)


METHODS = {
    "ar": generate_ar,  # the target alone: the reference
    "sd": generate_sd,  # speculative decoding
    "sd-1core": generate_sd_1core,  # speculative decoding on one thread (the per-device comparison)
    "ssd": generate_ssd,  # speculative speculative decoding, one process (needs an SSDConfig)
    "ssd-pipeline": generate_ssd_pipeline,  # SSD with the drafter in a second process / device (ssd.pipeline.launch)
    "hf-ar": generate_hf_ar,  # transformers' generate (peer)
    "hf-sd": generate_hf_sd,  # transformers' assisted generation (peer)
}


def get_method(name: str):
    return METHODS[check_method(name)]


def resolve(spec: str, config):
    """The method a variant names and the config it runs with (the shared one, its fields overridden)."""
    name, overrides = parse_variant(spec)
    missing = [f for f in overrides if not hasattr(config, f)]
    if missing:
        raise ValueError(f"method variant {spec!r} sets {', '.join(missing)}, which a {type(config).__name__} lacks")
    return get_method(name), dataclasses.replace(config, **overrides) if overrides else config
