"""SSD on two ranks over torch.distributed: the target verifies on one device while the draft pre-speculates on
another (Kumar, Dao & May, Sec. 5). ``ssd.ssd`` runs the same algorithm in one process, one phase after the other.

Rank 0, the verifier, holds the target. Rank 1, the drafter, holds the draft and the speculation cache. A round:

    drafter (rank 1)                                       verifier (rank 0)
    send draft r: x_1..x_K (+ q rows if T > 0)   ---->     verify draft r: one target pass
    pre-speculate round r + 1 for every                    ...
      predicted outcome of round r
                                                 <----     send outcome (k, t*) and done
    hit: draft r + 1 comes from the cache;
    miss: the backup drafts it
    send draft r + 1 (+ round r's hit, times)    ---->

Little crosses the wire: no KV cache (each rank keeps its own model's cache and its own copy of the committed tokens),
no q at temperature 0 (it is one-hot on the drafted tokens, so the verifier rebuilds it), and no random numbers: the
verifier sends its generator's state with the prompt and both ranks draw from it in generate_ssd's pattern, each
using its share (the drafter the draft uniforms, the verifier the verify uniforms). The pipeline therefore returns
generate_ssd's tokens for the same generator (up to float ties where the two processes compute a distribution with
different thread counts), and at temperature 0 the target's own greedy tokens.

Launch: ``Pipeline(pair)``, or the method ``generate_ssd_pipeline``, spawns rank 1 as a child process that loads the
draft itself and serves every later call. Under torchrun both ranks run ``python -m ssd.torchrun ARGS``: rank 0 runs
``python -m ssd ARGS``, whose method ssd-pipeline talks to rank 1, the job's other process (README: two GPUs, two
hosts).

Faults: every wait is bounded (timeout_s within a round, load_timeout_s while the draft loads) and watches the peer:
rank 0 polls its child's exit code, a spawned rank 1 its parent's pid, and a rank that dies closes the link, which
fails the other's wait at once. A drafter that raises leaves its traceback in the rendezvous store before it exits,
and rank 0 quotes it. Any fault, or Ctrl-C, ends both ranks; the next generate_ssd_pipeline call starts afresh.
"""
from __future__ import annotations

import atexit
import contextlib
import dataclasses
import os
import pickle
import re
import signal
import socket
import sys
import threading
import time
import traceback
import weakref
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from .cores import available_cores, check_cores, parse_cores, pin, pinned
from .decoding import Verifier, check_prompt
from .devices import drafter_device, resolve_device
from .models import check_pair_name, load_draft
from .precision import convert, precision_of
from .sampling import one_hot, uniforms
from .ssd import SSDConfig, Speculator, check_ssd_config, round_uniforms, truncate
from .trace import PipelineRound, Trace

POLL_S = 0.05  # how often a waiting rank looks at its peer's health and the clock
FOREVER_S = 10 * 365 * 86400.0  # the drafter's wait between two generate calls has no deadline
STOP_TIMEOUT_S = 10.0  # a drafter asked to stop that has not within this is killed
JOINED_KEY = "drafter-joined"  # set in the store once the spawned drafter is up
ERROR_KEY = "drafter-error"  # the traceback of a drafter that raised


class PipelineError(RuntimeError):
    """The other rank died, hung or raised; the message says which, and quotes what the drafter reported."""


@dataclass
class PipelineConfig(SSDConfig):
    verifier_cores: str = "0"  # CPU cores of rank 0 (the target), e.g. "0", "0,1" or "0-3"; one torch thread each
    drafter_cores: str = "1"  # CPU cores of rank 1 (the draft)
    timeout_s: float = 120.0  # the longest one rank waits for the other within a round

    def __post_init__(self):
        super().__post_init__()
        parse_cores(self.verifier_cores, "verifier_cores")
        parse_cores(self.drafter_cores, "drafter_cores")
        check_seconds(self.timeout_s, "timeout_s")


def check_seconds(value, name: str) -> None:
    if not (isinstance(value, (int, float)) and value > 0):
        raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}")


# ---- the link ------------------------------------------------------------------------------------------------------


