"""AR and SD decoding on tiny random pairs: lossless at temperature 0 and in distribution at temperature > 0."""
import dataclasses

import pytest
import torch

from ssd.bench.frames import rounds_frame
from ssd.bench.methods import generate_ar, generate_sd  # the loops below, each call timed (a stopwatch of its own)
from ssd.core import decoding
from ssd.core.decoding import DecodeConfig, _step, _top_two
from ssd.models.tiny import tiny_pair

from ssd.bench.lossless import ALPHA, chi_square_p, exact_target_distribution, sequence_index


@pytest.fixture(scope="module")
def pairs():
    # noise 0: draft == target (acceptance 1); 0.4: a useful draft; 1: an unrelated draft (acceptance near chance).
    return {noise: tiny_pair(vocab_size=32, agreement_noise=noise, seed=1) for noise in (0.0, 0.4, 1.0)}


def random_prompts(n, vocab_size, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(vocab_size, (int(torch.randint(1, 12, (1,), generator=g)),), generator=g).tolist() for _ in range(n)]


def run(method, pair, prompt, seed=0, **config):
    return method(pair, prompt, DecodeConfig(**config), torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("k", [1, 2, 4, 8])
@pytest.mark.parametrize("noise", [0.0, 0.4, 1.0])
def test_greedy_sd_is_token_identical_to_the_target_alone(pairs, k, noise):
    pair = pairs[noise]
    for i, prompt in enumerate(random_prompts(4, pair.vocab_size)):
        reference, _ = run(generate_ar, pair, prompt, max_new_tokens=40)
        tokens, trace = run(generate_sd, pair, prompt, seed=i, k=k, max_new_tokens=40)
        assert tokens == reference
        assert trace.new_tokens == len(tokens) == 40
        assert all(r.draft_len <= k for r in trace.rounds)


@pytest.mark.parametrize("logits", [[0.5, 3.0, -1.0, 2.0], [3.0, 1.0, 3.0], [1.0, 2.0, 9.0], [9.0, 1.0], [4.0],
                                    [2.0, 2.0, 2.0]])
def test_the_greedy_step_is_the_first_argmax_and_the_margin_its_lead_over_the_second(logits):
    logits = torch.tensor(logits)
    values = logits.topk(min(2, len(logits))).values.tolist()
    first = next(i for i, v in enumerate(logits.tolist()) if v == max(logits.tolist()))
    assert _step(logits, DecodeConfig(temperature=0), torch.Generator().manual_seed(0)) == first
    assert _top_two(logits) == (values[0], values[-1])


def test_acceptance_follows_how_close_the_draft_is(pairs):
    prompt = random_prompts(1, 32)[0]
    rates = {n: run(generate_sd, p, prompt, k=4, max_new_tokens=60)[1].acceptance_rate for n, p in pairs.items()}
    assert rates[0.0] == 1.0
    assert rates[0.4] > rates[1.0]


def test_sd_stops_at_eos_like_the_target(pairs):
    pair = pairs[0.4]
    prompt = random_prompts(1, pair.vocab_size, seed=3)[0]
    free, _ = run(generate_ar, pair, prompt, max_new_tokens=30)
    eos = free[7]
    stop = free.index(eos)  # the first time the target emits it
    pair = dataclasses.replace(pair, eos_token_ids=(eos,))
    reference, _ = run(generate_ar, pair, prompt, max_new_tokens=30)
    assert reference == free[: stop + 1]
    for k in (1, 3, 8):
        assert run(generate_sd, pair, prompt, k=k, max_new_tokens=30)[0] == reference


def test_the_prompt_is_encoded_once_and_rejected_tokens_are_rolled_back(pairs):
    pair = pairs[0.4]
    fed = []
    # The backbone sees every token fed, whether the head scores it or not.
    hook = pair.target.base_model.register_forward_pre_hook(
        lambda m, args, kwargs: fed.append(kwargs["input_ids"].shape[1]), with_kwargs=True)
    try:
        prompt = random_prompts(1, pair.vocab_size, seed=5)[0]
        _, trace = run(generate_sd, pair, prompt, k=4, max_new_tokens=40)
    finally:
        hook.remove()
    assert trace.acceptance_rate < 1  # there were rejections to roll back
    # Round 0 feeds the whole prompt and the drafts (no pass of its own for the prompt, as in transformers); every
    # later round only the token appended last round and the drafts.
    first, *rest = trace.rounds
    assert fed == [len(prompt) + first.draft_len] + [1 + r.draft_len for r in rest]


def test_same_seed_same_tokens_other_seed_other_tokens(pairs):
    pair = pairs[0.4]
    prompt = random_prompts(1, pair.vocab_size, seed=7)[0]
    a = run(generate_sd, pair, prompt, seed=11, k=3, temperature=1.0, max_new_tokens=30)[0]
    b = run(generate_sd, pair, prompt, seed=11, k=3, temperature=1.0, max_new_tokens=30)[0]
    c = run(generate_sd, pair, prompt, seed=12, k=3, temperature=1.0, max_new_tokens=30)[0]
    assert a == b and a != c


def test_trace_frame_has_one_row_per_round(pairs):
    tokens, trace = run(generate_sd, pairs[0.4], [1, 2, 3], k=4, max_new_tokens=20)
    frame = rounds_frame(trace)
    assert len(frame) == len(trace.rounds) and frame["new_tokens"].sum() == len(tokens)
    assert set(frame.columns) >= {"method", "round", "draft_len", "accepted", "token", "draft_s", "verify_s"}
    assert ((frame["accepted"] >= 0) & (frame["accepted"] <= frame["draft_len"])).all()


# ---- temperature > 0: the distribution of whole outputs is the target's ----------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize("method,k", [(generate_ar, 1), (generate_sd, 1), (generate_sd, 2)])
def test_sampled_outputs_follow_the_target_distribution(method, k):
    pair = tiny_pair(vocab_size=6, agreement_noise=0.2, seed=2)
    prompt, n_new, temperature, n = [1, 4, 2], 3, 0.9, 2000
    expected = exact_target_distribution(pair, prompt, n_new, temperature)
    counts = torch.zeros(len(expected))
    accepted = drafted = 0
    for seed in range(n):
        tokens, trace = run(method, pair, prompt, seed=seed, k=k, temperature=temperature, max_new_tokens=n_new)
        counts[sequence_index(tokens, pair.vocab_size)] += 1
        accepted += sum(r.accepted for r in trace.rounds)
        drafted += trace.drafted
    if method is generate_sd:
        assert 0.2 < accepted / drafted < 0.95  # the draft differs from the target: rejections were exercised
    assert chi_square_p(counts, expected) > ALPHA


# ---- bad input -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "config,match",
    [
        (dict(k=0), "k \\(the draft length K\\) must be an integer >= 1"),
        (dict(temperature=-0.1), "temperature must be a number >= 0"),
        (dict(max_new_tokens=0), "max_new_tokens must be an integer >= 1"),
    ],
)
def test_bad_config_is_refused(config, match):
    with pytest.raises(ValueError, match=match):
        DecodeConfig(**config)


