"""Executing a notebook with papermill on this environment's python3 kernel, over Unix sockets.

Over TCP, jupyter_client asks the OS for five free ports, writes them down and closes them; the kernel binds them a
second or two later, once it has started. Any process that binds a port in that gap (another kernel, the pipeline's
gloo ranks, a test's server) makes the kernel die with "Address already in use", and the run fails a minute later
with "Kernel didn't respond in 60 seconds": one CI run of `make test` failed so. A Unix socket is named after the
kernel's own id, so no other process can take it. The course, every sweep point and the tests run their kernels
through this module; a sweep point's process is `python -m ssd.execute` (the launcher of ``ssd.cli.execute_main``).
"""
from __future__ import annotations

import os
import tempfile

from jupyter_client.manager import KernelManager
from traitlets import default


class IpcKernelManager(KernelManager):
    """A kernel whose five sockets are files, not ports: nothing outside it can bind them first."""

    @default("transport")
    def _transport_default(self) -> str:
        return "ipc"

    @default("ip")
    def _ip_default(self) -> str:
        if self.transport != "ipc":  # set to tcp by whoever made it: localhost, as jupyter_client has it
            return super()._ip_default()
        # The sockets are this prefix plus -1 to -5 (removed when the kernel shuts down). Jupyter's default prefix lies
        # in its runtime folder under $HOME, which can exceed the 107 bytes a socket's path may have; the temporary
        # folder is short where it matters.
        return os.path.join(tempfile.gettempdir(), f"kernel-{self.kernel_id or os.getpid()}-ipc")


def execute_notebook(path: str, out: str, parameters: dict | None = None, cwd: str | None = None) -> None:
    """papermill.execute_notebook on the python3 kernel over Unix sockets; the kernel runs in `cwd` (by default the
    notebook's folder, as in JupyterLab and nbval, so a notebook's ../data paths agree)."""
    import papermill  # a second or so to import: `python -m ssd` should not pay for it on every command

    cwd = cwd or os.path.dirname(os.path.abspath(path))
    papermill.execute_notebook(path, out, parameters=parameters or {}, cwd=cwd, kernel_name="python3",
                               progress_bar=False, kernel_manager_class=IpcKernelManager)

