"""A sweep point's process: `python -m ssd.execute NOTEBOOK OUT [--parameters YAML] [--cwd DIR]` runs one notebook
through papermill on a kernel over Unix sockets (ssd.cli.execute_main, ssd.course.kernel). Like __main__ and torchrun, a
launcher only: the command line stays on top, and nothing imports this."""
import sys

from .cli import execute_main

sys.exit(execute_main())
