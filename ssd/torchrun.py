"""torchrun's entry point: `torchrun --nproc-per-node 2 -m ssd.torchrun ARGS` runs the pipeline as a torchrun job.

Rank 0 runs `python -m ssd ARGS` (use the method ssd-pipeline there); rank 1 loads the draft of --pair on
--drafter-cores (or its GPU) and serves drafts until rank 0 is done. It sits above both the command line and the
pipeline, so that the pipeline, the lowest-level mechanism, knows nothing of the command line.
"""
from __future__ import annotations

import os
import sys

import torch

from .cli import build_parser, main
from .pipeline import close_pipelines, env_rank, serve_torchrun, stop_unused_torchrun_drafter


def torchrun_main(argv=None) -> int:
    rank = env_rank()
    if rank is None:
        print("ssd.torchrun runs as a torchrun job: torchrun --nproc-per-node 2 -m ssd.torchrun bench --methods "
              "ar,ssd-pipeline ... (see README). On one machine, `python -m ssd ... --methods ssd-pipeline` starts "
              "the drafter itself.", file=sys.stderr)
        return 2
    args = build_parser().parse_args(argv)
    if not hasattr(args, "drafter_cores"):  # a command that decodes nothing (models): rank 1 has nothing to serve
        return main(argv) if rank == 0 else 0
    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    if rank == 1:
        return serve_torchrun(args.pair, drafter_cores=args.drafter_cores, device=device, precision=args.draft_dtype)
    try:
        return main(argv)
    finally:
        close_pipelines()
        stop_unused_torchrun_drafter(device)


if __name__ == "__main__":
    sys.exit(torchrun_main())
