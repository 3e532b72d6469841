"""Notebooks run on kernels over Unix sockets (ssd.course.kernel): through papermill in-process, as a sweep point's
process, and under nbval (tests/conftest.py), so no other process can bind a kernel's port before the kernel does."""
import json
import subprocess
import sys

import nbformat
import pytest
from ssd.course.kernel import IpcKernelManager, execute_notebook

pytestmark = pytest.mark.integration  # kernels and `python -m ssd.execute`

# The kernel writes what it was started with: its transport, and where it ran.
REPORT = """
import json, os
from ipykernel.kernelapp import IPKernelApp
app = IPKernelApp.instance()
with open(report, "w") as f:
    json.dump({"transport": app.transport, "ip": app.ip, "cwd": os.getcwd(), "greeting": greeting}, f)
"""


def report_notebook(path):
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "language": "python",
                                                           "display_name": "Python 3"}})
    parameters = nbformat.v4.new_code_cell('report = "report.json"\ngreeting = "hello"',
                                           metadata={"tags": ["parameters"]})
    nb.cells = [parameters, nbformat.v4.new_code_cell(REPORT)]
    nbformat.write(nb, path)
    return path


def test_papermill_runs_the_kernel_over_unix_sockets_in_the_notebooks_folder(tmp_path):
    folder = tmp_path / "notebooks"
    folder.mkdir()
    notebook = report_notebook(folder / "report.ipynb")
    execute_notebook(str(notebook), str(tmp_path / "out.ipynb"), parameters={"greeting": "hi"})
    report = json.loads((folder / "report.json").read_text())
    assert report["transport"] == "ipc" and report["cwd"] == str(folder) and report["greeting"] == "hi"
    assert len(report["ip"]) + len("-5") < 107  # a Unix socket's path has at most 107 bytes


def test_the_sweeps_point_process_passes_parameters_and_cwd(tmp_path):
    notebook = report_notebook(tmp_path / "report.ipynb")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    subprocess.run([sys.executable, "-m", "ssd.execute", str(notebook), str(tmp_path / "out.ipynb"),
                    "--parameters", "greeting: yo", "--cwd", str(elsewhere)], check=True, timeout=300)
    report = json.loads((elsewhere / "report.json").read_text())
    assert report["transport"] == "ipc" and report["greeting"] == "yo"


def test_the_sweeps_point_process_refuses_parameters_that_are_not_a_mapping(tmp_path):
    done = subprocess.run([sys.executable, "-m", "ssd.execute", "x.ipynb", "y.ipynb", "--parameters", "[1, 2]"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--parameters must be a YAML mapping, got list" in done.stderr


def test_nbval_starts_its_kernels_over_unix_sockets():
    from nbval.kernel import CURRENT_ENV_KERNEL_NAME, start_new_kernel

    km, kc = start_new_kernel(kernel_name=CURRENT_ENV_KERNEL_NAME)
    try:
        assert km.transport == "ipc" and kc.transport == "ipc"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_a_kernel_manager_set_to_tcp_keeps_tcp_and_localhost():
    km = IpcKernelManager(transport="tcp")
    assert km.transport == "tcp" and km.ip in ("127.0.0.1", "localhost")
