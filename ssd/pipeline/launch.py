"""SSD on two ranks over torch.distributed: the target verifies on one device while the draft pre-speculates on
another (Kumar, Dao & May, Sec. 5). ``ssd.core.speculation`` runs the same algorithm in one process, one phase after the
other.

Rank 0, the verifier, holds the target. Rank 1, the drafter, holds the draft and the speculation cache. Three
modules, one idea each: ``ssd.pipeline.transport`` (the process group and the link), ``ssd.pipeline.protocol`` (the
messages and each rank's loop over a generate call) and this one, the lifecycle: starting rank 1 (spawned, or torchrun's
other process), the method ``generate_ssd_pipeline``, faults and shutdown.

Little crosses the wire: no KV cache (each rank keeps its own model's cache and its own copy of the committed tokens),
no q at temperature 0 (it is one-hot on the drafted tokens, so the verifier rebuilds it), and no random numbers: the
verifier sends its generator's state with the prompt and both ranks draw from it in generate_ssd's pattern, each
using its share (the drafter the draft uniforms, the verifier the verify uniforms). The pipeline therefore returns
generate_ssd's tokens for the same generator (up to float ties where the two processes compute a distribution with
different thread counts), and at temperature 0 the target's own greedy tokens.

Launch: ``Pipeline(pair)``, or the method ``generate_ssd_pipeline``, spawns rank 1 as a child process that loads the
draft itself and serves every later call. Under torchrun both ranks run ``python -m ssd.torchrun ARGS``: rank 0 runs
``python -m ssd ARGS``, whose method ssd-pipeline talks to rank 1, the job's other process (docs/pipeline.md: two
GPUs, two hosts).

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
import signal
import socket
import sys
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..models.cores import available_cores, check_cores, parse_cores, pin, pinned
from ..core.decoding import Verifier, as_batch, batch_traces, check_prompts
from ..models.devices import drafter_device, resolve_device
from ..models.forwards import check_forward, compile_forward, forward_of
from ..models.loading import check_pair_name, load_draft
from ..models.precision import convert, precision_of
from .protocol import WIRE_TYPES, Ready, Stop, serve, verify_call
from ..core.speculation import SSDConfig, check_ssd_config
from ..clock import Stopwatch
from .transport import POLL_S, PipelineError, check_seconds, env_rank, env_store, init_group
from ..core.tuning import Autotune, on_auto, tuned_latencies

STOP_TIMEOUT_S = 10.0  # a drafter asked to stop that has not within this is killed
JOINED_KEY = "drafter-joined"  # set in the store once the spawned drafter is up
ERROR_KEY = "drafter-error"  # the traceback of a drafter that raised


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


# ---- rank 1: the drafter's life -----------------------------------------------------------------------------------


def _load_draft(source, precision: str, device):
    if isinstance(source, str):
        return load_draft(source, precision=precision, device=device, progress=False)
    return convert(source().draft.to(device), precision, "draft_dtype")  # a factory (tests): it builds a whole pair


def run_drafter(store, source, *, cores: str, device, backend: str, precision: str = "float32", forward="eager",
                peer_gone=lambda: None, load_timeout_s: float = 600.0) -> None:
    """All of rank 1's life: pin, join the group, load the draft (its forward as the verifier's pair runs its own:
    ssd.models.forwards), report ready, serve until told to stop."""
    pin(check_cores(cores, "drafter_cores"))
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    store.set(JOINED_KEY, str(os.getpid()))
    channel = init_group(backend, store, 1, device, load_timeout_s, WIRE_TYPES)
    channel.peer_gone = peer_gone
    draft = _load_draft(source, precision, device)
    if check_forward(forward) == "compiled":
        compile_forward(draft, "drafter's draft", progress=False)
    ready = Ready(vocab_size=draft.config.vocab_size, host=socket.gethostname(), pid=os.getpid(), device=str(device),
                  cores=available_cores(), threads=torch.get_num_threads(), precision=precision_of(draft),
                  forward=forward_of(draft))
    channel.send(ready, timeout_s=load_timeout_s, doing="reporting that the draft is loaded")
    serve(channel, draft)
    # Only after a clean stop: after an error the link must stay up until the error is in the store, and the exit
    # that follows closes it anyway.
    dist.destroy_process_group()


def _report_failure(store) -> int:
    """Print the current exception and leave it in the store, where rank 0 finds it; the exit code to use."""
    text = traceback.format_exc()
    print(f"[ssd.pipeline.launch drafter] {text}", file=sys.stderr, flush=True)
    if store is not None:
        with contextlib.suppress(Exception):  # the store may have died with rank 0
            store.set(ERROR_KEY, text)
    return 1


def _drafter_process(port: int, source, cores: str, device: str, backend: str, precision: str, forward: str,
                     parent_pid: int) -> None:
    """Rank 1 as Pipeline spawns it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it then ends this process
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=False, timeout=timedelta(seconds=30))

    def parent_gone():
        return "the verifier process is gone" if os.getppid() != parent_pid else None

    try:
        run_drafter(store, source, cores=cores, device=device, backend=backend, precision=precision,
                    forward=forward, peer_gone=parent_gone)
    except BaseException:
        code = _report_failure(store if not parent_gone() else None)
        os._exit(code)  # at once: the parent learns the exit code as soon as the link breaks


