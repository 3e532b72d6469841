"""Checking that a decoding method is lossless: greedy token identity, and at temperature > 0 a chi-square test of
its outputs against the target's exact distribution (brute force over a tiny vocabulary).

The tests and notebook 01 share these functions, so what the notebook shows is what CI checks.
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import torch
from scipy.stats import chisquare
from tqdm.auto import tqdm

from .methods import get_method
from .prompts import encode

# A check fails when its p-value falls below this: with a handful of fixed-seed checks the chance of a false alarm is
# negligible, while a wrong residual or an off-by-one in acceptance moves p-values to ~1e-50 (see tests/test_verify.py).
ALPHA = 1e-4


def chi_square_p(observed_counts, expected_probs, min_expected: float = 5.0) -> float:
    """p-value of Pearson's chi-square test; cells expected below min_expected are pooled into one."""
    observed = np.asarray(observed_counts, dtype=float)
    expected = np.asarray(expected_probs, dtype=float)
    expected = expected / expected.sum() * observed.sum()
    if observed[expected == 0].any():
        return 0.0  # a token the target never emits was emitted: no statistics needed
    small = expected < min_expected
    if small.any():
        observed = np.append(observed[~small], observed[small].sum())
        expected = np.append(expected[~small], expected[small].sum())
        if expected[-1] == 0:
            observed, expected = observed[:-1], expected[:-1]
    return float(chisquare(observed, expected).pvalue)


def exact_target_distribution(pair, prompt, n_new, temperature):
    """P(x_1..x_n | prompt) under the target for every one of V^n continuations, by brute force (tiny V only)."""
    V = pair.vocab_size
    if V**n_new > 100_000:
        raise ValueError(f"vocab_size ** n_new must be at most 100000 to enumerate; got {V}**{n_new}")
    continuations = torch.tensor(list(itertools.product(range(V), repeat=n_new)))
    ids = torch.cat([torch.tensor(prompt).expand(len(continuations), -1), continuations], dim=1)
    with torch.inference_mode():
        logits = pair.target(input_ids=ids.to(pair.target.device)).logits[:, len(prompt) - 1 : -1].float().cpu()
    logp = torch.log_softmax(logits / temperature, dim=-1).gather(-1, continuations[..., None]).squeeze(-1)
    return logp.sum(-1).exp()


def sequence_index(tokens, vocab_size) -> int:
    """The index of a continuation in exact_target_distribution's order."""
    index = 0
    for t in tokens:
        index = index * vocab_size + t
    return index


# ---- greedy identity, and where it fails at a reduced precision -----------------------------------------------------

# A difference from AR at a reduced precision is rounding, not a bug, when the target's top two logits there lie
# within this many units in the last place (at the top logit's magnitude) of each other. bfloat16 keeps 8 significant
# bits, so Qwen's top logits (16 to 32) sit on a grid 0.125 apart; a pass over K + 1 tokens and a one-token pass sum
# in different orders through every layer and were measured to move the top-2 margin by up to 2 steps (0.25 over
# 349 positions of HumanEval and prose with a bfloat16 output layer, 0.15 with the float32 one a target now keeps;
# docs/precision.md, "Greedy identity"); a flip needs a margin below that drift. The bound is twice the largest drift
# measured.
# float32 gets no bound: there the output must be the target's, token for token.
NEAR_TIE_ULPS = 4
# int4 and int8w (ssd.models.int4, ssd.models.int8_weights): the weights are the same bits in every pass; what a pass
# rounds differently is its bfloat16 activations and the kernel's bfloat16 outputs, as in a bfloat16 model.
MANTISSA_BITS = {"bfloat16": 7, "float16": 10, "int4": 7, "int8w": 7}


def first_difference(tokens, reference) -> int | None:
    """Index of the first position where two outputs differ (a shorter one differs where it ends); None if equal."""
    tokens, reference = list(tokens), list(reference)
    if tokens == reference:
        return None
    return next((i for i, (a, b) in enumerate(zip(tokens, reference)) if a != b), min(len(tokens), len(reference)))


def near_tie_bound(top_logit: float, precision: str) -> float | None:
    """The largest top-2 margin at which the target's greedy choice may flip by rounding at this precision: 0 in
    float32 (no flip is allowed), NEAR_TIE_ULPS units in the last place at the top logit's magnitude in bfloat16,
    float16, int4 and int8w (bfloat16 activations), None for int8 (activations quantized per call: no rounding bound to
    state)."""
    if precision == "float32":
        return 0.0
    if precision not in MANTISSA_BITS:
        return None
    exponent = math.floor(math.log2(max(abs(top_logit), 1e-30)))
    return NEAR_TIE_ULPS * 2.0 ** (exponent - MANTISSA_BITS[precision])


