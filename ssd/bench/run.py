"""The benchmark: methods run side by side on the same prompts, in one process, interleaved per prompt.

Figures worth trusting on a noisy clock are ratios measured in one run, so every method sees each prompt (each turn
of a Spec-Bench row) before the next starts, each of ours next to its transformers peer, and the order rotates from
answer to answer so no method always runs first (answer_order). Beside one summary per method, the bench reports per
category as Spec-Bench does (by_category).

A long bench is resumable: with a checkpoint file it writes every finished prompt's rows there (atomically), and a
run of the same arguments that finds the file skips those prompts. Side by side stays per prompt, so the ratios hold;
SSD's carried estimates (``ssd.core.tuning.Autotune``, one for the whole bench) start again from the prior where a run
resumes.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import time

import pandas as pd
import torch
from tqdm.auto import tqdm

from ..core.decoding import DecodeConfig
from ..models.forwards import graphs_made
from ..files import write_json
from .lossless import identity_report, text_identity
from ..checks import check_at_least, parse_variant
from .methods import get_method, resolve, tunes
from ..names import ENGINE_AR
from .prompts import encode
from ..clock import ForwardClock
from ..core.trace import Trace
from .frames import rounds_frame, spans_frame
from ..core.tuning import Autotune, tuned_latencies
from .summaries import PARTNERS, against_peers, by_category, is_ssd, profile_prediction, summarize, time_breakdown


def run_one(method: str, pair, prompt_ids, config: DecodeConfig, seed: int, autotune: Autotune | None = None
            ) -> tuple[list[int], dict, Trace]:
    """One answer of a method (or a variant, ``ssd.bench.methods``) and its row: a batch of one."""
    return run_batch(method, pair, [prompt_ids], config, seed, autotune)[0]


def run_batch(method: str, pair, contexts: list[list[int]], config: DecodeConfig, seed: int,
              autotune: Autotune | None = None) -> list[tuple[list[int], dict, Trace]]:
    """A batch of answers of a method in one call (all its rows share every forward), and a row for each.

    A row's wall_s is the call's: what each sequence of the batch waited. Its tokens_per_s is its share of the
    batch's throughput, new tokens over wall_s / b (over a batch their mean is the batch's total tokens/s; b = 1:
    the answer's own rate); sequence_tokens_per_s is its own rate, new tokens over wall_s (per-sequence latency).
    A method on auto learns from the autotune (and goes on updating it).
    """
    generate, config, _ = resolve(method, config, autotune=autotune)
    generator = torch.Generator().manual_seed(seed)
    with ForwardClock(target=pair.target, draft=pair.draft) as clock:
        start = time.perf_counter()
        answers, traces = generate(pair, contexts, config, generator)
        wall = time.perf_counter() - start
    if parse_variant(method)[0] in ENGINE_AR:  # another engine loads its models in the call: its own clock starts after
        wall = traces[0].wall_s
    forwards = _forwards(clock, wall)
    return [(tokens, _row(method, tokens, trace, wall, len(contexts)) | forwards | _reported(trace), trace)
            for tokens, trace in zip(answers, traces)]


def _reported(trace: Trace) -> dict:
    """The round figures of an engine that reports only totals (Trace.reported), in the row's own columns."""
    if not trace.reported:
        return {}
    got = trace.reported
    rounds, drafted = got.get("rounds"), got["drafted"]
    return {"drafted": drafted, "accepted": got["accepted"], "rounds": rounds, "drafting_rounds": rounds,
            "mean_k": drafted / rounds if rounds else None, "mean_accepted": got["accepted"] / rounds if rounds else None,
            "acceptance_rate": got["accepted"] / drafted if drafted else None,
            "tokens_per_round": got["new_tokens"] / rounds if rounds else None,
            "engine_new_tokens": got["new_tokens"]}


