"""Single-process SSD on tiny random pairs: lossless, tree drafting exact, counterfactual hit rates exact."""
import itertools

import pandas as pd
import pytest
import torch

import ssd.core.proposers
import ssd.core.speculation
import ssd.core.tree
from ssd.core.cache import SpeculationCache
from ssd.core.decoding import generate_ar
from ssd.models.tiny import tiny_pair
from ssd.core.proposers import Draft, DraftModelProposer, NgramProposer, ngram_proposal
from ssd.core.sampling import uniforms
from ssd.analysis.experiments import counterfactual_hits
from ssd.core.speculation import SSDConfig, Speculator, generate_ssd
from ssd.bench.frames import counted_lookups, final_rounds, rounds_frame
from ssd.core.tuning import Autotune
from ssd.core.verify import Verdict

from ssd.bench.lossless import ALPHA, chi_square_p, exact_target_distribution, sequence_index


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(vocab_size=32, agreement_noise=0.1, seed=4)


def run(method, pair, prompt, seed=0, autotune=None, **config):
    options = {"autotune": autotune} if autotune is not None else {}  # the methods on auto take one
    return method(pair, prompt, SSDConfig(**config), torch.Generator().manual_seed(seed), **options)


def tree_and_alone(draft_model):
    """Every branch of one pre-speculation tree beside the same draft drafted alone after its outcome, with the same
    uniforms: [(the tree's Draft, the lone Draft)]."""
    prompt, K = [3, 1, 4, 1, 5], 3
    config = SSDConfig(k=K, temperature=1.0, budget=6)
    speculator = Speculator(draft_model, [prompt], config, draft_model.config.vocab_size)
    speculator.model.prefill(prompt)
    draft = speculator.propose({0: K}, {0: uniforms(K, torch.Generator())})[0]
    u = torch.tensor([0.3, 0.6, 0.9], dtype=torch.float64)
    speculator.prespeculate({0: u})
    assert speculator.model.length() == len(prompt) + K  # the tree was cropped away
    assert speculator.model.cache.get_seq_length() == len(prompt) + K
    cache = speculator.sequences[0].cache
    assert len(cache) == config.budget
    return [(branch, alone(draft_model, prompt + draft.tokens[:k] + [t], K, u)) for (k, t), branch in cache.entries.items()]


def alone(draft_model, prompt, k, u):
    """The draft model's k-token draft after `prompt`, drafted alone (a batch of one)."""
    return DraftModelProposer(draft_model, [prompt], temperature=1.0).propose({0: k}, {0: u})[0]


