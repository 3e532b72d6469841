"""The kit's own int4 product (``int4_avx512_bf16.cpp``) on CPUs with avx512_bf16: built once per Python environment
(`make install` does it; else the first int4 load), and registered as ``torch.ops.ssd_int4.pack`` /
``torch.ops.ssd_int4.mm`` so that eager and compiled forwards call it alike. Where the CPU lacks avx512_bf16, or the
build fails (no C++ compiler or ninja), ``load`` says so and returns False: int4 then runs on torch's own kernel
(``ssd.models.int4``).

Why: a group's levels unpacked once for every row of a call, so a verify pass of up to 5 tokens costs about a step,
and a step reads near the memory's rate (docs/precision.md, int4).
"""
from __future__ import annotations

import functools
import hashlib
import pathlib
import sys

import torch

from .capability import cpu_flags

SOURCE = pathlib.Path(__file__).with_name("int4_avx512_bf16.cpp")
SOURCE_DIGEST = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]  # a changed layout: levels kept anew
FLAGS = ["-O3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-fopenmp"]  # -fopenmp: else
# at::parallel_for runs on one thread
# What a build depends on: the source, torch and the flags (read once, at import)
BUILD_KEY = hashlib.sha256(SOURCE.read_bytes() + torch.__version__.encode() + " ".join(FLAGS).encode()).hexdigest()[:12]


def supported() -> bool:
    """Whether this CPU has what the kernel is written for (avx512_bf16's vdpbf16ps)."""
    return "avx512_bf16" in cpu_flags()


def folder() -> pathlib.Path:
    """Where the built kernel lives: in the Python environment, beside the installed packages (`make install` builds
    it there), one file per source, torch and flags."""
    return pathlib.Path(sys.prefix) / "share" / "ssd-kernels" / f"int4_avx512_bf16_{BUILD_KEY}"


def library() -> pathlib.Path:
    return folder() / f"{folder().name}.so"


@functools.cache
def load() -> bool:
    """Load the kernel, building it first where it is not built (a C++ compiler and ninja: about 15 s); False where
    it cannot run or be built here, said once."""
    if not supported():
        return False
    if not library().is_file() and not build():
        return False
    torch.ops.load_library(str(library()))
    _register_shapes()
    return True


def build() -> bool:
    """Compile the kernel into folder(); False, said, where it cannot be."""
    from torch.utils import cpp_extension

    print("[ssd.models.int4_kernel] building the kit's int4 kernel (about 15 s, once)", file=sys.stderr)
    try:
        folder().mkdir(parents=True, exist_ok=True)
        cpp_extension.load(name=folder().name, sources=[str(SOURCE)], build_directory=str(folder()),
                           extra_cflags=FLAGS, extra_ldflags=["-fopenmp"], is_python_module=False, verbose=False)
    except (OSError, RuntimeError, ImportError) as error:  # no compiler, no ninja: torch's kernel serves
        print(f"[ssd.models.int4_kernel] the kit's int4 kernel could not be built ({str(error).splitlines()[0]}); "
              "int4 runs on torch's kernel", file=sys.stderr)
        return False
    return library().is_file()


def _register_shapes() -> None:
    """What torch.compile needs to trace through the operators without running them."""
    @torch.library.register_fake("ssd_int4::mm")
    def _(x, packed, out_features):
        return x.new_empty((x.shape[0], out_features), dtype=torch.bfloat16)

    @torch.library.register_fake("ssd_int4::pack")
    def _(q, scales_and_zeros):
        return q.new_empty((q.shape[0] // 16 * (q.shape[1] // 32) * 320,), dtype=torch.uint8)


if __name__ == "__main__":  # make install: build it now, where the CPU has avx512_bf16
    print(f"the kit's int4 kernel: {'built, ' + str(library()) if load() else 'not used on this CPU (torch kernel)'}")
