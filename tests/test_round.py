"""One SSD round (ssd.core.round) on a tiny random pair: the drafter's and the verifier's sides give generate_ssd's
tokens however they are linked, every uniform is drawn by one Draws, and the messages are plain keyword records."""
import ast
import dataclasses
import pickle
from pathlib import Path

import pytest
import torch

import ssd.core.round
import ssd.pipeline.protocol
from ssd.core.decoding import Verifier, batch_traces
from ssd.core.round import DrafterSide, DraftMessage, Draws, InProcess, Verdicts, VerifierSide, verify_rounds
from ssd.core.speculation import SSDConfig, Speculator, generate_ssd
from ssd.clock import Stopwatch
from ssd.core.trace import Round
from ssd.models.tiny import tiny_pair
from ssd.pipeline.protocol import WIRE_TYPES

PROMPTS = [[1, 2, 3], [7, 7, 1, 7, 7, 1, 7]]
RECORD = ["draft_len", "accepted", "token", "new_tokens", "hit", "rank", "fan_out", "budget", "a_p", "r", "backup",
          "all_hit"]


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(vocab_size=32, agreement_noise=0.1, seed=4)


class Wire(InProcess):
    """The in-process speculator, with every message pickled on its way, as the pipeline's channel sends it."""

    def drafts(self):
        message, q = super().drafts()
        return pickle.loads(pickle.dumps(message)), q

    def follow(self, outcome):
        return pickle.loads(pickle.dumps(super().follow(pickle.loads(pickle.dumps(outcome)))))


def two_sided(pair, prompts, config, seed):
    """SSD with each side drawing from a Draws of its own over the same generator state, as the pipeline's ranks
    do: (tokens, traces, the drafter's generator, the verifier's)."""
    drafter_gen, verifier_gen = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
    drafter = DrafterSide(Speculator(pair.draft, prompts, config, pair.vocab_size), Draws(drafter_gen),
                          Stopwatch(origin=0.0))
    verifier = Verifier(pair.target, prompts, config, pair.eos_token_ids)
    traces, watch = batch_traces("ssd", prompts), Stopwatch()
    with watch.whole(*traces):
        drafter.start(prompts, {row: verifier.room(row) for row in verifier.live})
        verify_rounds(VerifierSide(verifier, Draws(verifier_gen), traces, watch, pair.vocab_size), Wire(drafter))
    return verifier.new, traces, drafter_gen, verifier_gen


@pytest.mark.parametrize("options", [dict(temperature=0.8, budget=8, backup="jit"),
                                     dict(temperature=1.0, budget=4, backup="fast", saguaro_c=0.5),
                                     dict(temperature=0.0, budget=16, fan_out_strategy="calibrated")],
                         ids=["sampled-jit", "sampled-fast-saguaro", "greedy-calibrated"])
def test_sides_with_draws_of_their_own_give_generate_ssds_tokens_and_rounds(pair, options):
    config = SSDConfig(k=4, max_new_tokens=30, **options)
    for seed in range(2):
        generator = torch.Generator().manual_seed(seed)
        expected, expected_traces = generate_ssd(pair, PROMPTS, config, generator)
        tokens, traces, drafter_gen, verifier_gen = two_sided(pair, PROMPTS, config, seed)
        assert tokens == expected
        for trace, expected_trace in zip(traces, expected_traces):
            assert [[getattr(r, f) for f in RECORD] for r in trace.rounds] == \
                   [[getattr(r, f) for f in RECORD] for r in expected_trace.rounds]
        # Each side drew the whole stream (its own share and the other's), exactly as far as generate_ssd did
        assert torch.equal(drafter_gen.get_state(), generator.get_state())
        assert torch.equal(verifier_gen.get_state(), generator.get_state())


def test_generate_ssds_trace_keeps_its_phases_in_the_order_they_ran(pair):
    _, trace = generate_ssd(pair, PROMPTS[0], SSDConfig(k=3, max_new_tokens=12, budget=4, temperature=1.0),
                            torch.Generator().manual_seed(0), clock=Stopwatch())
    spans = trace.spans
    assert [s.start_s for s in spans] == sorted(s.start_s for s in spans)
    assert [s.phase for s in spans if s.round == 0] == ["prespec_s", "verify_s", "draft_s"]
    assert all(s.round is not None for s in spans)  # the first drafts are no round's, and one process times none


def test_both_sides_get_the_same_draws_from_one_draws_or_from_two():
    shared = Draws(torch.Generator().manual_seed(3))
    drafter, verifier = (Draws(torch.Generator().manual_seed(3)) for _ in range(2))
    ks, lens = {0: 4, 1: 2}, {0: 4, 1: 1}
    first = shared.first(ks)
    assert all(torch.equal(first[row], drafter.first(ks)[row]) for row in ks)
    verifier.first(ks)  # the drafter's share: skipped
    for i in range(3):
        u_draft, u_verify = shared.round(i, ks, lens)
        assert shared.round(i, ks, lens) == (u_draft, u_verify)  # the other side's ask: the same tensors, not new ones
        assert all(torch.equal(u_draft[row], drafter.round(i, ks, lens)[0][row]) for row in ks)
        assert all(torch.equal(u_verify[row], verifier.round(i, ks, lens)[1][row]) for row in ks)
        assert [len(u_draft[row]) for row in ks] == [4, 2] and [len(u_verify[row]) for row in ks] == [5, 2]
    assert all(torch.equal(d.generator.get_state(), shared.generator.get_state()) for d in (drafter, verifier))


def test_sides_that_ask_for_other_draws_than_were_drawn_fail_at_once():
    draws = Draws(torch.Generator())
    with pytest.raises(RuntimeError, match="before Draws.first"):
        draws.round(0, {0: 4}, {0: 4})
    draws.first({0: 4})
    with pytest.raises(RuntimeError, match="out of step"):
        draws.first({0: 3})
    draws.round(0, {0: 4}, {0: 4})
    with pytest.raises(RuntimeError, match="out of step"):
        draws.round(0, {0: 4}, {0: 2})


def test_only_the_round_draws_ssds_uniforms():
    """SSD's loops take their uniforms from ssd.core.round.Draws; none draws on its own."""
    root = Path(ssd.core.round.__file__).parents[1]
    for path in (root / "core" / "speculation.py", root / "pipeline" / "protocol.py", root / "pipeline" / "launch.py"):
        names = {n.id for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Name)}
        assert "uniforms" not in names, f"{path.name} draws uniforms outside ssd.core.round"


def test_messages_are_frozen_keyword_records_and_all_listed_for_the_wire():
    records = [getattr(module, name) for module in (ssd.core.round, ssd.pipeline.protocol) for name in dir(module)]
    messages = {r for r in records if dataclasses.is_dataclass(r) and isinstance(r, type)
                and r.__module__ in ("ssd.core.round", "ssd.pipeline.protocol") and not issubclass(r, Round)}
    assert {m.__name__ for m in messages} == {"Report", "DraftMessage", "DrafterClock", "Verdicts", "Ready", "Start",
                                              "LastReports", "Stop"}
    assert messages <= set(WIRE_TYPES)
    for message in messages:
        assert message.__dataclass_params__.frozen
        assert all(f.kw_only for f in dataclasses.fields(message))
    with pytest.raises(TypeError):
        Verdicts({}, {}, {})  # positional construction is refused
    assert DraftMessage(round=0, tokens={}, drawn={}, fan_out={}, a_p={}, r={}).previous is None