class Channel:
    """One rank's end of the link. A message is a small pickled record, whose "kind" says what it is, and for a draft
    at temperature > 0 the q rows [n, V] it was drawn from. It travels as three transfers: a header (record bytes, q
    shape), the record, the rows."""

    def __init__(self, peer: int, device, peer_gone=lambda: None):
        self.peer = peer
        self.device = torch.device(device)  # where transfers live: the rank's GPU under NCCL, else the CPU
        self.peer_gone = peer_gone  # () -> None while the peer may be alive, else why it is known to be gone

    def send(self, record: dict, q: torch.Tensor | None = None, *, timeout_s: float, doing: str,
             limit: str = "timeout_s") -> None:
        meta = torch.frombuffer(bytearray(pickle.dumps(record)), dtype=torch.uint8)
        rows, cols = q.shape if q is not None and q.numel() else (0, 0)
        for part in [torch.tensor([meta.numel(), rows, cols]), meta] + ([q.float()] if rows else []):
            part = part.to(self.device).contiguous()
            self._wait(dist.isend(part, self.peer), timeout_s, doing, limit)

    def recv(self, *kinds: str, timeout_s: float | None, doing: str, limit: str = "timeout_s"):
        """The next message, which must be of one of these kinds: (record, q rows or None)."""
        n, rows, cols = self._recv(torch.empty(3, dtype=torch.long), timeout_s, doing, limit).tolist()
        meta = self._recv(torch.empty(n, dtype=torch.uint8), timeout_s, doing, limit)
        record = pickle.loads(meta.cpu().numpy().tobytes())
        q = self._recv(torch.empty(rows, cols), timeout_s, doing, limit) if rows else None
        if record["kind"] not in kinds:
            raise PipelineError(f"protocol error while {doing}: expected {' or '.join(kinds)}, got {record['kind']}")
        return record, q

    def _recv(self, buffer: torch.Tensor, timeout_s, doing, limit) -> torch.Tensor:
        buffer = buffer.to(self.device)
        self._wait(dist.irecv(buffer, self.peer), timeout_s, doing, limit)
        return buffer

    def _wait(self, work, timeout_s: float | None, doing: str, limit: str) -> None:
        """Wait for one transfer while watching the peer and the clock, interruptible by Ctrl-C.

        gloo's point-to-point work reports completion only through wait(), and a wait that times out breaks the link
        for good, so a helper thread waits (with a generous timeout) while this thread watches.
        """
        done, failed = threading.Event(), []

        def wait():
            try:
                work.wait(timedelta(seconds=(timeout_s or FOREVER_S) + 1.0))
                if self.device.type == "cuda":  # NCCL's wait only orders the streams: wait for the data itself
                    torch.cuda.synchronize(self.device)
            except Exception as e:  # the link broke: the peer died or left
                failed.append(e)
            done.set()

        threading.Thread(target=wait, daemon=True).start()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not done.wait(POLL_S):
            gone = self.peer_gone()
            if gone:
                raise PipelineError(f"{gone} while {doing}")
            if deadline is not None and time.monotonic() > deadline:
                raise PipelineError(f"no reply within {limit}={timeout_s:g} s while {doing}")
        if failed:
            raise PipelineError(f"the link to the other rank broke while {doing} ({_link_error(failed[0])})")


def _link_error(error: Exception) -> str:
    """gloo's reason alone ("Read error [127.0.0.1]:13730: Connection reset by peer"), without its source path and
    its advice, which the drafter's own exit code and traceback replace (Pipeline._explain)."""
    text = str(error).splitlines()[0] if str(error).strip() else type(error).__name__
    text = re.sub(r"^\[[^\]]*\.(?:cc|cpp|h):\d+\]\s*", "", text)
    return text.split(". This is typically caused")[0]


def init_group(backend: str, store, rank: int, device: torch.device, timeout_s: float) -> Channel:
    """Join the two-rank process group (0 the verifier, 1 the drafter) and return this rank's end of the link."""
    nccl = backend == "nccl"
    dist.init_process_group(backend, store=store, rank=rank, world_size=2, timeout=timedelta(seconds=timeout_s),
                            device_id=device if nccl else None)
    return Channel(1 - rank, device if nccl else "cpu")