def test_bad_prompts_are_refused(pairs):
    pair = pairs[0.4]
    with pytest.raises(ValueError, match="prompt_ids is empty"):
        run(generate_sd, pair, [])
    with pytest.raises(ValueError, match="longer than the context"):
        run(generate_sd, pair, [1] * pair.max_context)
    with pytest.raises(ValueError, match="max_new_tokens=64 does not fit"):
        run(generate_ar, pair, [1] * (pair.max_context - 10), max_new_tokens=64)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        run(generate_ar, pair, [1, pair.vocab_size])


def test_a_trace_keeps_when_each_phase_ran(pairs):
    """The spans of SD's call: each round's draft steps before its verify pass (the first round's feeding the
    prompts), one after another on one clock; their lengths are the rounds' times; a batch's rows share them."""
    _, traces = generate_sd(pairs[0.4], [[1, 2, 3], [4, 5]], DecodeConfig(k=3, max_new_tokens=12),
                            torch.Generator().manual_seed(0))
    first, second = traces
    assert first.spans == second.spans
    spans, longest = first.spans, max(traces, key=lambda t: len(t.rounds))
    assert [(s.round, s.phase) for s in spans] == [(i, p) for i in range(len(longest.rounds))
                                                    for p in ("draft_s", "verify_s")]
    ends = [x for s in spans for x in (s.start_s, s.end_s)]
    assert ends == sorted(ends) and ends[0] >= 0 and ends[-1] <= first.wall_s
    assert first.prefill_s == pytest.approx(spans[1].end_s)  # the first round counts as the prompts' pass
    for r, (draft, verify) in zip(longest.rounds, zip(spans[0::2], spans[1::2])):
        assert draft.end_s - draft.start_s == pytest.approx(r.draft_s)
        assert verify.end_s - verify.start_s == pytest.approx(r.verify_s)


def test_the_loops_time_nothing_of_themselves_and_a_clock_changes_no_token(pairs):
    """The algorithm knows nothing of measurement: called without a clock the loops give the same tokens and rounds,
    every time 0.0, no span, no margin; the timed methods differ only in those."""
    for timed, loop in ((generate_ar, decoding.generate_ar), (generate_sd, decoding.generate_sd)):
        runs = [method(pairs[0.4], [[1, 2, 3], [4, 5]], DecodeConfig(k=3, max_new_tokens=12),
                       torch.Generator().manual_seed(0)) for method in (timed, loop)]
        (timed_tokens, timed_traces), (tokens, traces) = runs
        assert tokens == timed_tokens
        for measured, bare in zip(timed_traces, traces):
            assert bare.wall_s == 0.0 and bare.prefill_s is None and bare.spans == []
            assert all(r.draft_s == r.verify_s == 0.0 and r.margin is None for r in bare.rounds)
            assert [(r.draft_len, r.accepted, r.token, r.new_tokens) for r in bare.rounds] == \
                [(r.draft_len, r.accepted, r.token, r.new_tokens) for r in measured.rounds]
            assert measured.wall_s > 0 and all(r.verify_s > 0 for r in measured.rounds)
    _, measured_ar = generate_ar(pairs[0.4], [1, 2, 3], DecodeConfig(max_new_tokens=6), torch.Generator())
    assert all(r.margin >= 0 and r.top_logit is not None for r in measured_ar.rounds)  # a measured AR keeps margins

