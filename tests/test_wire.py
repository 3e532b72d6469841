"""The pipeline's wire format: every message comes back as it left, anything else is refused with a one-line reason,
and a rank that receives a malformed message ends the run naming both ranks."""
import dataclasses
import functools
import itertools
import json
import re
import sys
import time

import pytest
import torch

from ssd.core.latencies import Profile
from ssd.core.speculation import SSDConfig
from ssd.clock import Span
from ssd.core.verify import Verdict
from ssd.models.pair import Pair
from ssd.models.tiny import tiny_pair
from ssd.core.round import DraftMessage, Verdicts, Report
from ssd.pipeline.launch import Pipeline, close_pipelines
from ssd.pipeline.transport import PipelineError
from ssd.pipeline.protocol import WIRE_TYPES, DrafterClock, LastReports, Ready, Start, Stop
from ssd.pipeline.transport import Channel
from ssd.pipeline.wire import MAX_RECORD_BYTES, Wire, WireError

from .test_pipeline import DRAFTER, PAIR_ARGS, VERIFIER

wire = Wire(WIRE_TYPES)


def profile() -> Profile:
    return Profile("qwen2.5-coder", {"target": "bfloat16", "draft": "int8"}, {"cpu": "AMD EPYC", "flags": ["avx2"]},
                   [0, 1], [2, 3], 4096, {1: 101.5, 5: 120.0}, {1: 20.0, 16: 31.5}, {"target": 40.2, "draft": 38.0},
                   {"target": 14_000_000_000, "draft": 1_000_000_000}, "2026-12-06", {1: 21.0, 4: 24.0}, 4)


def report(rank, backup, round_) -> Report:
    spans = (Span(round_, "prespec_s", 0.125, 0.5), Span(None, "draft_s", 0.0, 0.1))
    return Report(prespec_s=0.375, draft_s=0.02, hit=rank is not None, rank=rank, backup=backup, spans=spans)


def generator_state() -> torch.Tensor:
    generator = torch.Generator().manual_seed(7)
    torch.rand(10, generator=generator)  # mid-stream, as a second generate call sends it
    return generator.get_state()


MESSAGES = [
    Ready(vocab_size=151_936, host="node-b", pid=4242, device="cuda:1", cores=[1, 2], threads=2, precision="int8",
          forward="compiled"),
    Start(prompts=[[1, 2, 3], [7, 7]], config=SSDConfig(k="auto", budget="auto", temperature=0.8),
          generator_state=generator_state(), rooms=[63, 63], vocab_size=151_936, timeout_s=120.0, sent_s=1234.5678,
          first_cores=(0, 1), latencies=profile()),
    Start(prompts=[[5]], config=SSDConfig(k=3, budget=0, backup="fast"), generator_state=generator_state(), rooms=[9],
          vocab_size=32, timeout_s=10, sent_s=0.25),
    DraftMessage(round=0, tokens={0: [5, 9, 2, 11], 3: [7]}, drawn={0: 4, 3: 2},
                 fan_out={0: (3, 2, 1, 1, 1), 3: (2, 1)}, a_p={0: 0.71, 3: 0.5}, r={0: 0.5, 3: 0.42},
                 first_drawn={0: 4, 3: 1}),
    DrafterClock(received_s=17.25, sent_s=17.5),
    DraftMessage(round=5, tokens={0: [1, 2]}, drawn={0: 2}, fan_out={0: (1, 1, 0)}, a_p={0: 0.6}, r={0: 0.5},
                 previous={0: report(2, None, 4), 1: report(None, "jit", 4)}),
    Verdicts(verdicts={0: Verdict(accepted=3, token=17, draft_len=4), 3: Verdict(0, 2, 1)}, done={0: False, 3: True},
            rooms={0: 40, 3: 0}),
    LastReports(previous={2: report(None, "fast", 9)}),
    Stop(),
]


def same(a, b) -> bool:
    """Equal, and of the same types all the way down (a tuple stays a tuple, an int key an int), tensors included."""
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and torch.equal(a, b)
    if dataclasses.is_dataclass(a):  # every field, also those left out of ==
        return all(same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(k, l) and same(a[k], b[l]) for k, l in zip(a, b))
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(map(same, a, b))
    return a == b


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_comes_back_as_it_left(message):
    data = wire.encode(message)
    assert same(wire.decode(data), message)
    assert data.isascii() and b"pickle" not in data


def small_start(**fields) -> Start:
    """A one-row Start, with these fields changed."""
    return Start(**{"prompts": [[1]], "config": SSDConfig(), "generator_state": generator_state(), "rooms": [1],
                    "vocab_size": 16, "timeout_s": 1.0, "sent_s": 0.0} | fields)


def test_the_tensors_keep_dtype_shape_and_bytes():
    for tensor in (torch.arange(6, dtype=torch.int64).reshape(2, 3), torch.rand(3, 5).to(torch.bfloat16),
                   torch.tensor([True, False]), torch.tensor(2.5), torch.empty(0, 4)):
        start = small_start(generator_state=tensor)
        assert same(wire.decode(wire.encode(start)).generator_state, tensor)


