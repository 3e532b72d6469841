"""The accept / recover / bonus step: hand-built edge cases, then a statistical test that it is lossless."""

import pytest
import torch

import ssd.core.verify
from ssd.core.sampling import draw, one_hot, probs_from_logits, residual, sample_from_uniform, uniforms
from ssd.core.verify import verify

from ssd.bench.lossless import ALPHA, chi_square_p


def dist(*values):
    return torch.tensor(values, dtype=torch.float32)


# ---- hand-built cases --------------------------------------------------------------------------------------------


def test_no_draft_samples_the_target_token_from_p():
    p = dist(0.2, 0.5, 0.3)[None]
    v = verify(torch.tensor([], dtype=torch.long), p[:0], p, torch.tensor([]), 0.25)
    # cdf 0.2, 0.7: u=0.25 falls on token 1; with nothing drafted it is a plain target token, as in AR
    assert (v.accepted, v.token, v.role) == (0, 1, "target")


def test_all_accepted_when_draft_equals_target_then_bonus():
    q = dist(0.1, 0.6, 0.3).repeat(3, 1)
    p = torch.cat([q, dist(0.0, 0.0, 1.0)[None]])
    v = verify(torch.tensor([1, 0, 2]), q, p, torch.tensor([0.999, 0.999, 0.999]), 0.5)
    assert (v.accepted, v.token, v.role) == (3, 2, "bonus")