def assert_tree_drafting_equals_each_branch_alone(draft_model):
    for branch, alone in tree_and_alone(draft_model):
        assert branch.tokens == alone.tokens and branch.source == "cache"
        torch.testing.assert_close(branch.logits, alone.logits, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(branch.q, alone.q, atol=1e-5, rtol=1e-4)


def test_tree_drafting_equals_drafting_each_branch_alone(pair):
    """Pre-speculation drafts every branch in one tree: each cached draft must be what the draft model drafts alone."""
    assert_tree_drafting_equals_each_branch_alone(pair.draft)


def test_proposers_commit_what_the_verdict_accepted(pair):
    """observe keeps each proposer's context the committed tokens, and the draft model's cache a prefix of them."""
    prompt = [1, 2, 3, 1, 2]
    model = DraftModelProposer(pair.draft, [prompt], temperature=0.0)
    draft = model.propose({0: 3}, {0: uniforms(3, torch.Generator())})[0]
    assert model.model.length() == len(prompt) + 2  # the last drafted token is never fed
    model.observe(0, draft, Verdict(accepted=1, token=9, draft_len=3))
    assert model.tokens[0] == prompt + draft.tokens[:1] + [9] and model.model.length() == len(prompt) + 1
    ngram = NgramProposer([prompt], pair.vocab_size, max_n=2)
    lookup = ngram.propose({0: 2}, {0: uniforms(2, torch.Generator())})[0]
    assert lookup.tokens == [3, 1] and lookup.logits is None and lookup.q.sum(-1).tolist() == [1.0, 1.0]
    ngram.observe(0, lookup, Verdict(accepted=2, token=2, draft_len=2))
    assert ngram.tokens[0] == prompt + [3, 1, 2]
    assert lookup.truncated(1).tokens == [3] and lookup.truncated(1).q.shape == (1, pair.vocab_size)


STRATEGIES = ["uniform", "geometric", "calibrated"]


@pytest.mark.integration
@pytest.mark.parametrize("backup", ["jit", "fast"])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_greedy_ssd_is_token_identical_to_the_target(pair, strategy, backup):
    prompts = [[1, 2, 3], [7, 7, 1, 7, 7, 1, 7]]
    for prompt in prompts:
        reference, _ = run(generate_ar, pair, prompt, max_new_tokens=30)
        for budget, c in itertools.product([0, 1, 4, 16, 64], [1.0, 0.7, 0.1, 0.0]):
            tokens, trace = run(generate_ssd, pair, prompt, k=4, max_new_tokens=30, budget=budget,
                                fan_out_strategy=strategy, saguaro_c=c, backup=backup)
            assert tokens == reference, (budget, c)
            if budget == 0:
                assert trace.hit_rate == 0


def test_hits_are_exactly_the_outcomes_ranked_within_the_fan_out(pair):
    _, trace = run(generate_ssd, pair, [5, 6, 7], seed=1, k=4, temperature=1.0, max_new_tokens=60, budget=8)
    frame = rounds_frame(trace)
    assert 0 < frame["hit"].mean() < 1
    for row in frame.itertuples():
        assert row.hit == (pd.notna(row.rank) and row.rank <= row.fan_out[row.accepted])
        assert pd.isna(row.backup) == (row.hit or row.round == len(frame) - 1)  # the backup runs after each miss
    # The hit rate counts every lookup but the last round's, which decides nothing (no round follows it)
    assert trace.hit_rate == pytest.approx(frame["hit"].iloc[:-1].mean())
    assert final_rounds(frame).tolist() == [False] * (len(frame) - 1) + [True]
    two = pd.concat([frame, frame.iloc[:3]])  # a second answer of three rounds
    assert final_rounds(two).tolist() == [False] * (len(frame) - 1) + [True, False, False, True]
    assert len(counted_lookups(two)) == len(frame) - 1 + 2


def test_hit_rate_rises_with_the_budget(pair):
    rates = [run(generate_ssd, pair, [5, 6, 7], k=4, temperature=1.0, max_new_tokens=80, budget=b)[1].hit_rate
             for b in (0, 2, 8, 32)]
    assert rates[0] == 0 and rates == sorted(rates) and rates[-1] > rates[1]


@pytest.mark.parametrize("strategy", ["uniform", "calibrated"])
def test_counterfactual_hit_rates_equal_separate_runs(pair, strategy):
    budgets = [0, 1, 3, 8, 20]
    common = dict(k=3, temperature=0.8, max_new_tokens=50, fan_out_strategy=strategy, a_p=0.8, r=0.7)
    # The curve of either strategy comes from a run with the other: the ranks do not depend on what was cached.
    other = "calibrated" if strategy == "uniform" else "uniform"
    tokens, trace = run(generate_ssd, pair, [2, 9, 4], seed=5, budget=max(budgets),
                        **(common | {"fan_out_strategy": other}))
    predicted = counterfactual_hits(rounds_frame(trace), budgets, k=3, strategy=strategy, a_p=0.8, r=0.7)
    for b in budgets:
        tokens_b, trace_b = run(generate_ssd, pair, [2, 9, 4], seed=5, budget=b, **common)
        assert tokens_b == tokens  # the trajectory does not depend on B (jit backup, C = 1)
        assert predicted[predicted.budget == b].hit.tolist() == [bool(r.hit) for r in trace_b.rounds]


def test_counterfactual_estimates_kept_apart_for_backup_drafted_rounds(pair):
    """apart: a round is backup-drafted at budget B exactly when the round before it missed at B (or it opens the
    run); with every round backed (B = 0 never hits) the backed estimates see every round, as the shared ones do."""
    _, trace = run(generate_ssd, pair, [2, 9, 4], seed=5, budget=8, k=3, temperature=0.8, max_new_tokens=50,
                   fan_out_strategy="calibrated", a_p=0.8, r=0.7)
    frame = rounds_frame(trace)
    apart = counterfactual_hits(frame, [0, 2, 8], k=3, strategy="calibrated", a_p=0.8, r=0.7, apart=True)
    for _, g in apart.groupby("budget"):
        assert g.backed.tolist() == [True] + (~g.hit.to_numpy()[:-1]).tolist()
    shared = counterfactual_hits(frame, [0, 2, 8], k=3, strategy="calibrated", a_p=0.8, r=0.7)
    assert (shared.backed == apart.backed).loc[shared.budget == 0].all() and not apart[apart.budget == 0].hit.any()
    assert apart[apart.budget == 8].hit.any() and set(apart.columns) == {"run", "round", "final", "budget", "backed",
                                                                 "hit"}
    assert apart.groupby("budget").final.sum().eq(1).all() and apart[apart.final]["round"].eq(len(frame) - 1).all()


# ---- temperature > 0: Saguaro and the fast backup stay lossless -------------------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize(
    "options",
    [
        dict(budget=6, saguaro_c=0.2, backup="jit"),
        dict(budget=6, saguaro_c=0.0, backup="jit", fan_out_strategy="calibrated"),
        dict(budget=3, saguaro_c=1.0, backup="fast"),
        dict(budget=6, saguaro_c=0.5, backup="fast", fan_out_strategy="geometric"),
        dict(budget=3, backup="auto", latencies="balanced"),
    ],
    ids=["saguaro-0.2", "saguaro-0-calibrated", "fast", "saguaro-0.5-fast", "auto"],
)
def test_sampled_outputs_follow_the_target_distribution(options):
    assert sampled_fit(options) > ALPHA


