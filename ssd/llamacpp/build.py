"""llama.cpp, pinned and built once into the user cache: the source vendored in PyPI's llama-cpp-python sdist
(``VERSION``, checked by its sha256), compiled with cmake for this CPU (``GGML_NATIVE``), which gives the shared
library llama-cpp-python's ctypes bindings load and the tools the kit runs (``TOOLS``: llama.cpp's own speculative
decoding among them).

PyPI has no llama-cpp-python wheel for Linux, and a build takes a few minutes on 2 cores (4 to 6 on this project's
AMD EPYC), so nothing builds it unless asked: ``python -m ssd llamacpp --build`` (or the first bench or profile that
names a llama.cpp method) builds it with a progress bar; ``make test`` never does, and its llama.cpp tests skip
where no build is found. The build is kept per version and per CPU (its flags: a native build may use instructions
another CPU lacks), written in a work folder and renamed into place whole, with ``complete.json`` last.
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass

from tqdm.auto import tqdm

from ..files import cache_dir, cache_lock

VERSION = "0.3.36"  # llama-cpp-python, whose sdist vendors llama.cpp (ggml 0.25.3 at this version)
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
TOOLS = ("llama-speculative-simple", "llama-bench")  # the binaries the kit runs, beside the library
CMAKE_OPTIONS = ("-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON", "-DGGML_NATIVE=ON",
                 # relative run paths: the finished folder is renamed into place and must still find its libraries
                 "-DCMAKE_BUILD_RPATH_USE_ORIGIN=ON",
                 "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_SERVER=OFF",
                 "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_EXAMPLES=ON")
BUILD_MINUTES = 6  # on 2 cores, what the progress line promises (4 to 6 measured on the AMD EPYC, 2026-12-06)


class LlamaCppUnavailable(RuntimeError):
    """llama.cpp is not built here and cannot be (no cmake or compiler, no network for the sdist); one line."""


@dataclass(frozen=True)
class LlamaCpp:
    """A finished build: its folder, where its shared libraries and tools lie, and its Python bindings."""
    folder: pathlib.Path

    @property
    def bin(self) -> pathlib.Path:
        return self.folder / "build" / "bin"  # llama.cpp writes its libraries and tools together here

    @property
    def python(self) -> pathlib.Path:
        return self.folder / "python"  # llama-cpp-python's pure-Python package, llama_cpp/, loads libllama from bin

    def tool(self, name: str) -> pathlib.Path:
        return self.bin / name

    def describe(self) -> dict:
        return json.loads((self.folder / "complete.json").read_text())


def cpu_digest() -> str:
    """What a native build depends on: the machine and every CPU flag (/proc/cpuinfo), in 8 hex digits."""
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.split(":")[0].strip() in ("flags", "Features")), "")
    except OSError:
        pass
    key = json.dumps([platform.machine(), sorted(flags.partition(":")[2].split())])
    return hashlib.sha256(key.encode()).hexdigest()[:8]


def folder() -> pathlib.Path:
    """Where this version's build for this CPU lives (whole or absent)."""
    return cache_dir() / "llama.cpp" / f"{VERSION}-{cpu_digest()}"


def built() -> LlamaCpp | None:
    """The finished build for this CPU, or None."""
    try:
        marker = json.loads((folder() / "complete.json").read_text())
    except (OSError, ValueError):
        return None
    return LlamaCpp(folder()) if marker.get("version") == VERSION else None


def missing_tools() -> list[str]:
    """What a build needs that this machine lacks (cmake, a C++ compiler), by name."""
    compilers = [os.environ.get("CXX") or "", "c++", "g++", "clang++"]
    missing = [] if shutil.which("cmake") else ["cmake"]
    return missing + ([] if any(c and shutil.which(c) for c in compilers) else ["a C++ compiler (g++ or clang++)"])


