import multiprocessing.process
import os
import pathlib
import platform
import shutil
import subprocess
import tempfile

import pytest
import torch

# The tiers (docs/testing.md, "Tiers"): a test is a unit test unless it is marked integration (it starts processes:
# subprocesses, the pipeline's ranks, papermill's kernels, the command line as a process; or it is slow), real (it
# loads the real pair) or gpu. `make test-fast` runs the unit tier alone, in under a minute.
TIERS_BEYOND_UNIT = ("integration", "real", "gpu")


def worker_cores() -> int:
    """The cores one pytest-xdist worker may keep busy: the machine's, shared evenly among the workers. A torch that
    runs more threads than that contends with the other workers' tests, and its OpenMP threads spin waiting for a busy
    core: on a 2-core machine the real pair's tests took twice as long at two threads beside a tiny test as at one."""
    return max(1, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))


def pytest_configure(config):
    # Tiny models gain nothing from a second thread, and OpenMP threads that spin waiting for a busy core make
    # them many times slower; the real pair's fixture (cores_of_this_worker) raises the count while it runs.
    torch.set_num_threads(1)
    # The machine's name (ssd.bench) reads platform.processor(), which runs `uname -p` once per process and keeps the
    # answer: asked here, no unit test is blamed for it (unit_tests_start_no_process).
    platform.processor()
    use_ipc_kernels_in_nbval()
    if not hasattr(config, "workerinput"):  # the controller, or pytest without xdist: once, before any worker starts
        send_the_notebooks_outputs_elsewhere(config)
        config.stash[STATUS_BEFORE] = git_status()
    if hasattr(config, "workerinput"):  # an xdist worker (never the controller: the workers would inherit its value)
        # The processes a worker starts (nbval's and papermill's kernels, the pipeline's ranks, the command line)
        # read this when they import torch: the worker's share of the cores, whatever the caller's shell had set.
        os.environ["OMP_NUM_THREADS"] = str(worker_cores())
        a_folder_of_its_own(config.workerinput["workerid"])


# ---- make test leaves the checkout as it found it ------------------------------------------------------------------

REPOSITORY = pathlib.Path(__file__).resolve().parent.parent
STATUS_BEFORE = pytest.StashKey[str | None]()
COURSE_OUT = pytest.StashKey[str | None]()


def send_the_notebooks_outputs_elsewhere(config):
    """nbval executes the stored notebooks at their defaults, which write their figures into figures/ (tracked) and
    06's demo into data/demo: SSD_COURSE_OUT, which every notebook's parameters cell reads, sends them to a temporary
    folder instead. Set here, before xdist starts its workers, so that every worker and every kernel they start
    inherits it; a value the caller set is kept (and not removed)."""
    if os.environ.get("SSD_COURSE_OUT"):
        config.stash[COURSE_OUT] = None
        return
    config.stash[COURSE_OUT] = os.environ["SSD_COURSE_OUT"] = tempfile.mkdtemp(prefix="ssd-course-out-")


def a_folder_of_its_own(worker: str) -> None:
    """Each worker's notebooks write under their own subfolder of SSD_COURSE_OUT: two workers that ran the same
    notebook into one folder at once (nbval's 06 and the tiny pair's 06) read each other's half-written demo CSV (a CI
    run failed so). A worker runs its tests one after another, so within it one folder is enough."""
    if os.environ.get("SSD_COURSE_OUT"):
        os.environ["SSD_COURSE_OUT"] = os.path.join(os.environ["SSD_COURSE_OUT"], worker)


def git_status() -> str | None:
    """The checkout's `git status --porcelain` (None outside a git checkout, or without git)."""
    try:
        done = subprocess.run(["git", "-C", str(REPOSITORY), "status", "--porcelain"], capture_output=True, text=True)
    except OSError:
        return None
    return done.stdout if done.returncode == 0 else None


