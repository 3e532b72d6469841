"""The pipeline's transport: the two-rank process group and one rank's end of the link to the other.

A message is a small record of an allowed type (``ssd.pipeline.protocol`` defines them; ``ssd.pipeline.wire`` encodes
them as JSON, never pickle: a peer, perhaps on another host, can make this rank build only allowed records) and, for a
draft at temperature > 0, the [n, V] q rows it was drawn from. Every wait is bounded and watches the peer: a rank that
dies or hangs, or sends a malformed message, becomes a PipelineError that says which, never a hang.
"""
from __future__ import annotations

import os
import re
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from .wire import Wire, WireError, check_header

POLL_S = 0.05  # how often a waiting rank looks at its peer's health and the clock
FOREVER_S = 10 * 365 * 86400.0  # the drafter's wait between two generate calls has no deadline


class PipelineError(RuntimeError):
    """The other rank died, hung or raised; the message says which, and quotes what the drafter reported."""


def check_seconds(value, name: str) -> None:
    if not (isinstance(value, (int, float)) and value > 0):
        raise ValueError(f"{name} must be a number of seconds > 0, got {value!r}")


class Channel:
    """One rank's end of the link. A message is a small record of one of the allowed types (ssd.pipeline.wire's
    JSON), whose type says what it is, and for a draft at temperature > 0 the q rows [n, V] it was drawn from. It
    travels as three transfers: a header (record bytes, q shape), the record, the rows."""

    def __init__(self, peer: int, device, allowed: tuple[type, ...], peer_gone=lambda: None):
        self.peer, self.rank = peer, 1 - peer
        self.wire = Wire(allowed)  # the dataclasses a message may hold (ssd.pipeline.protocol.WIRE_TYPES)
        self.device = torch.device(device)  # where transfers live: the rank's GPU under NCCL, else the CPU
        self.peer_gone = peer_gone  # () -> None while the peer may be alive, else why it is known to be gone

    def send(self, record, q: torch.Tensor | None = None, *, timeout_s: float, doing: str,
             limit: str = "timeout_s") -> None:
        meta = torch.frombuffer(bytearray(self.wire.encode(record)), dtype=torch.uint8)
        rows, cols = q.shape if q is not None and q.numel() else (0, 0)
        for part in [torch.tensor([meta.numel(), rows, cols]), meta] + ([q.float()] if rows else []):
            part = part.to(self.device).contiguous()
            self._wait(dist.isend(part, self.peer), timeout_s, doing, limit)

    def recv(self, *kinds: type, timeout_s: float | None, doing: str, limit: str = "timeout_s"):
        """The next message, which must be of one of these types: (record, q rows [n, V] or None)."""
        n, rows, cols = self._recv(torch.empty(3, dtype=torch.long), timeout_s, doing, limit).tolist()
        try:
            check_header(n, rows, cols)  # before allocating what it announces
            meta = self._recv(torch.empty(n, dtype=torch.uint8), timeout_s, doing, limit)
            record = self.wire.decode(meta.cpu().numpy().tobytes())
        except WireError as e:
            raise PipelineError(f"rank {self.rank}: a malformed message from rank {self.peer} while {doing}: {e}"
                                ) from None
        q = self._recv(torch.empty(rows, cols), timeout_s, doing, limit) if rows else None
        if not isinstance(record, kinds):
            expected = " or ".join(k.__name__ for k in kinds)
            raise PipelineError(f"protocol error while {doing}: expected {expected}, got {type(record).__name__}")
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


def init_group(backend: str, store, rank: int, device: torch.device, timeout_s: float, allowed: tuple[type, ...]
               ) -> Channel:
    """Join the two-rank process group (0 the verifier, 1 the drafter) and return this rank's end of the link, whose
    messages hold the allowed dataclasses."""
    nccl = backend == "nccl"
    dist.init_process_group(backend, store=store, rank=rank, world_size=2, timeout=timedelta(seconds=timeout_s),
                            device_id=device if nccl else None)
    return Channel(1 - rank, device if nccl else "cpu", allowed)


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
