"""torchrun's entry point: `torchrun --nproc-per-node 2 -m ssd.torchrun ARGS` runs the pipeline as a torchrun job
(ssd.cli.torchrun_main). Like __main__, a launcher only: the command line stays on top, and nothing imports this."""
import sys

from .cli import torchrun_main

sys.exit(torchrun_main())