def serve_torchrun(source, *, drafter_cores: str = "1", device="cpu", precision: str = "float32",
                   forward: str = "eager", load_timeout_s: float = 600.0) -> int:
    """Rank 1 of a torchrun job (or of RANK=1 WORLD_SIZE=2 MASTER_ADDR=... MASTER_PORT=...): serve until rank 0 is
    done. source: a pair name (loads only its draft) or a picklable factory returning a Pair; precision: the draft's
    (auto decides on this rank's own machine). Returns the exit code."""
    store = env_store(1, load_timeout_s)
    backend = "nccl" if torch.device(device).type == "cuda" else "gloo"
    try:
        run_drafter(store, source, cores=drafter_cores, device=device, backend=backend, precision=precision,
                    forward=forward, load_timeout_s=load_timeout_s)
    except BaseException:
        return _report_failure(store)
    return 0


# ---- rank 0: the verifier's side of the life ------------------------------------------------------------------

class _Process:
    """What the pipeline knows of this process, kept apart from any pair because it is the process's, not a pair's:

    - open: every Pipeline not yet closed. torch.distributed has one default process group per process, so one
      Pipeline is open at a time and the next opens only once it has closed (pipeline_for closes a pair's kept one
      first); close_pipelines, run at interpreter exit, must reach it to stop its drafter. Held, not weakly: an open
      Pipeline owns a process and the process group, so it lives until closed even if its pair is dropped.
    - joined_torchrun: whether this rank 0 of a torchrun job ever joined rank 1, which waits for it once per job
      whichever pair it serves (stop_unused_torchrun_drafter).

    Nothing here is ever handed to a pair: a pair keeps its own Pipeline (Pair.pipeline).
    """

    def __init__(self):
        self.open: set[Pipeline] = set()
        self.joined_torchrun = False