def test_the_sender_refuses_what_the_wire_does_not_carry():
    with pytest.raises(WireError, match="a Pair is not a message type"):
        wire.encode(tiny_pair())
    with pytest.raises(WireError, match=r"^Start.latencies: a Generator cannot cross the wire$"):
        wire.encode(small_start(latencies=torch.Generator()))
    with pytest.raises(WireError, match="tensor of dtype complex64"):
        wire.encode(small_start(generator_state=torch.zeros(2, dtype=torch.complex64)))
    with pytest.raises(WireError, match=r"Verdicts.done: a dict key 0.5"):
        wire.encode(Verdicts(verdicts={}, done={0.5: True}, rooms={}))


def edited(message, change) -> bytes:
    """message's wire bytes, with its JSON changed by change(tree)."""
    tree = json.loads(wire.encode(message))
    change(tree)
    return json.dumps(tree).encode()


VERDICTS, START = next(m for m in MESSAGES if isinstance(m, Verdicts)), MESSAGES[2]
# Where in a message's JSON: Verdicts.verdicts[0] (a Verdict record), Verdicts.rooms' entries, Start.generator_state
# (a tensor), Start.config's fields
VERDICT, ROOMS = ["fields", "verdicts", "dict", 0, 1], ["fields", "rooms", "dict"]
STATE, CONFIG = ["fields", "generator_state", "tensor"], ["fields", "config", "fields"]


def at(tree, path):
    for key in path:
        tree = tree[key]
    return tree


def update(path, **changes):
    return lambda tree: at(tree, path).update(changes)


MALFORMED = {
    "unknown type": (edited(Stop(), update([], type="Popen")), r"^unknown type 'Popen'$"),
    "a known name that is no wire type": (edited(Stop(), update([], type="Pair")), "^unknown type 'Pair'$"),
    "unknown nested type": (edited(VERDICTS, update(VERDICT, type="X")),
                            r"^unknown type 'X' at Verdicts.verdicts\[0\]$"),
    "extra field": (edited(VERDICTS, update(VERDICT + ["fields"], shell=True)),
                    r"^Verdicts.verdicts\[0\]: unknown field 'shell'$"),
    "missing field": (edited(VERDICTS, lambda tree: at(tree, VERDICT + ["fields"]).pop("token")),
                      r"^Verdicts.verdicts\[0\]: missing field 'token'$"),
    "bad JSON": (b'{"type": "Stop", "fields"', r"^not UTF-8 JSON \(Expecting ':' delimiter"),
    "not UTF-8": (b'\xff{"type": "Stop"}', "^not UTF-8 JSON"),
    "deeply nested": (b"[" * 100_000, "^values nested too deeply$"),
    "nested within json's limit": (edited(MESSAGES[0], update(["fields"], cores=json.loads("[" * 900 + "]" * 900))),
                                   "^values nested too deeply$"),
    "not a record": (b"[1, 2]", "^the message is a list, not a record$"),
    "untagged object": (edited(VERDICTS, update(["fields"], done={"0": True})),
                        r"^Verdicts.done: an object .* is no tagged value$"),
    "a str where an int goes": (edited(VERDICTS, update(VERDICT + ["fields"], accepted="3")),
                                r"^Verdicts.verdicts\[0\].accepted: expected int, got '3'$"),
    "a bool where an int goes": (edited(VERDICTS, update(VERDICT + ["fields"], token=True)),
                                 r"^Verdicts.verdicts\[0\].token: expected int, got True$"),
    "a Stop where a Verdict goes": (edited(VERDICTS, update(VERDICT, type="Stop", fields={})),
                                    r"^Verdicts.verdicts: expected dict\[int, Verdict\], got \{0: Stop\(\)"),
    "a str key where an int goes": (edited(VERDICTS, lambda tree: at(tree, ROOMS)[0].__setitem__(0, "0")),
                                    r"^Verdicts.rooms: expected dict\[int, int\]"),
    "a repeated dict key": (edited(VERDICTS, lambda tree: at(tree, ROOMS).append([0, 1])),
                            r"^Verdicts.rooms: a dict entry \[0, 1\] is no \[int or str key, value\] pair of a new"),
    "a tensor of a dtype not allowed": (edited(START, update(STATE, dtype="complex64")),
                                        r"^Start.generator_state: a tensor of dtype 'complex64' is not allowed"),
    "a tensor's bytes short of its shape": (edited(START, update(STATE, shape=[2**40, 2**40])),
                                            r"^Start.generator_state: a torch.uint8 tensor of shape .* needs "),
    "a value its __post_init__ refuses": (edited(START, update(CONFIG, budget=-3)),
                                          r"^Start.config: SSDConfig refuses its fields \(budget .* >= 0, got -3\)$"),
}


