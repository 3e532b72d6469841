"""What the peer comparison rests on: AR and SD feed the prompt with their first round (one forward fewer, as
transformers does), decode-only speed counts from the first tokens for ours and the peers alike, every forward of
either model is counted and timed whoever calls it, and the ratios to the peers are geometric means with intervals."""
import math

import pandas as pd
import pytest
import torch

from ssd.bench import run as bench
from ssd.bench import summaries
from ssd.core.cached_model import CachedModel
from ssd.core.decoding import DecodeConfig
from ssd.bench.methods import METHODS
from ssd.models.tiny import tiny_pair
from ssd.clock import ForwardClock

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(vocab_size=32, agreement_noise=0.4, seed=1)


def run(pair, method, prompts=PROMPT, **fields):
    config = DecodeConfig(max_new_tokens=16, **fields)
    with ForwardClock(target=pair.target, draft=pair.draft) as clock:
        tokens, traces = METHODS[method](pair, prompts, config, torch.Generator().manual_seed(0))
    return tokens, traces, clock


@pytest.mark.parametrize("prompts", [PROMPT, [PROMPT, PROMPT[:3]]], ids=["alone", "batch"])
def test_ar_and_sd_make_no_pass_of_their_own_for_the_prompt(pair, prompts):
    _, traces, clock = run(pair, "ar", prompts)
    traces = traces if isinstance(traces, list) else [traces]
    rounds = max(len(t.rounds) for t in traces)
    assert clock.calls == {"target": rounds, "draft": 0}  # one target forward per token, the first with the prompt
    _, traces, clock = run(pair, "sd", prompts, k=3)
    traces = traces if isinstance(traces, list) else [traces]
    rounds = max(len(t.rounds) for t in traces)
    assert clock.calls["target"] == rounds  # one verify pass a round, the first with the prompt
    for trace in traces:  # the first round stands for the prompt's pass in decode tokens/s
        first = max(s.end_s for s in trace.spans if s.round == 0)
        assert trace.prefill_s == first and trace.prefill_tokens == trace.rounds[0].new_tokens
        assert 0 < trace.prefill_s < trace.wall_s


def test_the_peers_report_when_their_first_tokens_came(pair):
    _, ar, _ = run(pair, "hf-ar")
    assert ar.prefill_tokens == 1 and 0 < ar.prefill_s < ar.wall_s
    _, sd, clock = run(pair, "hf-sd", k=3)
    assert 1 <= sd.prefill_tokens <= 4 and 0 < sd.prefill_s < sd.wall_s
    assert clock.calls["draft"] > 0 and clock.first_s["target"] > 0  # the assistant's forwards are counted too


def test_a_forward_inside_another_is_part_of_it(pair):
    model = CachedModel(pair.target)
    with ForwardClock(target=pair.target) as clock:
        model.extend(PROMPT)  # the body alone (no logits): counted once
        model.logits(PROMPT + [7], keep=1)  # the whole model, which calls its body: counted once
    assert clock.calls["target"] == 2 and clock.seconds["target"] >= clock.first_s["target"] > 0
    model.logits(PROMPT + [7, 8], keep=1)  # hooks removed on exit
    assert clock.calls["target"] == 2


def test_a_bench_row_splits_its_time_and_counts_decode_tokens_after_the_first(pair):
    tokens, row, trace = bench.run_one("sd", pair, PROMPT, DecodeConfig(k=3, max_new_tokens=16), seed=0)
    assert row["target_forwards"] == len(trace.rounds)
    assert row["outside_forwards_s"] == pytest.approx(row["wall_s"] - row["target_forward_s"] - row["draft_forward_s"])
    assert row["decode_tokens_per_s"] == pytest.approx((len(tokens) - trace.prefill_tokens) / trace.decode_s)
    assert row["prefill_tokens"] == trace.rounds[0].new_tokens


def test_ratios_to_the_peers_are_geometric_means_over_answers_with_an_interval():
    ratios = {"p0": 1.1, "p1": 0.9, "p2": 1.2}
    rows = pd.DataFrame([{"prompt_id": p, "method": m, "tokens_per_s": 10.0 * (r if m == "sd" else 1.0),
                          "decode_tokens_per_s": 20.0 * (r if m == "sd" else 1.0)}
                         for p, r in ratios.items() for m in ("sd", "hf-sd", "ar")])
    (whole, decode) = summaries.against_peers(rows)
    expected = math.exp(sum(math.log(r) for r in ratios.values()) / 3)
    assert whole["method"] == "sd" and whole["peer"] == "hf-sd" and whole["answers"] == 3
    assert whole["geometric_mean"] == pytest.approx(expected) and decode["geometric_mean"] == pytest.approx(expected)
    assert whole["ci"][0] < expected < whole["ci"][1]
    assert "sd / hf-sd, tokens_per_s: " in summaries.peers_table([whole])
    assert summaries.against_peers(rows[rows.method != "hf-sd"]) == []  # no peer ran: nothing to say


@pytest.mark.parametrize("methods", [["ar", "hf-ar", "sd", "hf-sd"], ["hf-sd", "ar", "sd:k=2", "sd", "hf-ar"],
                                     ["ar", "sd", "hf-sd", "ssd"]])
def test_each_of_ours_answers_next_to_its_peer_and_no_method_always_first(methods):
    orders = [bench.answer_order(methods, j) for j in range(8)]
    for order in orders:
        assert sorted(order) == sorted(methods)  # every method once
        for ours, peer in summaries.PEERS.items():
            if {ours, peer} <= set(methods):
                assert abs(order.index(ours) - order.index(peer)) == 1  # a slow spell falls on both or neither
    for ours, peer in summaries.PEERS.items():
        if {ours, peer} <= set(methods):
            assert sum(o.index(ours) < o.index(peer) for o in orders) == 4  # each goes first half the time
    assert len({o[0] for o in orders}) > 1 and len({o[-1] for o in orders}) > 1