def env_rank() -> int | None:
    """This process's rank when torchrun (or RANK, WORLD_SIZE=2, MASTER_ADDR, MASTER_PORT by hand) launched it."""
    if "RANK" not in os.environ:
        return None
    rank, world = int(os.environ["RANK"]), int(os.environ.get("WORLD_SIZE", "0"))
    if world != 2 or rank not in (0, 1):
        raise ValueError(f"the pipeline runs on exactly 2 ranks; got RANK={rank}, WORLD_SIZE={world}")
    return rank


def env_store(rank: int, timeout_s: float):
    """The job's store, as env:// finds it: torchrun's agent hosts it, or else rank 0 does."""
    try:
        host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    except (KeyError, ValueError):
        raise ValueError("MASTER_ADDR and MASTER_PORT must name rank 0's host and a free port") from None
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(host, port, 2, is_master=rank == 0 and not agent, timeout=timedelta(seconds=timeout_s),
                          wait_for_workers=False)
    return dist.PrefixStore("ssd-pipeline/", store)


# ---- rank 1: the drafter -------------------------------------------------------------------------------------------


def speculate(channel: Channel, draft_model, start: dict) -> None:
    """Rank 1's side of one generate call: ssd.ssd's Speculator, driven by messages instead of calls."""
    config, timeout_s = start["config"], start["timeout_s"]
    generator = torch.Generator()
    generator.set_state(start["generator"])
    speculator = Speculator(draft_model, start["prompt_ids"], config, start["vocab_size"])
    block = speculator.backup(uniforms(config.k, generator), speculator.fan_out())
    draft_len, i, previous = start["draft_len"], 0, None
    while True:
        u_draft, _ = round_uniforms(generator, config.k, draft_len)  # the verify uniforms are the verifier's share
        a_p, r = speculator.estimates()
        f_next = speculator.fan_out()
        this = truncate(block, draft_len)
        q = this.q if config.temperature > 0 else None  # at temperature 0 q is one-hot on the tokens
        record = {"kind": "draft", "tokens": this.tokens, "fan_out": this.fan_out, "a_p": a_p, "r": r,
                  "previous": previous}
        channel.send(record, q, timeout_s=timeout_s, doing=f"sending the draft of round {i}")
        t0 = time.perf_counter()
        speculator.prespeculate(block, u_draft, f_next)  # meanwhile the verifier verifies this round's draft
        t1 = time.perf_counter()
        outcome, _ = channel.recv("outcome", timeout_s=timeout_s, doing=f"waiting for the outcome of round {i}")
        t2 = time.perf_counter()  # draft_s counts the lookup and the backup, not the wait for the outcome
        block, hit, rank, backup = speculator.advance(block, tuple(outcome["outcome"]), draft_len, u_draft, f_next,
                                                      last=outcome["done"])
        previous = {"prespec_s": t1 - t0, "draft_s": time.perf_counter() - t2, "hit": hit, "rank": rank,
                    "backup": backup}
        if outcome["done"]:
            channel.send({"kind": "report", "previous": previous}, timeout_s=timeout_s, doing="sending the last report")
            return
        draft_len, i = outcome["draft_len"], i + 1


def serve(channel: Channel, draft_model) -> None:
    """Rank 1 once its draft is loaded: one generate call per "start" message, until "stop"."""
    while True:
        start, _ = channel.recv("start", "stop", timeout_s=None, doing="waiting for the next generate call")
        if start["kind"] == "stop":
            return
        speculate(channel, draft_model, start)


def _load_draft(source, precision: str, device):
    if isinstance(source, str):
        return load_draft(source, precision=precision, device=device, progress=False)
    return convert(source().draft.to(device), precision, "draft_dtype")  # a factory (tests): it builds a whole pair