@pytest.mark.parametrize("data,reason", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_message_is_refused_with_a_one_line_reason(data, reason):
    # At Python's default recursion limit, which the nested cases are sized for: inductor raises it to 2000 for the
    # rest of a process when it compiles (compile_fx), and in CI, its cache empty, a compiled test run earlier in the
    # same worker let 900 levels through to the type check.
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)
    try:
        with pytest.raises(WireError, match=reason) as refused:
            wire.decode(data)
    finally:
        sys.setrecursionlimit(limit)
    assert "\n" not in str(refused.value)


def receiving(*transfers: bytes | list[int]):
    """Rank 0's end of a link whose transfers are these (a header, then the record's bytes), and the sizes of the
    buffers it allocated for them."""
    channel, sizes, parts = Channel(1, "cpu", WIRE_TYPES), [], iter(transfers)

    def recv(buffer, *args):
        sizes.append(buffer.numel())
        part = next(parts)
        return torch.tensor(part) if isinstance(part, list) else torch.frombuffer(bytearray(part), dtype=torch.uint8)

    channel._recv = recv
    return channel, sizes


@pytest.mark.parametrize("header,reason", [
    ([2**40, 0, 0], f"a record of 1099511627776 bytes; the bound is 1 to {MAX_RECORD_BYTES}"),
    ([0, 0, 0], "a record of 0 bytes"),
    ([-8, 0, 0], "a record of -8 bytes"),
    ([100, 2**20, 2**20], r"q rows of shape \[1048576, 1048576\]"),
    ([100, 4, 0], r"q rows of shape \[4, 0\]"),
])
def test_an_oversized_header_is_refused_before_allocating(header, reason):
    channel, sizes = receiving(header)
    with pytest.raises(PipelineError, match="^rank 0: a malformed message from rank 1 while waiting for the drafts "
                                            f"of round 3: the header announces {reason}"):
        channel.recv(DraftMessage, timeout_s=1.0, doing="waiting for the drafts of round 3")
    assert sizes == [3]  # the header's three numbers, and nothing it announced


def test_a_malformed_message_names_the_receiving_and_the_sending_rank():
    data = edited(Stop(), lambda t: t.update(type="X"))
    channel, _ = receiving([len(data), 0, 0], data)
    with pytest.raises(PipelineError) as refused:
        channel.recv(DraftMessage, timeout_s=1.0, doing="waiting for the drafts of round 3")
    assert str(refused.value) == "rank 0: a malformed message from rank 1 while waiting for the drafts of round 3: " \
                                 "unknown type 'X'"


# ---- over a real gloo pair of processes -----------------------------------------------------------------------------


def garble_nth_message(nth: int, setattr=setattr) -> None:
    """From now on, this process sends its nth message with its type renamed X."""
    encode, sent = Wire.encode, itertools.count(1)

    def garbled(self, message):
        data = encode(self, message)
        return re.sub(rb'^\{"type":"\w+"', b'{"type":"X"', data) if next(sent) == nth else data

    setattr(Wire, "encode", garbled)


def garbling_pair(nth: int) -> Pair:
    """The tiny pair, for a drafter that garbles its nth message after loading it (1: Ready; 2: the first drafts; 3: its
    clock; 4: the drafts of round 1)."""
    garble_nth_message(nth)
    return tiny_pair(**PAIR_ARGS)


def start(source=None) -> Pipeline:
    close_pipelines()  # one process group per process
    return Pipeline(tiny_pair(**PAIR_ARGS), verifier_cores=VERIFIER, drafter_cores=DRAFTER, draft_source=source)


def generate(pipeline):
    return pipeline.generate([1, 2, 3], SSDConfig(k=4, max_new_tokens=60, budget=8, temperature=1.0),
                             torch.Generator().manual_seed(0))


@pytest.mark.integration  # two real ranks
def test_a_verifier_that_receives_garbage_ends_the_run_with_a_one_line_error():
    pipeline = start(functools.partial(garbling_pair, 5))  # the drafts of round 2
    started = time.monotonic()
    with pytest.raises(PipelineError) as refused:
        generate(pipeline)
    assert str(refused.value) == ("ssd-pipeline: rank 0: a malformed message from rank 1 while waiting for the drafts "
                                  "of round 2: unknown type 'X'")
    assert pipeline.closed and not pipeline.process.is_alive() and time.monotonic() - started < 10


@pytest.mark.integration  # two real ranks
def test_a_drafter_that_receives_garbage_exits(monkeypatch):
    pipeline = start()
    garble_nth_message(3, monkeypatch.setattr)  # Start, round 0's verdicts, round 1's
    with pytest.raises(PipelineError, match="(?s)exited with code 1.*PipelineError: rank 1: a malformed message from "
                                            "rank 0 while waiting for the verdicts of round 1: unknown type 'X'"):
        generate(pipeline)
    assert pipeline.closed and pipeline.process.exitcode == 1