_process = _Process()


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
        self.options = (verifier_cores, drafter_cores, self.timeout_s)  # as given: pipeline_for reopens on others
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
                                "Pipeline?); close it first, e.g. with ssd.pipeline.launch.close_pipelines()")
        self.device = pair.target.device
        if draft_device is None:  # the next GPU (one GPU: a ValueError saying the pipeline needs a second), or the CPU
            draft_device = drafter_device(self.device, spawned=rank is None)
        draft_device = resolve_device(draft_device, "draft_device") if rank is None else torch.device(draft_device)
        backend = "nccl" if self.device.type == "cuda" and draft_device.type == "cuda" else "gloo"
        self.process = self.store = self.channel = None
        # A drafter spawned on this machine's CPU shares its cores with the verifier: each rank's first work (the
        # drafter's prompts' pass, first drafts and first pre-speculation; then the verifier's prompts' pass with its
        # first verification) takes both ranks' cores in turn. A drafter on a GPU or another host overlaps them.
        # (Empty where there is nothing to share: each rank keeps its own cores.)
        local = rank is None and draft_device.type == "cpu"
        both = sorted(set(self.verifier_cores) | set(parse_cores(drafter_cores, "drafter_cores"))) if local else []
        self.first_cores = tuple(both) if len(both) > len(self.verifier_cores) else ()
        self.drafter: Ready | None = None  # what rank 1 reported when ready: host, pid, device, cores, threads
        _process.open.add(self)
        with self._end_both_on_error():
            if rank is None:
                self._spawn(source, drafter_cores, draft_device, backend, load_timeout_s)
            else:
                self._join_torchrun(backend, load_timeout_s)
            self.drafter, _ = self.channel.recv(Ready, timeout_s=load_timeout_s, limit="load_timeout_s",
                                                doing="waiting for the drafter to load the draft")
            if self.drafter.vocab_size != pair.vocab_size:
                raise PipelineError(f"the drafter's draft has vocab_size {self.drafter.vocab_size} but the target "
                                    f"has {pair.vocab_size}: draft_source must give the pair's own draft")

    def _spawn(self, source, cores: str, draft_device, backend: str, load_timeout_s: float) -> None:
        # Port 0: the OS picks a free port, so pipelines (and test runs) never collide.
        self.store = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False,
                                   timeout=timedelta(seconds=30))
        context = mp.get_context("spawn")  # a fresh interpreter: fork would copy the target and torch's thread pool
        process = context.Process(
            target=_drafter_process, name="ssd-drafter", daemon=True,
            args=(self.store.port, source, cores, str(draft_device), backend, self.pair.precisions.draft,
                  self.pair.forward, os.getpid()))
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
        self.channel = init_group(backend, self.store, 0, self.device, load_timeout_s, WIRE_TYPES)
        self.channel.peer_gone = self._drafter_gone

    def _join_torchrun(self, backend: str, load_timeout_s: float) -> None:
        if env_rank() != 0:
            raise ValueError("under torchrun the Pipeline (the verifier) is rank 0; rank 1 runs serve_torchrun")
        self.store = env_store(0, load_timeout_s)
        self.channel = init_group(backend, self.store, 0, self.device, load_timeout_s, WIRE_TYPES)
        _process.joined_torchrun = True

    def _drafter_gone(self) -> str | None:
        return "the drafter process ended" if self.process.exitcode is not None else None

    @property
    def closed(self) -> bool:
        return self.channel is None

    def generate(self, prompt_ids, config: SSDConfig, generator: torch.Generator, autotune: Autotune | None = None):
        """SSD over the two ranks: generate_ssd's tokens for the same generator. Given one prompt returns (new
        tokens, trace); given a batch (a list of prompts), a list of each. On auto the autotune's latencies at the
        batch's size go to the drafter, whose tuners price on them; the estimates they learn from are the drafter
        process's own, carried over its calls (``ssd.pipeline.protocol.serve``)."""
        check_ssd_config(config, "ssd-pipeline")
        if self.closed:
            raise PipelineError("this Pipeline is closed; open a new one")
        prompts, single = as_batch(prompt_ids)
        prompts = check_prompts(self.pair, prompts, config)
        latencies = tuned_latencies(autotune, len(prompts)) if on_auto(config) else None
        verifier = Verifier(self.pair.target, prompts, config, self.pair.eos_token_ids)
        traces, clock = batch_traces("ssd-pipeline", prompts), Stopwatch()
        with self._end_both_on_error(), pinned(self.verifier_cores), clock.whole(*traces):
            # The target's prompts go in with round 0's verify pass (one forward fewer, as in SD). On one machine the
            # two ranks take both their cores in turn for their first work: the drafter's prompts' pass, first drafts
            # and round 0's pre-speculation, then that verify pass (run side by side, each on its own core, the long
            # prompt passes slowed each other more than taking turns costs).
            verify_call(self.channel, verifier, config, generator, self.pair.vocab_size, self.timeout_s, traces,
                        clock, same_host=self.drafter.host == socket.gethostname(),
                        first_cores=self.first_cores, latencies=latencies)
        return (verifier.new[0], traces[0]) if single else (verifier.new, traces)

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
                self.channel.send(Stop(), timeout_s=STOP_TIMEOUT_S, doing="stopping the drafter")
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
        _process.open.discard(self)
        if self.pair.pipeline is self:  # a closed Pipeline is no longer kept: the pair's next call opens another
            self.pair.pipeline = None

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


