"""Latency curves: what every speed-up rests on, measured for a pair at its precisions on the cores each rank has.

Three curves and a floor (``python -m ssd profile``):
- the target's pass time against the tokens it verifies (1 to 17, at a context of 128 tokens): SD pays when a pass
  over K + 1 tokens costs about one step, as on a GPU; in float32 on a CPU it costs two or more;
- the draft's time for one depth of SSD's tree pre-speculation against its branch rows (1 to 32): the forward over
  the rows, each a branch node that sees the context and itself, and the draw of each row's next token, timed as
  ``ssd.core.tree.draft_tree`` runs them. SSD pays when B branches cost about one row. At one row it is a draft step;
- the draft's glue step against the tokens it feeds (as the target's): after a hit SSD feeds t* and the K cached
  tokens and takes the logits after them before the tree, as ``CachedModel.logits`` does (one pass, the output
  layer on the last slot alone; profiles stored before December 2026 timed it as two passes, a pass over all but
  the last without the output layer then a one-token step, which at 5 tokens cost half as much again as one pass);
- the physical floor beside them: the one-token step that reading every weight once at this core set's measured
  memory bandwidth would take. A step far above its floor is compute- or overhead-bound, not memory-bound.

At batch size b (``--batch-size``) every curve is timed over b rows at once, as a batched run makes its passes: the
target's over b x n tokens (b rows of n), the draft's tree over b x B rows (B branches for each of b sequences; at
B = 1 a batched draft step), the glue step over b rows; so SD's E / (cK + v) and Theorem 7 can be fed at every b.

Each curve is also given as a ratio to its one-token step. Theorem 7 can take its latencies from a profile
(``ssd.core.theory.theorem7_from_profile``). A profile is measured once per machine, pair, precision and core set and
kept in the user cache (``cached_profile``); any change of those measures again. Profiles measured on known kinds of
machine are also kept with the kit (``data/<machine>/profiles/``, ``python -m ssd profile --store data``): a notebook reads the
one of this kind rather than spend minutes measuring it (``stored_profile``), recognised, like a stored bench, by what
decides its numbers and never by its timings.
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
import time

import torch
from tqdm.auto import tqdm

from ..core import tree  # the tree is timed as SSD drafts it (tree.draft_tree, looked up at each call)
from ..core.cached_model import CachedModel
from ..checks import check_at_least
from ..core.latencies import Profile
from ..models.timing import CONTEXT, curve_ms, fixed_ids, round_robin_ms
from ..models.cores import check_cores, pinned
from ..models.devices import synchronize
from ..files import KIT_ROOT, atomic_path, cache_dir
from ..models.int4 import kernel_of
from ..models.kernels import library_of
from ..models.auto_precision import RULE
from ..models.capability import capability, kind_of, machine_kind
from ..models.precision import weight_bytes
from ..models.rescored_logits import RescoredLogits
from ..core.theory import expected_tokens, sd_from_profile
from .machines import commit

# K + 1 for K = 0..8, every draft length the tuner weighs (here a pass over 4 tokens cost what one over 5 did, 6%
# above the line between 3 and 5), and for K = 16
TARGET_TOKENS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 17)
DRAFT_ROWS = (1, 2, 4, 8, 16, 32)  # branch rows of one depth of the pre-speculation tree (budget B)
TREE_DEPTHS = 2  # depths of the tree each timing of draft_tree drafts (its time is given per depth)
# 2: the draft's rows timed as draft_tree runs them, draw included (a bare forward left out the draw over the
# vocabulary, 40% of a depth at 32 rows on this project's CPUs), and the glue step added
VERSION = 2
KIT_PROFILES = str(KIT_ROOT / "data")  # the profiles kept with the kit, data/<machine>/profiles (none when installed)
BANDWIDTH_MB = 1024  # the buffer the bandwidth is read from: larger than any cache


# ---- timing the passes ----------------------------------------------------------------------------------------------


def _primed_draft(model, context: int, more: int, batch: int = 1) -> tuple[CachedModel, list[int]]:
    """The draft as SSD holds it, a CachedModel of `batch` rows, each with the same `context` fixed tokens cached;
    and those tokens and `more`."""
    draft = CachedModel(model, rows=batch)
    ids = fixed_ids(model, context + more).tolist()
    draft.extend({row: ids[:context] for row in range(batch)})
    return draft, ids


@torch.inference_mode()
def tree_depth_ms(model, rows, *, context: int = CONTEXT, reps: int = 3, depths: int = TREE_DEPTHS, batch: int = 1
                  ) -> dict[int, float]:
    """Median milliseconds of one depth of SSD's tree pre-speculation over n branch rows for each of `batch`
    sequences after `context` cached tokens, for each n in rows: ``ssd.core.tree.draft_tree`` itself, `depths` deep, per
    depth (its forwards over the b x n rows with their tree masks, each row's draw from its distribution at
    temperature 1, the drafts handed back; the tree leaves the cache as it found it)."""
    draft, ids = _primed_draft(model, context, max(rows), batch)
    u, fan_out = torch.full((depths,), 0.5, dtype=torch.float64), [0] * (depths + 1)
    seqs = range(batch)

    def run(n):  # n branches of each sequence, each after the whole context
        branches = [(0, t) for t in ids[context : context + n]]
        tree.draft_tree(draft, dict.fromkeys(seqs, context), dict.fromkeys(seqs, branches), dict.fromkeys(seqs, u),
                        1.0, 1.0, dict.fromkeys(seqs, fan_out))

    return {n: ms / depths for n, ms in round_robin_ms(rows, reps, model.device, run).items()}


@torch.inference_mode()
def glue_ms(model, sizes, *, context: int = CONTEXT, reps: int = 3, batch: int = 1) -> dict[int, float]:
    """Median milliseconds of SSD's glue step over n new tokens in each of `batch` rows after `context` cached ones,
    for each n in sizes: ``CachedModel.logits(keep=1)``, as ``ssd.core.speculation.branch_drafts`` calls it."""
    draft, ids = _primed_draft(model, context, max(sizes), batch)

    def undo(n):
        for row in range(batch):
            draft.rollback(context, row)

    return round_robin_ms(sizes, reps, model.device,
                           lambda n: draft.logits(dict.fromkeys(range(batch), ids[: context + n]), keep=1), undo=undo)


def memory_bandwidth_gbs(mb: int = BANDWIDTH_MB, reps: int = 3, device="cpu") -> float:
    """GB/s read on the current cores (or from a GPU's own memory), over a buffer larger than any cache: the best of a
    reduction and a float32 matrix-vector product (the operation a one-token step is made of), each the best of reps.
    A floor is a bound, so it takes the fastest read seen; a model step may still stream a little faster (prefetching
    differs)."""
    matrix = torch.ones(mb * 2**20 // 4 // 4096, 4096, device=device)
    vector = torch.ones(4096, device=device)
    best = float("inf")
    for read in (matrix.sum, lambda: torch.mv(matrix, vector)):
        read()  # warm-up
        for _ in range(reps):
            synchronize(device)
            start = time.perf_counter()
            read()
            synchronize(device)
            best = min(best, time.perf_counter() - start)
    return matrix.numel() * 4 / best / 1e9


def step_bytes(model) -> int:
    """Bytes a one-token step must read: every weight, except the input embedding table (one row of it is read),
    unless the output layer shares it, and except a rescored output layer's float32 rows but its candidates'
    (``RescoredLogits``: 64 of the 1.5B target's 151,936, 0.93 GB, are read a token)."""
    total = weight_bytes(model)
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    tied = head is not None and getattr(head, "weight", None) is embed.weight
    if isinstance(head, RescoredLogits):
        rows, width = head.exact.shape
        total -= (rows - min(rows, head.CANDIDATES)) * width * head.exact.element_size()
    return total if tied else total - embed.weight.numel() * embed.weight.element_size()


# ---- the profile ---------------------------------------------------------------------------------------------------


def measure(pair, *, verifier_cores="0", drafter_cores="1", tokens=TARGET_TOKENS, rows=DRAFT_ROWS,
            context: int = CONTEXT, reps: int = 5, progress: bool = True, batch_size: int = 1) -> Profile:
    """Time the target on the verifier's cores and the draft on the drafter's, one after the other, each pass over
    batch_size rows."""
    v_cores, d_cores = check_cores(verifier_cores, "verifier_cores"), check_cores(drafter_cores, "drafter_cores")
    check_at_least(batch_size, "batch_size")
    if context + max(max(tokens), TREE_DEPTHS * max(rows)) > pair.max_context:
        raise ValueError(f"context={context} plus the largest pass does not fit the pair's {pair.max_context} tokens")
    bar = tqdm(total=2 * len(tokens) + len(rows), desc="profile", disable=not progress)
    bandwidth = {}
    with pinned(v_cores):
        bandwidth["target"] = memory_bandwidth_gbs(device=pair.target.device)
        bar.set_postfix_str("target")
        target = curve_ms(pair.target, tokens, context=context, reps=reps, batch=batch_size)
        bar.update(len(tokens))
    with pinned(d_cores):
        bandwidth["draft"] = memory_bandwidth_gbs(device=pair.draft.device)
        bar.set_postfix_str("draft")
        tree = tree_depth_ms(pair.draft, rows, context=context, reps=reps, batch=batch_size)
        bar.update(len(rows))
        glue = glue_ms(pair.draft, tokens, context=context, reps=reps, batch=batch_size)
        bar.update(len(tokens))
    bar.close()
    return Profile(pair.name, pair.precisions.as_dict(), capability(), v_cores, d_cores, context, target, tree,
                   bandwidth, {"target": step_bytes(pair.target), "draft": step_bytes(pair.draft)},
                   time.strftime("%Y-%m-%dT%H:%M:%S"), glue, batch_size, commit=commit(), forward=pair.forward)


def profile_path(pair, verifier_cores, drafter_cores, context: int = CONTEXT, tokens=TARGET_TOKENS,
                 rows=DRAFT_ROWS, batch_size: int = 1):
    cap = capability()
    key = [VERSION, RULE, pair.name, pair.precisions.target, pair.precisions.draft, str(pair.target.device), cap["cpu"],
           cap["isa"], cap["flags"], cap["torch"], check_cores(verifier_cores, "verifier_cores"),
           check_cores(drafter_cores, "drafter_cores"), context, list(tokens), list(rows)]
    key += [batch_size] if batch_size != 1 else []  # b = 1 keeps the name it always had
    key += [pair.forward] if pair.forward != "eager" else []  # compiled: another profile; eager keeps its name
    key += [f"int4 {k}" for k in (kernel_of(pair.target), kernel_of(pair.draft)) if k == "ssd"]  # the kit's int4
    # kernel (ssd.models.int4_kernel): another profile; torch's keeps the name it always had
    key = json.dumps(key + [library_of(pair.target), library_of(pair.draft)])  # which library multiplied (ssd.models.kernels)
    return cache_dir() / "profiles" / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def cached_profile(pair, *, verifier_cores="0", drafter_cores="1", remeasure: bool = False, progress: bool = True,
                   stored: str | None = None, **options) -> Profile:
    """The pair's profile on these cores from the user cache; else, where `stored` names a folder of the kit's stored
    profiles, the one measured on this kind of machine (``stored_profile``); else measured now (and kept).
    remeasure: measure now whatever is kept."""
    path = profile_path(pair, verifier_cores, drafter_cores, **options)
    if path.exists() and not remeasure:
        try:
            return Profile.from_dict(json.loads(path.read_text()))
        except (ValueError, TypeError, KeyError):
            pass  # an unreadable or older file: measure again
    found = None if remeasure or not stored else stored_profile(stored, pair, verifier_cores=verifier_cores,
                                                                 drafter_cores=drafter_cores, **options)
    if found is not None:
        return found
    profile = measure(pair, verifier_cores=verifier_cores, drafter_cores=drafter_cores, progress=progress, **options)
    save(profile, path)
    return profile


# ---- profiles kept with the kit -------------------------------------------------------------------------------------


def _kind(profile: Profile) -> dict:
    """The kind of machine a profile was measured on (a profile times CPU cores: its device is the CPU)."""
    return kind_of({"device": "cpu", "capability": profile.capability})


def answers_for(profile: Profile, pair, verifier_cores="0", drafter_cores="1", context: int = CONTEXT,
                tokens=TARGET_TOKENS, rows=DRAFT_ROWS, batch_size: int = 1) -> bool:
    """Whether a stored profile stands for one measured here now: the same pair at the same precisions, this kind of
    machine (``ssd.models.capability.machine_kind``) and torch, the same cores, context and sizes, and every curve of
    this version. Its timings, date and commit do not count: they never repeat, even on the machine that measured it,
    and a curve measured at another commit still prices this one's passes."""
    return (profile.engine == "torch" and profile.pair == pair.name
            and profile.precisions.get("target") == pair.precisions.target
            and profile.precisions.get("draft") == pair.precisions.draft
            and profile.forward == pair.forward
            and _kind(profile) == machine_kind(pair.target.device)
            and profile.capability.get("torch") == capability()["torch"]
            and profile.verifier_cores == check_cores(verifier_cores, "verifier_cores")
            and profile.drafter_cores == check_cores(drafter_cores, "drafter_cores")
            and profile.context == context and profile.batch_size == batch_size
            and sorted(profile.target_ms) == sorted(tokens)
            and sorted(profile.draft_ms) == sorted(rows) and profile.glue_ms is not None)


def stored_profile(folder: str, pair, **options) -> Profile | None:
    """The profile that answers for this pair here (``answers_for``) among the JSON files in `folder`, in its
    profiles/, or in the profiles/ of each machine's folder under it (data/<machine>/profiles), or None."""
    patterns = ("*.json", os.path.join("profiles", "*.json"), os.path.join("*", "profiles", "*.json"))
    for path in sorted(p for pattern in patterns for p in glob.glob(os.path.join(folder, pattern))):
        try:
            candidate = load(path)
        except (ValueError, TypeError, KeyError):
            continue  # not a profile
        if answers_for(candidate, pair, **options):
            return candidate
    return None


def stored_name(profile: Profile) -> str:
    """A file name for a profile kept with the kit: the pair, its precisions, the forward where compiled, and a digest
    of the kind of machine, torch and the cores, so profiles of several kinds of machine sit side by side in one
    folder."""
    key = json.dumps([_kind(profile), profile.capability.get("torch"), profile.verifier_cores, profile.drafter_cores,
                      profile.context], sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:8]
    batch = f"_b{profile.batch_size}" if profile.batch_size != 1 else ""
    engine = "" if profile.engine == "torch" else f"{profile.engine}_"
    forward = "" if profile.forward == "eager" else f"_{profile.forward}"  # eager keeps the name it always had
    return (f"{engine}{profile.pair}_{profile.precisions['target']}_{profile.precisions['draft']}{forward}{batch}"
            f"_{digest}.json")


def regime(profile: Profile, k: int = 4, a: float = 0.8) -> dict:
    """The two ratios that decide what SD can gain (docs/precision.md, "The regime"): v, a verify pass over K + 1
    tokens in one-token steps, and c, a draft step over a target step; SD's speed-up E / (c K + v) they give at
    acceptance a, and the decode tokens/s that is (the speed-up over one step: what auto's rule compares between
    precisions, ssd.models.auto_precision). Also the one-token step beside its memory floor."""
    sd = sd_from_profile(profile, k, expected_tokens(a, k))  # c and v, read where the batch study reads them
    return {"target": profile.precisions["target"], "draft": profile.precisions["draft"],
            "step_ms": profile.target_at(1), "floor_ms": profile.floor_ms("target"),
            f"verify_{k + 1}_ms": profile.target_at(k + 1), "v": sd["profile_v"], "draft_ms": profile.draft_at(1),
            "c": sd["profile_c"], f"sd_speedup_at_a_{a:g}": sd["profile_speedup_vs_ar"],
            f"sd_tokens_per_s_at_a_{a:g}": sd["profile_speedup_vs_ar"] * 1000 / profile.target_at(1)}


def save(profile: Profile, path) -> None:
    path = str(path)
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        json.dump(profile.to_dict(), f, indent=1)


def profiles_in(folder: str) -> list[Profile]:
    """Every profile among a folder's JSON files (data/<machine>/profiles: the kit's and llama.cpp's), by name."""
    found = []
    for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
        with open(path) as f:
            record = json.load(f)
        if isinstance(record, dict) and "target_ms" in record:
            found.append(Profile.from_dict(record))
    return found


def load(path) -> Profile:
    with open(path) as f:
        return Profile.from_dict(json.load(f))