def run_drafter(store, source, *, cores: str, device, backend: str, precision: str = "float32",
                peer_gone=lambda: None, load_timeout_s: float = 600.0) -> None:
    """All of rank 1's life: pin, join the group, load the draft, report ready, serve until told to stop."""
    pin(check_cores(cores, "drafter_cores"))
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    store.set(JOINED_KEY, str(os.getpid()))
    channel = init_group(backend, store, 1, device, load_timeout_s)
    channel.peer_gone = peer_gone
    draft = _load_draft(source, precision, device)
    ready = {"kind": "ready", "vocab_size": draft.config.vocab_size, "host": socket.gethostname(), "pid": os.getpid(),
             "device": str(device), "cores": available_cores(), "threads": torch.get_num_threads(),
             "precision": precision_of(draft)}
    channel.send(ready, timeout_s=load_timeout_s, doing="reporting that the draft is loaded")
    serve(channel, draft)
    # Only after a clean stop: after an error the link must stay up until the error is in the store, and the exit
    # that follows closes it anyway.
    dist.destroy_process_group()


def _report_failure(store) -> int:
    """Print the current exception and leave it in the store, where rank 0 finds it; the exit code to use."""
    text = traceback.format_exc()
    print(f"[ssd.pipeline drafter] {text}", file=sys.stderr, flush=True)
    if store is not None:
        with contextlib.suppress(Exception):  # the store may have died with rank 0
            store.set(ERROR_KEY, text)
    return 1