@pytest.mark.integration
def test_the_statistical_test_catches_drafting_from_another_q_than_verify_sees(monkeypatch):
    """Saguaro's classic defect: the draft samples from one q and verification uses another."""
    real = ssd.core.proposers.draw

    def sharpened(q, u, greedy):
        return real(q**3, u, greedy)

    monkeypatch.setattr(ssd.core.proposers, "draw", sharpened)
    monkeypatch.setattr(ssd.core.tree, "draw", sharpened)  # the tree pre-speculation draws there
    assert sampled_fit(dict(budget=6, saguaro_c=0.2, backup="jit")) < ALPHA


def sampled_fit(options):
    """p-value of the chi-square test of 3-token SSD outputs against the exact target distribution."""
    pair = tiny_pair(vocab_size=6, agreement_noise=0.2, seed=2)
    prompt, n_new, temperature, n = [1, 4, 2, 1, 4], 3, 0.9, 1500
    expected = exact_target_distribution(pair, prompt, n_new, temperature)
    counts = torch.zeros(len(expected))
    hits = rounds = 0
    used = set()
    options = dict(options)
    if options.pop("latencies", None) == "balanced":  # where auto's estimates keep it between the two backups
        options["autotune"] = Autotune({1: Flat(1.5)})  # on auto the estimates carry over the runs, from the prior
    for seed in range(n):
        tokens, trace = run(generate_ssd, pair, prompt, seed=seed, k=2, temperature=temperature,
                            max_new_tokens=n_new, **options)
        counts[sequence_index(tokens, pair.vocab_size)] += 1
        hits += sum(bool(r.hit) for r in trace.rounds)
        rounds += len(trace.rounds)
        used |= backups_used(trace)
    assert 0.05 < hits / rounds < 0.95  # both the cache and the backup were exercised
    assert used == ({"jit", "fast"} if options["backup"] == "auto" else {options["backup"]})
    return chi_square_p(counts, expected)


def test_saguaro_raises_the_hit_rate_and_lowers_acceptance(pair):
    plain = run(generate_ssd, pair, [5, 6, 7], k=4, temperature=1.0, max_new_tokens=150, budget=8)[1]
    low_c = run(generate_ssd, pair, [5, 6, 7], k=4, temperature=1.0, max_new_tokens=150, budget=8, saguaro_c=0.0)[1]
    assert low_c.hit_rate > plain.hit_rate
    assert low_c.acceptance_rate < plain.acceptance_rate


# ---- the backup on auto -----------------------------------------------------------------------------------------


class Flat:
    """Latencies: a verify pass costs 10 ms whatever its tokens, a draft step (the jit backup's) `draft_ms`, the
    pre-speculation nothing: only the backups differ in cost."""

    def __init__(self, draft_ms: float):
        self.draft_ms = draft_ms

    def target_at(self, n):
        return 10.0

    def draft_at(self, rows):
        return self.draft_ms if rows == 1 else 1e-6  # B >= 2 tree rows: free

    def glue_at(self, n):
        return 1e-6


def backups_used(trace) -> set:
    return {r.backup for r in trace.rounds if r.backup is not None}


@pytest.mark.parametrize("strategy", ["uniform", "calibrated"])
@pytest.mark.parametrize("draft_ms, same_as", [(0.001, "jit"), (1000.0, "fast")])
def test_auto_runs_exactly_the_backup_the_latencies_favour(pair, draft_ms, same_as, strategy):
    """A nearly free draft model: every miss is backed by it (jit); a dear one: by the n-gram (fast). Each run is then
    the fixed backup's, token for token, hit for hit and fan-out for fan-out: the calibrated fan-out reads the run's
    own estimates, as the fixed backup's does, not the ones auto carries over answers for its choice (a first answer
    warms those, so the second would differ if the fan-out read them)."""
    autotune = Autotune({1: Flat(draft_ms)})
    common = dict(k=3, budget=4, temperature=1.0, max_new_tokens=40, fan_out_strategy=strategy)
    run(generate_ssd, pair, [6, 5, 4], seed=1, backup="auto", autotune=autotune, **common)
    auto_tokens, auto = run(generate_ssd, pair, [5, 6, 7], seed=3, backup="auto", autotune=autotune, **common)
    tokens, fixed = run(generate_ssd, pair, [5, 6, 7], seed=3, backup=same_as, **common)
    assert backups_used(auto) == {same_as} == backups_used(fixed)
    assert auto_tokens == tokens and [r.hit for r in auto.rounds] == [r.hit for r in fixed.rounds]
    assert [r.fan_out for r in auto.rounds] == [r.fan_out for r in fixed.rounds]