def _forwards(clock: ForwardClock, wall: float) -> dict:
    """Where a call's time went (the batch's, like wall_s): each model's forwards, their count, the target's first
    (the prompt's pass, fused or not), and the rest (sampling, verification, bookkeeping; for the pipeline, also the
    waits for the drafter, whose forwards run in its own process)."""
    return {"target_forwards": clock.calls["target"], "target_forward_s": clock.seconds["target"],
            "first_target_forward_s": clock.first_s["target"], "draft_forwards": clock.calls["draft"],
            "draft_forward_s": clock.seconds["draft"],
            "outside_forwards_s": wall - clock.seconds["target"] - clock.seconds["draft"]}


def _row(method: str, tokens: list[int], trace: Trace, wall: float, b: int) -> dict:
    drafting = [r for r in trace.rounds if r.draft_len > 0]
    budgets = [r.budget for r in trace.rounds if getattr(r, "budget", None) is not None]
    return {
        "method": method,
        "batch_size": b,
        "new_tokens": len(tokens),
        "wall_s": wall,
        "tokens_per_s": len(tokens) * b / wall,
        "sequence_tokens_per_s": len(tokens) / wall,
        # The paper's measure: tokens over the time after the prompt's pass (fused with the first round: after that
        # round, whose tokens are then the prompt's), for the peers as for ours.
        "prefill_s": trace.prefill_s,
        "prefill_tokens": trace.prefill_tokens,
        "decode_tokens_per_s": (len(tokens) - trace.prefill_tokens) * b / trace.decode_s if trace.decode_s else None,
        "drafted": trace.drafted,
        "accepted": sum(r.accepted for r in trace.rounds),
        "rounds": len(trace.rounds),
        "acceptance_rate": trace.acceptance_rate,
        "mean_accepted": trace.mean_accepted,
        # Tokens per target forward: Spec-Bench's "mean accepted tokens" (1 for AR; None where a peer has no rounds).
        "tokens_per_round": trace.tokens_per_round,
        "hit_rate": trace.hit_rate,
        # SSD at batch b: the share of this sequence's rounds in which every sequence of the batch hit
        "all_hit_rate": trace.all_hit_rate,
        # The K and B the rounds used (the tuner's choices with k or budget "auto"): K over rounds that drafted.
        "drafting_rounds": len(drafting),
        "mean_k": sum(r.draft_len for r in drafting) / len(drafting) if drafting else None,
        "mean_budget": sum(budgets) / len(budgets) if budgets else None,
    }


def batch_size_of(method: str, batch_size: int = 1) -> int:
    """How many prompts a method decodes at once in a bench: its variant's batch_size=, else the bench's."""
    return parse_variant(method)[1].get("batch_size", batch_size)


WARM_UP_TOKENS = 8  # on a CPU; a GPU warms up over a whole answer (warm_up)


def answer_order(methods: list[str], j: int) -> list[str]:
    """The order in which the methods give answer j. Each of ours runs next to its transformers peer (PARTNERS; and
    llama.cpp's SD next to its AR) where both run, as a block: a slow spell of the machine (a minute or so here,
    hitting every method it overlaps) then falls on both answers of a ratio or on neither. Before blocks, ar and hf-ar stood three answers apart in one
    prompt of four, and that quarter of the prompts held 40-81% of the spread of ar / hf-ar in the four peer benches
    on the AVX-512 CPU (data/peers_*.json). The blocks rotate from answer to answer, and within a block the first
    alternates, so no method always runs first or always after the same one."""
    blocks, placed = [], set()
    for method in methods:
        if method in placed:
            continue
        partner = PARTNERS.get(method) or next((ours for ours, peer in PARTNERS.items() if peer == method), None)
        block = [method] + ([partner] if partner in methods and partner not in placed else [])
        placed.update(block)
        blocks.append(block)
    turn = j % len(blocks)
    return [m for block in blocks[turn:] + blocks[:turn] for m in (block[::-1] if j % 2 else block)]