def _drafter_process(port: int, source, cores: str, device: str, backend: str, precision: str, parent_pid: int) -> None:
    """Rank 1 as Pipeline spawns it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it then ends this process
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=False, timeout=timedelta(seconds=30))

    def parent_gone():
        return "the verifier process is gone" if os.getppid() != parent_pid else None

    try:
        run_drafter(store, source, cores=cores, device=device, backend=backend, precision=precision,
                    peer_gone=parent_gone)
    except BaseException:
        code = _report_failure(store if not parent_gone() else None)
        os._exit(code)  # at once: the parent learns the exit code as soon as the link breaks


def serve_torchrun(source, *, drafter_cores: str = "1", device="cpu", precision: str = "float32",
                   load_timeout_s: float = 600.0) -> int:
    """Rank 1 of a torchrun job (or of RANK=1 WORLD_SIZE=2 MASTER_ADDR=... MASTER_PORT=...): serve until rank 0 is
    done. source: a pair name (loads only its draft) or a picklable factory returning a Pair; precision: the draft's
    (auto decides on this rank's own machine). Returns the exit code."""
    store = env_store(1, load_timeout_s)
    backend = "nccl" if torch.device(device).type == "cuda" else "gloo"
    try:
        run_drafter(store, source, cores=drafter_cores, device=device, backend=backend, precision=precision,
                    load_timeout_s=load_timeout_s)
    except BaseException:
        return _report_failure(store)
    return 0


# ---- rank 0: the verifier ------------------------------------------------------------------------------------------

_open: weakref.WeakSet = weakref.WeakSet()  # every Pipeline not yet closed, for close_pipelines at exit
_torchrun_joined = False  # did this torchrun rank 0 ever join rank 1 (see stop_unused_torchrun_drafter)


class Pipeline:
    """Rank 0 of the SSD pipeline: the target verifies here while rank 1 drafts in a process of its own.

        with Pipeline(pair, verifier_cores="0", drafter_cores="1") as pipe:
            tokens, trace = pipe.generate(prompt_ids, SSDConfig(budget=16), torch.Generator().manual_seed(0))

    Rank 1 starts with the Pipeline and serves every generate call until close(). Spawned (the default), it loads
    the draft from draft_source, by default pair.source: a pair name (it loads only the draft) or a picklable factory
    returning the same Pair (tiny_pair records one). Under torchrun (RANK set) rank 1 is the job's other process.
    The verifier runs pinned to verifier_cores during each call, the drafter on drafter_cores for its whole life.
    One Pipeline per process at a time: it owns torch.distributed's default process group.
    """

    def __init__(self, pair, *, verifier_cores="0", drafter_cores="1", timeout_s: float = 120.0,
                 load_timeout_s: float = 600.0, draft_source=None, draft_device=None):
        check_seconds(timeout_s, "timeout_s")
        check_seconds(load_timeout_s, "load_timeout_s")
        rank = env_rank()
        self.pair, self.timeout_s = pair, float(timeout_s)
        self.verifier_cores = check_cores(verifier_cores, "verifier_cores")
        if rank is None:
            check_cores(drafter_cores, "drafter_cores")
        else:  # the drafter may sit on another host: it checks its cores there
            parse_cores(drafter_cores, "drafter_cores")
        source = pair.source if draft_source is None else draft_source
        if rank is None:
            _check_source(source)
        if dist.is_initialized():
            raise PipelineError("torch.distributed's default process group is in use in this process (another "
                                "Pipeline?); close it first, e.g. with ssd.pipeline.close_pipelines()")
        self.device = pair.target.device
        if draft_device is None:  # the next GPU (one GPU: a ValueError saying the pipeline needs a second), or the CPU
            draft_device = drafter_device(self.device, spawned=rank is None)
        draft_device = resolve_device(draft_device, "draft_device") if rank is None else torch.device(draft_device)
        backend = "nccl" if self.device.type == "cuda" and draft_device.type == "cuda" else "gloo"
        self.process = self.store = self.channel = None
        # A drafter spawned on this machine's CPU is idle during the prompt's pass: that pass takes both ranks' cores.
        # A drafter on a GPU or another host leaves the verifier its own cores only.
        local = rank is None and draft_device.type == "cpu"
        self.prefill_cores = sorted(set(self.verifier_cores) | set(parse_cores(drafter_cores, "drafter_cores"))
                                    if local else self.verifier_cores)
        self.drafter: dict | None = None  # what rank 1 reported when ready: host, pid, device, cores, threads
        _open.add(self)
        with self._end_both_on_error():
            if rank is None:
                self._spawn(source, drafter_cores, draft_device, backend, load_timeout_s)
            else:
                self._join_torchrun(backend, load_timeout_s)
            self.drafter, _ = self.channel.recv("ready", timeout_s=load_timeout_s, limit="load_timeout_s",
                                                doing="waiting for the drafter to load the draft")
            if self.drafter["vocab_size"] != pair.vocab_size:
                raise PipelineError(f"the drafter's draft has vocab_size {self.drafter['vocab_size']} but the target "
                                    f"has {pair.vocab_size}: draft_source must give the pair's own draft")

    def _spawn(self, source, cores: str, draft_device, backend: str, load_timeout_s: float) -> None:
        # Port 0: the OS picks a free port, so pipelines (and test runs) never collide.
        self.store = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False,
                                   timeout=timedelta(seconds=30))
        context = mp.get_context("spawn")  # a fresh interpreter: fork would copy the target and torch's thread pool
        process = context.Process(
            target=_drafter_process, name="ssd-drafter", daemon=True,
            args=(self.store.port, source, cores, str(draft_device), backend, self.pair.precisions.draft, os.getpid()))
        process.start()
        self.process = process
        # Join the group only once the drafter is up: init_process_group blocks without watching the process.
        deadline = time.monotonic() + load_timeout_s
        while not self.store.check([JOINED_KEY]):
            if self.process.exitcode is not None:
                raise PipelineError("the drafter process ended before it joined")
            if time.monotonic() > deadline:
                raise PipelineError(f"the drafter did not start within load_timeout_s={load_timeout_s:g} s")
            time.sleep(POLL_S)
        self.channel = init_group(backend, self.store, 0, self.device, load_timeout_s)
        self.channel.peer_gone = self._drafter_gone

    def _join_torchrun(self, backend: str, load_timeout_s: float) -> None:
        global _torchrun_joined
        if env_rank() != 0:
            raise ValueError("under torchrun the Pipeline (the verifier) is rank 0; rank 1 runs serve_torchrun")
        self.store = env_store(0, load_timeout_s)
        self.channel = init_group(backend, self.store, 0, self.device, load_timeout_s)
        _torchrun_joined = True

    def _drafter_gone(self) -> str | None:
        return "the drafter process ended" if self.process.exitcode is not None else None

    @property
    def closed(self) -> bool:
        return self.channel is None

    def generate(self, prompt_ids, config: SSDConfig, generator: torch.Generator):
        """SSD over the two ranks: generate_ssd's tokens for the same generator. Returns (new tokens, trace)."""
        check_ssd_config(config, "ssd-pipeline")
        if self.closed:
            raise PipelineError("this Pipeline is closed; open a new one")
        prompt_ids = check_prompt(self.pair, prompt_ids, config)
        verifier = Verifier(self.pair.target, prompt_ids, config, self.pair.eos_token_ids)
        trace = Trace("ssd-pipeline", prompt_len=len(prompt_ids))
        with self._end_both_on_error(), pinned(self.verifier_cores):
            start = time.perf_counter()
            # The prompt's pass is the longest of a call and the drafter has nothing to do yet: it takes the drafter's
            # cores too where they are this machine's. (Run side by side with the drafter's own prompt pass, the two
            # slowed each other more than the drafter's short pass costs when it follows.)
            with pinned(self.prefill_cores):
                verifier.target.prefill(verifier.tokens)
            trace.prefill_s = time.perf_counter() - start
            self._start(verifier, config, generator)
            self._rounds(verifier, config, generator, trace)
            trace.wall_s = time.perf_counter() - start
        return verifier.new, trace

    def _start(self, verifier: Verifier, config: SSDConfig, generator: torch.Generator) -> None:
        start = {"kind": "start", "prompt_ids": verifier.tokens, "config": config, "generator": generator.get_state(),
                 "draft_len": verifier.draft_len(), "vocab_size": self.pair.vocab_size, "timeout_s": self.timeout_s}
        self.channel.send(start, timeout_s=self.timeout_s, doing="sending the prompt")
        uniforms(config.k, generator)  # the first draft's uniforms: the drafter draws them from its copy

    def _rounds(self, verifier: Verifier, config: SSDConfig, generator: torch.Generator, trace: Trace) -> None:
        link, timeout_s, vocab_size = self.channel, self.timeout_s, self.pair.vocab_size
        draft, q = link.recv("draft", timeout_s=timeout_s, doing="waiting for the first draft")
        done, i = False, 0
        while not done:
            draft_len = verifier.draft_len()
            _, u_verify = round_uniforms(generator, config.k, draft_len)  # the draft uniforms are the drafter's share
            t0 = time.perf_counter()
            q = one_hot(draft["tokens"], vocab_size, verifier.target.device) if q is None else q
            verdict, emitted, done = verifier.verify(draft["tokens"], q, u_verify)
            t1 = time.perf_counter()
            outcome = {"kind": "outcome", "outcome": verdict.outcome, "done": done, "draft_len": verifier.draft_len()}
            link.send(outcome, timeout_s=timeout_s, doing=f"sending the outcome of round {i}")
            doing = "waiting for the last report" if done else f"waiting for the draft of round {i + 1}"
            answer, q = link.recv("report" if done else "draft", timeout_s=timeout_s, doing=doing)
            t2 = time.perf_counter()
            spec = answer["previous"]  # what the drafter did while and after this round was verified
            trace.rounds.append(
                PipelineRound(draft_len, verdict.accepted, verdict.token, len(emitted), draft_s=spec["draft_s"],
                              verify_s=t1 - t0, prespec_s=spec["prespec_s"], hit=spec["hit"], rank=spec["rank"],
                              fan_out=tuple(draft["fan_out"]), a_p=draft["a_p"], r=draft["r"], backup=spec["backup"],
                              wait_s=t2 - t1)
            )
            draft, i = answer, i + 1

    @contextlib.contextmanager
    def _end_both_on_error(self):
        """A fault or Ctrl-C mid-protocol leaves the drafter out of step for good: end both ranks, then re-raise."""
        try:
            yield
        except PipelineError as e:
            message = self._explain(str(e))
            self.close(kill=True)
            raise PipelineError(message) from None
        except BaseException:
            self.close(kill=True)
            raise

    def _explain(self, cause: str) -> str:
        """What rank 0 saw, plus what the drafter left behind: its exit code and the traceback it stored."""
        message = f"ssd-pipeline: {cause}"
        if self.process is not None:
            self.process.join(0.5)  # a drafter that broke the link is on its way out: let its exit code arrive
            code = self.process.exitcode
            if code is not None:
                how = f"exited with code {code}" if code >= 0 else f"was killed by signal {-code}"
                message += f"; the drafter process (pid {self.process.pid}) {how}"
        with contextlib.suppress(Exception):  # no store, or it went down with the job
            if self.store is not None and self.store.check([ERROR_KEY]):
                message += f"; the drafter raised:\n{self.store.get(ERROR_KEY).decode().rstrip()}"
        return message

    def close(self, kill: bool = False) -> None:
        """Stop the drafter (at once if kill, else by asking it) and leave the process group. Safe to call twice."""
        if self.channel is not None and not kill:
            try:
                self.channel.send({"kind": "stop"}, timeout_s=STOP_TIMEOUT_S, doing="stopping the drafter")
            except PipelineError:
                kill = True
        if self.process is not None and kill:
            self.process.kill()  # first: a transfer still pending on the link then fails instead of hanging
        if self.channel is not None:
            dist.destroy_process_group()
        if self.process is not None:
            self.process.join(STOP_TIMEOUT_S)
            if self.process.is_alive():
                self.process.kill()
                self.process.join()
        self.channel = self.store = None
        _open.discard(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _check_source(source) -> None:
    if source is None:
        raise ValueError("draft_source is needed: the pair records no source (pair.source is None); give a pair name "
                         "for load_pair or a picklable zero-argument callable returning the same Pair")
    if isinstance(source, str):
        check_pair_name(source, "draft_source")
    elif not callable(source):
        raise ValueError(f"draft_source must be a pair name or a picklable zero-argument callable, got {source!r}")


# ---- the method ----------------------------------------------------------------------------------------------------

_cached: tuple[tuple, Pipeline] | None = None  # (key, pipeline) that generate_ssd_pipeline keeps between calls


def pipeline_for(pair, config: SSDConfig) -> Pipeline:
    """The Pipeline generate_ssd_pipeline uses: started on first use and kept; replaced when the pair or the cores
    or timeout of a PipelineConfig change, or after a fault closed it."""
    global _cached
    if not isinstance(config, PipelineConfig):
        config = PipelineConfig(**dataclasses.asdict(config))  # the default cores and timeout
    key = (id(pair), config.verifier_cores, config.drafter_cores, config.timeout_s)
    if _cached is not None and (_cached[0] != key or _cached[1].closed):
        _cached[1].close()
        _cached = None
    if _cached is None:
        _cached = key, Pipeline(pair, verifier_cores=config.verifier_cores, drafter_cores=config.drafter_cores,
                                timeout_s=config.timeout_s)
    return _cached[1]


def generate_ssd_pipeline(pair, prompt_ids, config: SSDConfig, generator: torch.Generator):
    """SSD with the drafter on its own cores or device, in the kit's method shape: see Pipeline.

    The pipeline starts on the first call (its drafter loads the draft) and serves later calls; it closes at exit,
    after a fault, or with close_pipelines(). A PipelineConfig sets its cores and timeout; an SSDConfig uses the
    defaults (verifier on core 0, drafter on core 1).
    """
    check_ssd_config(config, "ssd-pipeline")
    check_prompt(pair, prompt_ids, config)  # bad input fails before a drafter starts
    return pipeline_for(pair, config).generate(prompt_ids, config, generator)


def close_pipelines() -> None:
    """Close every open Pipeline, stopping their drafters (also run at interpreter exit)."""
    global _cached
    for pipeline in list(_open):
        pipeline.close()
    _cached = None


atexit.register(close_pipelines)


# ---- torchrun ------------------------------------------------------------------------------------------------------


def stop_unused_torchrun_drafter(device) -> None:
    """Rank 0 of a torchrun job: if it never used the pipeline, rank 1 still waits for it; join it and tell it to
    stop. Nothing to do if it joined (closing the pipeline stopped the drafter)."""
    if _torchrun_joined:
        return
    device = torch.device(device)
    channel = init_group("nccl" if device.type == "cuda" else "gloo", env_store(0, 600.0), 0, device, 600.0)
    try:
        channel.recv("ready", timeout_s=600.0, limit="load_timeout_s", doing="waiting for the drafter to load")
        channel.send({"kind": "stop"}, timeout_s=STOP_TIMEOUT_S, doing="stopping the drafter")
    finally:
        dist.destroy_process_group()