def pipeline_for(pair, config: SSDConfig) -> Pipeline:
    """The Pipeline generate_ssd_pipeline uses for pair: the one the pair keeps (pair.pipeline), opened on first use;
    reopened when the cores or timeout of a PipelineConfig change, or after a fault closed it."""
    if not isinstance(config, PipelineConfig):
        config = PipelineConfig(**dataclasses.asdict(config))  # the default cores and timeout
    options = (config.verifier_cores, config.drafter_cores, config.timeout_s)
    kept = pair.pipeline
    # kept.pair is pair: a shallow copy of a pair carries its attribute, and a copy's drafter is never its original's
    if kept is not None and kept.pair is pair and kept.options == options:  # a closed one is no longer kept
        return kept
    # One default process group per process: the Pipeline that any pair keeps (this one's with other options, or
    # another pair's) closes to make way. It is closed, never handed over: a pair's drafter is its own.
    for pipeline in list(_process.open):
        if pipeline.pair.pipeline is pipeline:
            pipeline.close()
    pair.pipeline = Pipeline(pair, verifier_cores=config.verifier_cores, drafter_cores=config.drafter_cores,
                             timeout_s=config.timeout_s)
    return pair.pipeline


def generate_ssd_pipeline(pair, prompt_ids, config: SSDConfig, generator: torch.Generator,
                          autotune: Autotune | None = None):
    """SSD with the drafter on its own cores or device, in the kit's method shape: see Pipeline.

    The pipeline starts on the first call (its drafter loads the draft) and the pair keeps it for later calls; it
    closes with close_pipeline(pair) or close_pipelines(), after a fault, at exit, or when another pair's call opens
    its own (one per process). A PipelineConfig sets its cores and timeout; an SSDConfig uses the defaults (verifier
    on core 0, drafter on core 1). On auto the autotune's profile (timed on the ranks' cores) prices the drafter's
    choices.
    """
    check_ssd_config(config, "ssd-pipeline")
    prompts = check_prompts(pair, as_batch(prompt_ids)[0], config)  # bad input fails before a drafter starts
    if on_auto(config):
        tuned_latencies(autotune, len(prompts))  # and so does a run on auto with no latencies for its batch size
    return pipeline_for(pair, config).generate(prompt_ids, config, generator, autotune)


def close_pipeline(pair) -> None:
    """Close the Pipeline that generate_ssd_pipeline keeps for pair, stopping its drafter; nothing if it keeps none."""
    if pair.pipeline is not None:
        pair.pipeline.close()


def open_pipelines() -> list[Pipeline]:
    """Every Pipeline of this process not yet closed (at most one: see Pipeline)."""
    return list(_process.open)


def close_pipelines() -> None:
    """Close every open Pipeline, kept by a pair or not, stopping their drafters (also run at interpreter exit)."""
    for pipeline in list(_process.open):
        pipeline.close()


atexit.register(close_pipelines)


# ---- torchrun ------------------------------------------------------------------------------------------------------


def stop_unused_torchrun_drafter(device) -> None:
    """Rank 0 of a torchrun job: if it never used the pipeline, rank 1 still waits for it; join it and tell it to
    stop. Nothing to do if it joined (closing the pipeline stopped the drafter)."""
    if _process.joined_torchrun:
        return
    device = torch.device(device)
    channel = init_group("nccl" if device.type == "cuda" else "gloo", env_store(0, 600.0), 0, device, 600.0,
                         WIRE_TYPES)
    try:
        channel.recv(Ready, timeout_s=600.0, limit="load_timeout_s", doing="waiting for the drafter to load")
        channel.send(Stop(), timeout_s=STOP_TIMEOUT_S, doing="stopping the drafter")
    finally:
        dist.destroy_process_group()

