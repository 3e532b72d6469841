import pytest
import torch


def pytest_configure(config):
    # Tiny models gain nothing from a second thread, and OpenMP threads that spin waiting for a busy core make
    # them many times slower; the real pair's fixture raises the count while it runs.
    torch.set_num_threads(1)


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the xdist_group marks into the test ids
def pytest_collection_modifyitems(config, items):
    # Under pytest-xdist (`make test` runs `-n auto --dist loadgroup`) the tests of the real pair run in one worker,
    # one after the other: each module loads about 10 GB, and two at once would not fit beside the tiny tests. They
    # go first, since together they are the longest chain; the tiny tests (one thread each) fill the other cores.
    for item in items:
        if item.get_closest_marker("real"):
            item.add_marker(pytest.mark.xdist_group("real"))
    items.sort(key=lambda item: item.get_closest_marker("real") is None)  # stable: each module keeps its order


def pytest_collection_finish(session):
    # xdist's loadgroup groups tests by a suffix it adds to their ids; a pytest that keeps ids otherwise (pytest 9 with
    # xdist 3.8) leaves them apart, and the real pair would load in two workers at once (over 20 GB): stop and say so.
    if getattr(session.config.option, "loadgroup", False):
        apart = [item.nodeid for item in session.items
                 if item.get_closest_marker("real") and not item.nodeid.endswith("@real")]
        if apart:
            raise pytest.UsageError(f"pytest-xdist did not group the real pair's tests ({apart[0]}, ...): use the "
                                    "pytest and pytest-xdist versions pyproject.toml pins")