def warm_up(pair, contexts: list[list[int]], methods: list[str], config: DecodeConfig, batch_size: int = 1,
            autotune: Autotune | None = None) -> None:
    """One untimed call per method, at its batch size: first calls pay for allocator growth and lazy initialisation.
    On a CPU with eager forwards a short one does; a GPU loads each kernel at its first use and picks kernels by shape
    as the context grows, so there it decodes a whole answer (after 8 tokens, an H200's first timed AR answer in
    bfloat16 still took 2.0 s against 0.13 s for the next, in make gpu-check on 2026-12-04), and so do compiled
    forwards, whose graphs are made for the widths and cache buckets an answer meets (after 8 tokens the first timed
    answers still compiled). The methods on auto learn from these calls too (the bench's autotune), as from every
    other."""
    whole = pair.target.device.type != "cpu" or pair.forward == "compiled"
    tokens = config.max_new_tokens if whole else min(WARM_UP_TOKENS, config.max_new_tokens)
    short = dataclasses.replace(config, max_new_tokens=tokens)
    for method in methods:
        run_batch(method, pair, contexts[: batch_size_of(method, batch_size)], short, 0, autotune)


def run_bench(pair, prompts, methods: list[str], config: DecodeConfig, seed: int = 0, progress: bool = True,
              profile=None, checkpoint: str | None = None, batch_size: int = 1,
              autotune: Autotune | None = None) -> dict:
    """Returns {"rows": [...], "summary": [...], "categories": [...], "peers": [...], "breakdown": [...],
    "spans": [...]}: one row per (method, generated answer), one summary row per method, the per-category report
    (by_category), ours against the transformers peers (against_peers), where each method's time went
    (time_breakdown), and the timed blocks of every answer decoded by this call (Trace.spans_frame's rows with the
    answer's prompt_id; for ssd.analysis.timeline.timeline).

    A prompt with several turns (MT-bench's rows in Spec-Bench) gives one answer, and one row, per turn: its first
    turn under the prompt's id, turn t under "ID/turnT". Each method answers turn t after its own answer to turn t - 1
    (at temperature 0 every lossless method's answer is AR's, so all see the same context).

    Batches: prompts go in groups as large as the largest batch size among the methods (batch_size, or a
    variant's ``batch_size=``); each method answers a group's turn in calls of its own batch size, and every method
    answers it before the next turn or group starts, in an order rotated from group to group (answer_order). Where
    any method batches, the prompts are first ordered by their first turn's length, as a server groups requests, so a
    batch's rows need little left padding in the prompts' pass (compute-bound on a CPU, and padding is paid in full);
    every method gets the same batches. Answer j (over the whole run, in that order) is the first of its call, or alone,
    with seed + j.

    config is shared by every method (an SSDConfig carries what ssd needs; the others ignore those fields). The
    methods on auto (K, B or the backup) are priced on the autotune's profile at their batch size and learn from it:
    one Autotune for the whole bench, so an answer starts from the estimates the last one on its settings left. With a
    latency profile (ssd.bench.profile), or several by the batch size they were timed at ({b: profile}), the summaries
    of SD and the SSD methods at a b one was timed at also hold the prediction it gives. checkpoint: a path where
    the rows so far are kept after each group, and read back by a later run of the same arguments, which goes on
    from the next group (the caller removes it once the result is safe).
    """
    check_at_least(batch_size, "batch_size")
    for p in prompts:  # a template that rewrites answers fails here, not after minutes of decoding
        encode(pair.tokenizer, p, [[]] * (len(p.turns) - 1))
    for m in methods:  # and so does a method on auto with no latencies at its batch size
        if tunes(m, config):
            tuned_latencies(autotune, batch_size_of(m, batch_size))
    size = max(batch_size_of(m, batch_size) for m in methods)
    if size > 1:
        prompts = sorted(prompts, key=lambda p: len(encode(pair.tokenizer, p)))
    identity = _identity(pair, prompts, methods, config, seed, batch_size)
    rows, rounds, done = _resume(checkpoint, identity)
    spans = []
    _say_ragged_end(len(prompts), size)
    if done < len(prompts):
        warm_up(pair, [encode(pair.tokenizer, p) for p in prompts[done : done + size]], methods, config, batch_size,
                autotune)
    j = sum(len(p.turns) for p in prompts[:done])  # the answer's index over the whole run
    bar = tqdm(total=sum(len(p.turns) for p in prompts) * len(methods), initial=j * len(methods), desc="bench",
               disable=not progress)
    for first in range(done, len(prompts), size):
        group = prompts[first : first + size]
        answers = {method: [[] for _ in group] for method in methods}  # each method's answers so far, by prompt
        for turn in range(max(len(p.turns) for p in group)):
            members = [i for i, p in enumerate(group) if turn < len(p.turns)]
            contexts = {method: [encode(pair.tokenizer, group[i], answers[method][i]) for i in members]
                        for method in methods}
            order = answer_order(methods, j)
            turn_rows, runs = _run_turn(pair, [group[i] for i in members], turn, contexts, order, config, seed, j,
                                        profile, bar, batch_size, autotune)
            _report_identity(pair, config, turn_rows, runs, contexts, seed + j)
            for row, (method, i, tokens, trace, frame) in zip(turn_rows, runs):
                answers[method][members[i]].append(_without_eos(tokens, pair.eos_token_ids))
                if frame is not None:
                    rounds.append(frame)
                spans += spans_frame(trace).assign(method=method, prompt_id=row["prompt_id"],
                                                       call=row["call"]).to_dict("records")
            rows += turn_rows
            j += len(members)
        if checkpoint:
            write_json(checkpoint, {"identity": identity, "prompts_done": first + len(group), "rows": rows,
                                    "rounds": [r for f in rounds for r in f.to_dict("records")]})
    bar.close()
    frame = pd.DataFrame(rows)
    summary = summarize(frame, pd.concat(rounds) if rounds else None, profile, config)
    return {"rows": rows, "summary": summary, "categories": by_category(frame), "peers": against_peers(frame),
            "breakdown": time_breakdown(frame).to_dict("records"), "spans": spans}


