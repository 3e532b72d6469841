"""The int4 layers of a shipped model, kept beside its float32 cache (``ssd.models.gguf_store``), so that only the
first int4 load quantizes: the 1.5B target's quantizing took 39 s of a 45 s load on the AMD EPYC with avx512_bf16.

What is kept is what the kernel reads (``ssd.models.int4.Levels``): the levels packed, the scales and zeros, and each
layer's largest move. torch lays the packed levels out by the CPU's vector width, so the file is named by torch's
version and the CPU capability it packed for; a machine of another kind sharing the cache packs and keeps its own.
(Keeping the bare levels instead, portable, cost more to unpack at load, 5 s, than the packing it saves.) The file
lives in the model's folder, so a rebuilt cache starts without it; it is written to a temporary name and renamed, and
a disk too full to hold it leaves the next load to quantize again, saying so.
"""
from __future__ import annotations

import contextlib
import os
import pathlib
import sys

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from . import int4, int4_kernel
from .int4 import Levels

FORMAT = 1  # bump when int4.quantize changes what it finds: an old file is then ignored


def file_name() -> str:
    """int4-levels-v1-torch2.13.0+cpu-AVX512.safetensors (torch's kernel) or int4-levels-v1-ssd.safetensors (the
    kit's, one layout everywhere it runs): what the packing depends on."""
    if int4.kernel() == "ssd":
        return f"int4-levels-v{FORMAT}-ssd-{int4_kernel.SOURCE_DIGEST}.safetensors"
    return f"int4-levels-v{FORMAT}-torch{torch.__version__}-{torch.backends.cpu.get_cpu_capability()}.safetensors"


def read(path: pathlib.Path) -> dict[str, Levels]:
    """The layers kept in path, by name; {} where there are none (or the file cannot be read, or lacks a part)."""
    try:
        tensors = load_file(path)
        names = {key.rsplit(".", 1)[0] for key in tensors}
        return {name: Levels(tensors[f"{name}.packed"], tensors[f"{name}.scales_and_zeros"],
                             float(tensors[f"{name}.moved"])) for name in names}
    except (OSError, SafetensorError, KeyError):
        return {}


def write(path: pathlib.Path, levels: dict[str, Levels]) -> None:
    tensors = {}
    for name, layer in levels.items():
        tensors.update({f"{name}.packed": layer.packed, f"{name}.scales_and_zeros": layer.scales_and_zeros,
                        f"{name}.moved": torch.tensor(layer.moved, dtype=torch.float64)})
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        save_file(tensors, tmp)
        os.replace(tmp, path)
    except (OSError, SafetensorError) as error:  # the file only saves time: the load goes on without it
        print(f"[ssd.models.int4_store] could not keep the int4 layers in {path} ({error}); the next int4 load "
              "quantizes again", file=sys.stderr)
    finally:
        tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def kept(folder: pathlib.Path):
    """The layers kept in folder, to hand to ssd.models.precision.convert; what the conversion adds is written back
    after it."""
    path = pathlib.Path(folder) / file_name()
    levels = read(path)
    known = set(levels)
    yield levels
    if set(levels) != known:
        write(path, levels)