def test_greedy_draws_are_the_argmax_as_sampling_would_find_it():
    """At temperature 0 every distribution is one-hot: the argmax shortcut (sampling.draw) must give the token the
    inverse CDF gives, for any u, and verify's greedy path the verdict of the general one, draft q of any shape."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(40, 50, generator=gen)
    p = probs_from_logits(logits, 0.0)
    for u in (0.0, 0.3, 1 - 2**-53):
        assert torch.equal(draw(p, torch.full((40,), u, dtype=torch.float64), greedy=True),
                           sample_from_uniform(p, torch.full((40,), u, dtype=torch.float64)))
    for trial in range(200):
        k = trial % 5
        p = probs_from_logits(torch.randn(k + 1, 50, generator=gen), 0.0)  # [k + 1, V]
        q = probs_from_logits(torch.randn(k, 50, generator=gen), 0.0) if trial % 2 else torch.softmax(
            torch.randn(k, 50, generator=gen), -1)  # one-hot drafts, and drafts from a wider q
        tokens = p[:k].argmax(-1) if trial % 3 == 0 else sample_from_uniform(q, uniforms(k, gen))  # some all accepted
        u, last = uniforms(k, gen), float(uniforms(1, gen)[0])
        assert verify(tokens, q, p, u, last, greedy=True) == verify(tokens, q, p, u, last)


def test_acceptance_threshold_is_p_over_q():
    q = dist(0.8, 0.2)[None]
    p = dist(0.4, 0.6).repeat(2, 1)  # p(0)/q(0) = 0.5
    bonus_u = 0.0
    assert verify(torch.tensor([0]), q, p, torch.tensor([0.49]), bonus_u).accepted == 1
    rejected = verify(torch.tensor([0]), q, p, torch.tensor([0.5]), bonus_u)
    assert rejected.accepted == 0 and rejected.role == "recovered"
    assert rejected.token == 1  # residual max(p - q, 0) = (0, 0.4): all mass on token 1


def test_token_the_target_never_emits_is_always_rejected_and_never_recovered():
    q = dist(0.5, 0.5, 0.0)[None]
    p = dist(0.0, 0.3, 0.7).repeat(2, 1)
    for u in (0.0, 0.5, 0.999):
        v = verify(torch.tensor([0]), q, p, torch.tensor([u]), u)
        assert v.accepted == 0 and v.token != 0


def test_rejection_in_the_middle_recovers_from_that_positions_residual():
    q = torch.stack([dist(1, 0, 0), dist(0, 1, 0), dist(0, 0, 1)])
    p = torch.stack([dist(1, 0, 0), dist(0.25, 0.25, 0.5), dist(0, 0, 1), dist(1, 0, 0)])
    # x_2 = 1 is accepted with p/q = 0.25: u = 0.9 rejects it; the residual at position 2 is (0.25, 0, 0.5) / 0.75.
    v = verify(torch.tensor([0, 1, 2]), q, p, torch.tensor([0.0, 0.9, 0.0]), 0.5)
    assert (v.accepted, v.token) == (1, 2)
    v = verify(torch.tensor([0, 1, 2]), q, p, torch.tensor([0.0, 0.9, 0.0]), 0.3)
    assert (v.accepted, v.token) == (1, 0)


def test_greedy_accepts_exactly_the_argmax_prefix():
    draft_logits = torch.tensor([[0.0, 5.0, 1.0], [3.0, 0.0, 1.0], [0.0, 0.0, 9.0]])
    target_logits = torch.tensor([[0.0, 4.0, 1.0], [2.0, 0.0, 1.0], [0.0, 7.0, 1.0], [5.0, 0.0, 0.0]])
    q, p = probs_from_logits(draft_logits, 0), probs_from_logits(target_logits, 0)
    for u in (0.0, 0.5, 0.999):
        v = verify(torch.tensor([1, 0, 2]), q, p, torch.full((3,), u), u)
        assert (v.accepted, v.token) == (2, 1)  # the third drafted token (2) differs from the argmax (1)


def test_deterministic_proposal_is_accepted_with_probability_p():
    p = dist(0.3, 0.7).repeat(2, 1)
    q = one_hot([1], 2)
    assert verify(torch.tensor([1]), q, p, torch.tensor([0.69]), 0.0).accepted == 1
    v = verify(torch.tensor([1]), q, p, torch.tensor([0.7]), 0.0)
    assert (v.accepted, v.token) == (0, 0)  # residual of a one-hot proposal: p without the proposed token


def test_shapes_are_checked():
    p = dist(0.5, 0.5).repeat(2, 1)
    with pytest.raises(ValueError, match="q \\[K, V\\]"):
        verify(torch.tensor([0, 1]), p, p, torch.tensor([0.1, 0.1]), 0.1)


def test_inverse_cdf_skips_zero_mass_tokens_at_both_ends():
    probs = dist(0.0, 0.5, 0.0, 0.5, 0.0)
    assert int(sample_from_uniform(probs, 0.0)) == 1
    assert int(sample_from_uniform(probs, 0.5)) == 3
    assert int(sample_from_uniform(probs, 1.0 - 1e-17)) == 3  # rounds to the total: still a token of mass
    rows = torch.stack([probs, dist(0.5, 0.5, 0.0, 0.0, 0.0)])  # a batch: only the first row rounds to its total
    assert sample_from_uniform(rows, torch.tensor([1.0 - 1e-17, 0.7], dtype=torch.float64)).tolist() == [3, 1]
    assert sample_from_uniform(rows, torch.tensor([0.2, 1.0 - 1e-17], dtype=torch.float64)).tolist() == [1, 1]


def test_residual_of_equal_distributions_falls_back_to_p():
    p = dist(0.25, 0.75)
    assert torch.equal(residual(p, p), p)


# ---- the statistical test: the emitted tokens are distributed as the target's ----------------------------------


def decode(p_rows, q_rows, K, length, n, seed=0, verify_fn=verify):
    """n sequences of `length` tokens decoded round by round, with p and q that depend only on the position.

    The target then makes position j independent of the rest with law p_rows[j], so the emitted sequences must
    follow the product of p_rows: each position, and the joint of positions across a round boundary.
    """
    g = torch.Generator().manual_seed(seed)
    sequences = []
    for _ in range(n):
        out = []
        while len(out) < length:
            pos = len(out)
            q = q_rows[pos : pos + K]
            drafted = sample_from_uniform(q, uniforms(K, g))
            u = uniforms(K + 1, g)
            v = verify_fn(drafted, q, p_rows[pos : pos + K + 1], u[:K], u[K])
            out += drafted[: v.accepted].tolist() + [v.token]
        sequences.append(out[:length])
    return torch.tensor(sequences)


P = torch.tensor(
    [
        [0.50, 0.25, 0.15, 0.10, 0.00],
        [0.05, 0.10, 0.20, 0.30, 0.35],
        [0.30, 0.30, 0.20, 0.10, 0.10],
        [0.10, 0.60, 0.10, 0.10, 0.10],
        [0.20, 0.20, 0.20, 0.20, 0.20],
    ]
)
Q = torch.tensor(
    [
        [0.10, 0.20, 0.30, 0.20, 0.20],
        [0.40, 0.30, 0.10, 0.10, 0.10],
        [0.25, 0.25, 0.25, 0.15, 0.10],
        [0.70, 0.10, 0.10, 0.05, 0.05],
        [0.20, 0.20, 0.20, 0.20, 0.20],
    ]
)


def fit_p_values(n=6000, seed=0, verify_fn=verify):
    """Chi-square p-values: each of 3 positions, then the joint of positions 0 and 1 and of positions 1 and 2."""
    K, V = 2, P.shape[1]
    seqs = decode(P, Q, K, length=3, n=n, seed=seed, verify_fn=verify_fn)
    ps = [chi_square_p(torch.bincount(seqs[:, j], minlength=V), P[j]) for j in range(3)]
    for j in (0, 1):
        joint = torch.outer(P[j], P[j + 1]).flatten()
        ps.append(chi_square_p(torch.bincount(seqs[:, j] * V + seqs[:, j + 1], minlength=V * V), joint))
    return ps


def test_emitted_tokens_follow_the_target_at_every_position():
    assert min(fit_p_values()) > ALPHA


@pytest.mark.parametrize(
    "broken",
    [
        pytest.param(lambda p, q: p, id="recover-from-p"),  # forgets to subtract the draft's mass
        pytest.param(lambda p, q: q, id="recover-from-q"),
        pytest.param(lambda p, q: (q - p).clamp_min(0) / (q - p).clamp_min(0).sum(), id="residual-sign-flipped"),
    ],
)
def test_the_statistical_test_catches_a_wrong_residual(monkeypatch, broken):
    monkeypatch.setattr(ssd.core.verify, "residual", broken)
    assert min(fit_p_values()) < ALPHA


def test_the_statistical_test_catches_an_off_by_one_in_acceptance():
    def off_by_one(draft_tokens, q, p, accept_u, sample_u):  # judges x_i by the target row of the next position
        return verify(draft_tokens, q, torch.cat([p[1:], p[-1:]]), accept_u, sample_u)

    assert min(fit_p_values(verify_fn=off_by_one)) < ALPHA