def _say_ragged_end(n: int, size: int) -> None:
    """Once, where prompts do not divide into batches: the last one is smaller (its rows run at that batch size)."""
    if size > 1 and n % size:
        print(f"[bench] {n} prompts in groups of {size}: the last group holds {n % size}, and its batches are that "
              "small", file=sys.stderr)


def _identity(pair, prompts, methods: list[str], config: DecodeConfig, seed: int, batch_size: int) -> dict:
    """What a checkpoint must match to be resumed: the pair and its precisions, the prompts, methods, seed, batch
    size and every setting."""
    settings = {f.name: repr(getattr(config, f.name)) for f in dataclasses.fields(config)}
    return {"pair": pair.name, "precisions": pair.precisions.label, "prompts": [p.id for p in prompts],
            "methods": list(methods), "seed": seed, "batch_size": batch_size, "config": settings}


def _resume(checkpoint: str | None, identity: dict) -> tuple[list[dict], list[pd.DataFrame], int]:
    """The rows, round frames and number of prompts a checkpoint holds (none if there is no file)."""
    if not checkpoint or not os.path.exists(checkpoint):
        return [], [], 0
    with open(checkpoint) as f:
        state = json.load(f)
    if state.get("identity") != identity:
        differ = sorted(k for k in identity if state.get("identity", {}).get(k) != identity[k])
        raise ValueError(f"checkpoint {checkpoint} holds a bench of other arguments ({', '.join(differ)} differ): "
                         "remove it to start afresh, or run the same arguments to resume")
    rounds = pd.DataFrame(state["rounds"])
    print(f"[bench] resuming from {checkpoint}: {state['prompts_done']} of {len(identity['prompts'])} prompts done",
          file=sys.stderr)
    return state["rows"], [rounds] if len(rounds) else [], state["prompts_done"]