def ensure(progress: bool = True) -> LlamaCpp:
    """The build, made now where there is none (minutes on 2 cores: BUILD_MINUTES); LlamaCppUnavailable, one line, where
    it cannot be made. One process builds while others wait for it (``cache_lock``)."""
    found = built()
    if found:
        return found
    if missing := missing_tools():
        raise LlamaCppUnavailable(f"llama.cpp is not built here and cannot be: {', '.join(missing)} not found "
                                  f"(install them, then `python -m ssd llamacpp --build`)")
    with cache_lock("llama.cpp"):
        if not built():
            _build(progress)
    return built()


def _build(progress: bool) -> None:
    root = folder()
    root.parent.mkdir(parents=True, exist_ok=True)
    work = pathlib.Path(tempfile.mkdtemp(prefix=f".{root.name}.work-{os.getpid()}-", dir=root.parent))
    try:
        _log(progress, f"building llama.cpp (llama-cpp-python {VERSION}) for this CPU into {root}: about "
                       f"{BUILD_MINUTES} minutes on 2 cores, once")
        source = _unpack(_download(work), work)
        _cmake(source / "vendor" / "llama.cpp", work / "build", progress)
        shutil.copytree(source / "llama_cpp", work / "python" / "llama_cpp")
        marker = {"version": VERSION, "sdist_sha256": SDIST_SHA256, "cmake": list(CMAKE_OPTIONS),
                  "cpu_digest": cpu_digest(), "tools": list(TOOLS)}
        shutil.rmtree(source)  # 300 MB of sources, no longer needed
        (work / "complete.json").write_text(json.dumps(marker, indent=1))
        if root.exists():
            shutil.rmtree(root)  # an incomplete folder from an older layout
        os.replace(work, root)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _download(work: pathlib.Path) -> pathlib.Path:
    """The sdist from PyPI (pip, so its index settings hold), checked against the pinned sha256."""
    out = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                          f"llama-cpp-python=={VERSION}", "-d", str(work)], capture_output=True, text=True)
    sdists = list(work.glob("llama_cpp_python-*.tar.gz"))
    if out.returncode or not sdists:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise LlamaCppUnavailable(f"llama.cpp: cannot download llama-cpp-python=={VERSION}'s source from PyPI: {last}")
    digest = hashlib.sha256(sdists[0].read_bytes()).hexdigest()
    if digest != SDIST_SHA256:
        raise LlamaCppUnavailable(f"llama.cpp: llama-cpp-python=={VERSION}'s sdist has sha256 {digest}, pinned "
                                  f"{SDIST_SHA256}")
    return sdists[0]


def _unpack(sdist: pathlib.Path, work: pathlib.Path) -> pathlib.Path:
    with tarfile.open(sdist) as tar:
        tar.extractall(work, filter="data")
    sdist.unlink()
    return work / f"llama_cpp_python-{VERSION}"


def _cmake(source: pathlib.Path, build: pathlib.Path, progress: bool) -> None:
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    _run(["cmake", "-S", str(source), "-B", str(build), *generator, *CMAKE_OPTIONS], "configure")
    command = ["cmake", "--build", str(build), "-j", str(os.cpu_count() or 1), "--target", "llama", *TOOLS]
    with tqdm(total=None, desc="building llama.cpp", unit="step", disable=not progress) as bar:
        _run(command, "build", bar)


STEP = re.compile(r"^\[\s*(\d+)/(\d+)\]|^\[\s*(\d+)%\]")  # ninja's [n/N], make's [ p%]


def _run(command: list[str], what: str, bar=None) -> None:
    """Run a cmake step; its lines move the bar; on failure its last lines, in one, name what went wrong."""
    tail = []
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        for line in proc.stdout:
            tail = (tail + [line.strip()])[-3:]
            if bar is not None and (m := STEP.match(line)):
                done, total = (int(m[1]), int(m[2])) if m[1] else (int(m[3]), 100)
                bar.total = total
                bar.n = done
                bar.refresh()
    if proc.returncode:
        raise LlamaCppUnavailable(f"llama.cpp: cmake {what} failed ({proc.returncode}): {' | '.join(tail)}")


def _log(progress: bool, message: str) -> None:
    if progress:
        print(f"[ssd.llamacpp] {message}", file=sys.stderr, flush=True)