def pytest_unconfigure(config):
    if not hasattr(config, "workerinput") and config.stash.get(COURSE_OUT, None):
        shutil.rmtree(config.stash[COURSE_OUT], ignore_errors=True)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    """The whole run, nbval included, must leave the tracked files as they were (a CI run once found figures/05_*.png
    rewritten): compared with the status at the start, so a checkout with work in progress can run the tests too."""
    config = session.config
    if hasattr(config, "workerinput") or STATUS_BEFORE not in config.stash:
        return
    before, after = config.stash[STATUS_BEFORE], git_status()
    if before is None or after is None or after == before:
        return
    changed = sorted(set(after.splitlines()) - set(before.splitlines()))
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    message = ("the tests changed the checkout (git status --porcelain): " + "; ".join(changed or after.splitlines())
               + ". A test or notebook wrote into the repository: send it to a temporary folder (SSD_COURSE_OUT)")
    if reporter is not None:
        reporter.ensure_newline()
        reporter.write_line(f"FAILED {message}", red=True, bold=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


def use_ipc_kernels_in_nbval():
    """nbval starts its kernels with jupyter_client's KernelManager, over TCP ports that another process can bind
    before the kernel does (a CI run failed so: ssd.course.kernel). nbval offers no setting for it, so its module gets
    the kernel manager the course and the sweeps use."""
    import nbval.kernel

    from ssd.course.kernel import IpcKernelManager

    nbval.kernel.KernelManager = IpcKernelManager


@pytest.fixture(scope="module")
def cores_of_this_worker():
    """A real model's tests run at this worker's share of the cores (every core when pytest runs alone)."""
    threads, cores = torch.get_num_threads(), worker_cores()
    torch.set_num_threads(cores)
    yield cores
    torch.set_num_threads(threads)


def is_notebook(item) -> bool:
    return item.path.suffix == ".ipynb"  # a cell of a notebook nbval runs (make test: pytest --nbval tests notebooks)


def loads_the_real_pair(item) -> bool:
    return item.get_closest_marker("real") is not None or is_notebook(item)


def heavy_group(item) -> str | None:
    """The xdist group of a test that loads the real pair: "real" for the real pair's tests, "course" for the
    notebooks' cells (nbval runs a notebook's cells in order in one kernel, so the course stays in one worker)."""
    return "course" if is_notebook(item) else "real" if loads_the_real_pair(item) else None


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the xdist_group marks into the test ids
def pytest_collection_modifyitems(config, items):
    # Under pytest-xdist (`make test` runs `-n auto --dist loadgroup`) the real pair's tests run in one worker and the
    # course in another, side by side: the two longest chains of work (21 and 20 minutes on the AVX2 machine) no longer
    # queue one behind the other. Two real pairs fit in memory at once (the float32 weights are memory-mapped from one
    # cache, shared), and the cache's locks make one worker build the weights and time auto while the other waits
    # (ssd.files.cache_lock). xdist hands the largest groups out first; the tiny tests (one thread each) follow.
    for item in items:
        if group := heavy_group(item):
            item.add_marker(pytest.mark.xdist_group(group))
        add_tier(item)


def add_tier(item) -> None:
    """A notebook's cells are integration tests (nbval runs them in a kernel); an unmarked test is a unit test, so that
    a new test lands in the fast tier unless it says otherwise."""
    if is_notebook(item) or starts_a_drafter(item):
        item.add_marker(pytest.mark.integration)
    if not any(item.get_closest_marker(tier) for tier in TIERS_BEYOND_UNIT):
        item.add_marker(pytest.mark.unit)


def starts_a_drafter(item) -> bool:
    """A case of a test parametrized over the methods whose method is the two-rank pipeline (test_golden's): it spawns
    the drafter's process, though the test's other cases are unit tests."""
    params = getattr(item, "callspec", None)
    return params is not None and "ssd-pipeline" in params.params.values()


@pytest.fixture(autouse=True)
def unit_tests_start_no_process(request, monkeypatch):
    """The unit tier's promise, checked: a unit test that starts a process (a subprocess, a multiprocessing Process:
    the pipeline's drafter, papermill's kernel) fails, even where the test catches the error."""
    if request.node.get_closest_marker("unit") is None:
        yield
        return
    started = []

    def refuse(self, *args, **kwargs):  # as Popen.__init__(self, args, ...) or Process.start(self)
        started.append(args[0] if args else kwargs.get("args", type(self).__name__))
        raise RuntimeError(f"{request.node.nodeid} is a unit test and started a process ({started[-1]!r}): mark it "
                           "@pytest.mark.integration (or its module pytestmark = pytest.mark.integration; "
                           "docs/testing.md, Tiers)")

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refuse)
    yield
    if started:
        pytest.fail(f"{request.node.nodeid} is a unit test and started a process ({started[0]!r}): mark it integration")


def pytest_collection_finish(session):
    # xdist's loadgroup groups tests by a suffix it adds to their ids; a pytest that keeps ids otherwise (pytest 9 with
    # xdist 3.8) leaves them apart: a notebook's cells would run in several kernels (each needs the cells before it)
    # and every worker would load the real pair. Stop and say so.
    if getattr(session.config.option, "loadgroup", False):
        apart = [item.nodeid for item in session.items
                 if loads_the_real_pair(item) and not item.nodeid.endswith(f"@{heavy_group(item)}")]
        if apart:
            raise pytest.UsageError(f"pytest-xdist did not group the real pair's tests ({apart[0]}, ...): use the "
                                    "pytest and pytest-xdist versions pyproject.toml pins")