def _run_turn(pair, members: list, turn: int, contexts: dict, order: list[str], config, seed: int, first: int,
              profile, bar, batch_size: int, autotune: Autotune | None):
    """Every method, in the given order, answers one turn of each member prompt from its own contexts, in calls of
    its batch size (the call starting at member i with seed + first + i; first: the index of the turn's first answer
    over the run). A row's ``call`` is the index of its call's first answer: the answers of one call share it.
    Returns the rows and (method, member index, tokens, trace, its frame or None) per answer."""
    rows, runs = [], []
    for method in order:
        b = batch_size_of(method, batch_size)
        for start in range(0, len(members), b):
            bar.set_postfix_str(f"{_answer_id(members[start], turn)} {method}" + (f" x{b}" if b > 1 else ""))
            graphs = graphs_made()
            answered = run_batch(method, pair, contexts[method][start : start + b], config, seed + first + start,
                                 autotune)
            graphs = graphs_made() - graphs  # compiled forwards: graphs this call made (its time includes them)
            for i, (tokens, row, trace) in enumerate(answered, start=start):
                prompt = members[i]
                # Labelled with the variant, not the trace's method: two variants of one method are summarised apart.
                frame = rounds_frame(trace).assign(method=method) if trace.rounds else None
                if profile is not None and is_ssd(method):  # Theorem 7 fed by the profile
                    row["profile_tokens_per_s"] = profile_prediction(profile, resolve(method, config).config, b,
                                                                      frame)
                rows.append({"prompt_id": _answer_id(prompt, turn), "category": prompt.category, "turn": turn + 1,
                             "prompt_tokens": len(contexts[method][i]), "target_dtype": pair.precisions.target,
                             "draft_dtype": pair.precisions.draft, "forward": pair.forward, "call": first + start,
                             "graphs_made": graphs, **row})
                runs.append((method, i, tokens, trace, frame))
                bar.update()
    return rows, runs


def _answer_id(prompt, turn: int) -> str:
    return prompt.id if turn == 0 else f"{prompt.id}/turn{turn + 1}"


def _without_eos(tokens: list[int], eos) -> list[int]:
    """An answer as the next turn's context holds it: the chat template (or the separator) closes the turn itself."""
    return tokens[:-1] if tokens and tokens[-1] in eos else tokens


def _report_identity(pair, config: DecodeConfig, rows: list[dict], runs, contexts: dict, seed: int) -> None:
    """Greedy runs: add to each row whether its tokens equal AR's alone (batch size 1) from the same context (where
    not, the first difference and AR's margin there). AR's own run serves where it ran that context alone; elsewhere
    (no ar among the methods, ar in a batch, or a method whose earlier answer left AR's) an untimed AR run does.
    Another engine's methods (ENGINE_AR: llama.cpp, whose target is the GGUF file itself) are held against that
    engine's AR in the same way, their answers compared as text (``text_identity``)."""
    keys = [tuple(contexts[method][i]) for method, i, *_ in runs]
    if config.temperature > 0:
        for row in rows:
            row["identical_to_target"] = None
        return
    references = {(method, key): (tokens, trace) for key, (method, _, tokens, trace, _) in zip(keys, runs)
                  if method in ("ar", *ENGINE_AR.values()) and trace.batch_size == 1}
    for row, key, (method, _, tokens, _, _) in zip(rows, keys, runs):
        reference_method = ENGINE_AR.get(parse_variant(method)[0], "ar")  # another engine: its own AR
        if (reference_method, key) not in references:
            generate = get_method(reference_method)
            references[reference_method, key] = generate(pair, list(key), config, torch.Generator().manual_seed(seed))
        reference, trace = references[reference_method, key]
        if reference_method == "ar":
            row.update(identity_report(tokens, reference, trace.rounds, pair.precisions.target))
        else:
            row.update(text_identity(tokens, reference, trace.rounds, pair.tokenizer, pair.eos_token_ids))