def test_a_batch_on_auto_backs_every_miss_of_a_round_with_one_backup(pair):
    """Latencies that keep auto between the two backups, four rows sharing its estimates: the choice moves during the
    run, and a round's misses all go to the same backup (a round that drafts one row with the draft model waits for
    it whatever the other rows' backup)."""
    prompts = [[5, 6, 7], [1, 2, 3, 4], [7, 7, 1], [2, 9]]
    config = SSDConfig(k=3, budget=4, temperature=1.0, max_new_tokens=40, backup="auto")
    _, traces = generate_ssd(pair, prompts, config, torch.Generator().manual_seed(0), autotune=Autotune({4: Flat(3.0)}))
    rounds = itertools.zip_longest(*(trace.rounds for trace in traces))
    backups = [{r.backup for r in batch if r is not None and r.backup is not None} for batch in rounds]
    assert set().union(*backups) == {"jit", "fast"}  # the choice moved
    assert all(len(used) <= 1 for used in backups)


def test_every_miss_scores_what_the_fast_backup_would_have_kept(pair):
    """At each miss the n-gram proposal is scored against the tokens the target went on to produce. Where the fast
    backup itself drafted that round (K = 8, the whole proposal), the score is exactly the count it accepted: a
    one-hot draft token is accepted exactly when the target's token is it, at any temperature."""
    config = SSDConfig(k=8, budget=4, temperature=1.0, max_new_tokens=120, backup="auto")
    autotune = Autotune({1: Flat(1000.0)})
    _, trace = generate_ssd(pair, [7, 7, 1, 7, 7, 1, 7], config, torch.Generator().manual_seed(0), autotune=autotune)
    drafted_by_ngram = [0] + [r + 1 for r, x in enumerate(trace.rounds) if x.backup == "fast"]
    accepted = [trace.rounds[r].accepted for r in drafted_by_ngram if r < len(trace.rounds)]
    scored = autotune.calibrator(config).fast_matched
    assert len(scored) >= 5 and scored == accepted[: len(scored)]
    assert 0 < sum(scored) < 8 * len(scored)  # the proposals were partly right


# ---- pieces ----------------------------------------------------------------------------------------------------


def test_ngram_proposal_copies_what_followed_the_last_match():
    assert ngram_proposal([1, 2, 3, 9, 1, 2, 3], 3, 3) == [9, 1, 2]
    assert ngram_proposal([5, 6, 5], 2, 3) == [6, 5]
    assert ngram_proposal([4, 8, 4], 3, 3) == [8, 4, 4]  # a short continuation is padded with its last token
    assert ngram_proposal([1, 2, 3], 2, 3) == [3, 3]  # no match: repeat the last token
    assert ngram_proposal([5, 6, 5], 0, 3) == []  # a round that drafts nothing (the last before max_new_tokens)


def test_cache_counts_hits_and_misses():
    cache = SpeculationCache()
    spec = Draft([1], torch.ones(1, 2) / 2, None, (1, 1))
    cache.fill({(0, 1): spec})
    assert cache.lookup((0, 1)) is spec and cache.lookup((1, 1)) is None
    assert (cache.hits, cache.misses, cache.hit_rate, len(cache)) == (1, 1, 0.5, 1)


@pytest.mark.parametrize(
    "options,match",
    [
        (dict(budget=-1), "budget \\(B, the number of cached outcomes\\) must be an integer >= 0"),
        (dict(saguaro_c=1.5), "saguaro_c \\(C\\) must lie in \\[0, 1\\]"),
        (dict(saguaro_c=-0.1), "saguaro_c \\(C\\) must lie in \\[0, 1\\]"),
        (dict(fan_out_strategy="zipf"), "fan_out_strategy must be one of uniform, geometric, calibrated"),
        (dict(backup="slow"), "backup must be one of jit, fast, auto"),
    ],
)
def test_bad_ssd_config_is_refused(options, match):
    with pytest.raises(ValueError, match=match):
        SSDConfig(**options)
