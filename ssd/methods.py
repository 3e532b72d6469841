"""The registry of decoding methods: every entry has the shape generate(pair, prompt_ids, config, generator)."""
from __future__ import annotations

from .decoding import generate_ar, generate_sd
from .peers import generate_hf_ar, generate_hf_sd
from .ssd import generate_ssd

METHODS = {
    "ar": generate_ar,  # the target alone: the reference
    "sd": generate_sd,  # speculative decoding
    "ssd": generate_ssd,  # speculative speculative decoding, one process (needs an SSDConfig)
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