def identity_report(tokens, reference, reference_rounds, precision: str) -> dict:
    """Is a greedy output the target's own, and if not, where does it first differ and how close a call was AR's
    choice there? reference_rounds: AR's rounds, one per token, with top_logit and margin (Round objects, or the rows
    of its trace frame)."""
    if isinstance(reference_rounds, pd.DataFrame):
        reference_rounds = list(reference_rounds.itertuples())
    diff = first_difference(tokens, reference)
    report = {"identical_to_target": diff is None, "first_difference": diff, "margin_at_difference": None,
              "near_tie": None}
    if diff is not None and diff < len(reference_rounds) and reference_rounds[diff].margin is not None:
        at = reference_rounds[diff]
        bound = near_tie_bound(at.top_logit, precision)
        report.update(margin_at_difference=at.margin, near_tie=None if bound is None else at.margin <= bound)
    return report


def text_identity(tokens, reference, reference_rounds, tokenizer, eos) -> dict:
    """Greedy identity of two answers of an engine whose speculative tool hands its answer back as text (llama.cpp:
    ``ssd.llamacpp.peers``, where the answer's tokens are that text tokenized again): the same text, the end of
    generation aside, and both ended alike. Where not, the first token at which the two token lists part and the
    reference AR's top-2 margin there; near_tie stays None (no rounding bound is stated for that engine's
    quantized kernels: the margin is the evidence)."""
    def text(answer):
        answer = list(answer)
        return tokenizer.decode(answer[:-1] if answer and answer[-1] in eos else answer, skip_special_tokens=False)

    def ended(answer):
        return bool(answer) and answer[-1] in eos

    same = text(tokens) == text(reference) and ended(tokens) == ended(reference)
    diff = None if same else first_difference(tokens, reference)
    margin = reference_rounds[diff].margin if diff is not None and diff < len(reference_rounds) else None
    return {"identical_to_target": same, "first_difference": diff, "margin_at_difference": margin, "near_tie": None}


def identity_table(decoded: dict, precision: str, reference: str = "ar") -> pd.DataFrame:
    """identity_report for every prompt and method of experiments.decode results, {method: (runs, rounds, tokens)},
    against the reference method's tokens and rounds (AR: the target alone). One row per (prompt, method)."""
    if reference not in decoded:
        raise ValueError(f"decoded needs the reference method {reference!r}; has {sorted(decoded)}")
    _, ref_rounds, ref_tokens = decoded[reference]
    rows = []
    for method, (_, _, tokens) in decoded.items():
        if method == reference:
            continue
        for prompt_id, new in tokens.items():
            rounds = ref_rounds[ref_rounds.prompt_id == prompt_id]
            rows.append({"prompt_id": prompt_id, "method": method,
                         **identity_report(new, ref_tokens[prompt_id], rounds, precision)})
    return pd.DataFrame(rows)


def greedy_identical(pair, prompts, methods, config, progress: bool = True) -> pd.DataFrame:
    """One row per (prompt, method): does the method's greedy output equal the target alone's (AR), and if not, is
    the first difference at a near-tie of the target's top two logits (identity_report)?"""
    if config.temperature != 0:
        raise ValueError(f"temperature must be 0 for a token-identity check; got {config.temperature}")
    rows = []
    for prompt in tqdm(prompts, desc="lossless", disable=not progress):
        ids = encode(pair.tokenizer, prompt)
        target, ar = get_method("ar")(pair, ids, config, torch.Generator().manual_seed(0))
        for method in methods:
            tokens, _ = get_method(method)(pair, ids, config, torch.Generator().manual_seed(0))
            rows.append({"prompt_id": prompt.id, "method": method, "new_tokens": len(tokens),
                         **identity_report(tokens, target, ar.rounds, pair.precisions.target)})
    return pd.DataFrame(rows)


def distribution_check(pair, prompt_ids, method: str, config, samples: int = 2000, progress: bool = True) -> dict:
    """Sample `samples` outputs of config.max_new_tokens tokens (seed = sample index) and test them against the
    target's exact distribution. Returns the p-value, the acceptance rate seen, and observed vs expected counts per
    continuation (`sequence` is its index in exact_target_distribution's order), likeliest first."""
    if config.temperature <= 0:
        raise ValueError(f"temperature must be > 0 for a distribution check; got {config.temperature}")
    expected = exact_target_distribution(pair, prompt_ids, config.max_new_tokens, config.temperature)
    counts = torch.zeros(len(expected))
    accepted = drafted = 0
    run = get_method(method)
    for seed in tqdm(range(samples), desc=f"{method} samples", disable=not progress):
        tokens, trace = run(pair, prompt_ids, config, torch.Generator().manual_seed(seed))
        counts[sequence_index(tokens, pair.vocab_size)] += 1
        accepted += sum(r.accepted for r in trace.rounds)
        drafted += trace.drafted
    table = pd.DataFrame({"sequence": range(len(counts)), "observed": counts.numpy(),
                          "expected": expected.numpy() * samples})
    return {"method": method, "samples": samples, "p_value": chi_square_p(counts, expected),
            "acceptance_rate": accepted / drafted if drafted else None,
            "table": table.sort_values("expected", ascending=False, ignore_index=True)}

