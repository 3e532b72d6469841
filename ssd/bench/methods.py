"""The registry of decoding methods: every entry has the shape generate(pair, prompt_ids, config, generator).

Every method takes one prompt (a list of ids) or a batch of them (a list of lists), and then returns a list of
each; a batch's rows share every forward (``ssd.core.cached_model``).

A bench can run one method at several settings side by side: a method *variant* names a method and the settings it
overrides, ``METHOD:FIELD=VALUE[:FIELD=VALUE]``, e.g. ``sd:k=2``, ``ar:batch_size=8`` or
``ssd-pipeline:k=auto:budget=auto``
(``VARIANT_FIELDS`` are the fields a variant may set: the config's, and batch_size, how many prompts go in one call).

The methods that tune as they go (``TUNED``) also take ``autotune=`` (``ssd.core.tuning.Autotune``): what a run on
auto is priced on and learns from; ``get_method`` and ``resolve`` bind it.

The kit's own methods here are timed: each call gets a stopwatch (``ssd.clock.Stopwatch``) unless given a ``clock=``,
so every trace they return holds its phase times, its spans and (AR) its near-tie margins. The loops of ``ssd.core``
time nothing of themselves; ``ssd.generate_ar`` and the others are these.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

from ..checks import check_method, is_auto, parse_variant
from ..clock import Stopwatch
from ..core import decoding, speculation
from ..core.decoding import batchable
from .peers import generate_hf_ar, generate_hf_sd
from ..llamacpp.peers import generate_llamacpp_ar, generate_llamacpp_sd
from ..core.tuning import on_auto
from ..models.cores import torch_threads


def timed(generate):
    """A method of ``ssd.core`` with a stopwatch of its own for each call, unless the caller gives a clock."""

    @functools.wraps(generate)
    def method(pair, prompt_ids, config, generator, clock=None, **options):
        return generate(pair, prompt_ids, config, generator, clock=clock or Stopwatch(), **options)

    return method


generate_ar = timed(decoding.generate_ar)
generate_sd = timed(decoding.generate_sd)
generate_ssd = timed(speculation.generate_ssd)


@batchable
def generate_sd_1core(pair, prompts, config, generator, autotune=None, clock=None):
    """SD with one torch thread: what one device of the pipeline does alone, the fair baseline for ssd-pipeline."""
    with torch_threads(1):
        answers, traces = generate_sd(pair, prompts, config, generator, autotune=autotune, clock=clock)
    for trace in traces:
        trace.method = "sd-1core"
    return answers, traces


def generate_ssd_pipeline(pair, prompt_ids, config, generator, autotune=None):
    """SSD with the drafter in a second process or device: ssd.pipeline.launch.generate_ssd_pipeline. Imported on first
    use: torch.distributed's import costs a second, and no other method needs it."""
    from ..pipeline.launch import generate_ssd_pipeline as generate

    return generate(pair, prompt_ids, config, generator, autotune=autotune)


METHODS = {
    "ar": generate_ar,  # the target alone: the reference
    "sd": generate_sd,  # speculative decoding
    "sd-1core": generate_sd_1core,  # speculative decoding on one thread (the per-device comparison)
    "ssd": generate_ssd,  # speculative speculative decoding, one process (needs an SSDConfig)
    "ssd-pipeline": generate_ssd_pipeline,  # SSD with the drafter in a second process / device (ssd.pipeline.launch)
    "hf-ar": generate_hf_ar,  # transformers' generate (peer)
    "hf-sd": generate_hf_sd,  # transformers' assisted generation (peer)
    "llamacpp-ar": generate_llamacpp_ar,  # llama.cpp's target alone, on the GGUF files (peer, its own target)
    "llamacpp-sd": generate_llamacpp_sd,  # llama.cpp's speculative decoding (peer, its own target)
}


TUNED = ("sd", "sd-1core", "ssd", "ssd-pipeline")  # the methods that take autotune= (K, B or the backup on auto)


def get_method(name: str, autotune=None):
    """The method of this name; given an Autotune, bound to it where the method takes one (TUNED)."""
    method = METHODS[check_method(name)]
    return functools.partial(method, autotune=autotune) if autotune is not None and name in TUNED else method


class Variant(NamedTuple):
    generate: object  # the method, bound to the autotune where it takes one
    config: object  # the shared config, its fields overridden
    batch_size: int  # how many prompts one call decodes


def resolve(spec: str, config, batch_size: int = 1, autotune=None) -> Variant:
    """The method a variant names, the config it runs with and its batch size (the variant's batch_size=, else
    the given one)."""
    name, overrides = parse_variant(spec)
    batch_size = overrides.pop("batch_size", batch_size)
    missing = [f for f in overrides if not hasattr(config, f)]
    if missing:
        raise ValueError(f"method variant {spec!r} sets {', '.join(missing)}, which a {type(config).__name__} lacks")
    return Variant(get_method(name, autotune), dataclasses.replace(config, **overrides) if overrides else config,
                   batch_size)


def tunes(spec: str, config) -> bool:
    """Whether a method variant tunes as it goes, and so needs an autotune: SD's with K on auto, SSD's with K, B or
    the backup on auto."""
    name, variant = parse_variant(spec)[0], resolve(spec, config).config
    if name in ("ssd", "ssd-pipeline"):
        return on_auto(variant)
    return name in ("sd", "sd-1core") and is_auto(variant.k)
