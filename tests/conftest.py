import pytest
import torch


def pytest_configure(config):
    # Tiny models gain nothing from a second thread, and OpenMP threads that spin waiting for a busy core make
    # them many times slower; the real pair's fixture raises the count while it runs.
    torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    # Under pytest-xdist (`make test` runs `-n auto --dist loadgroup`) the tests of the real pair run in one worker,
    # one after the other: each module loads about 10 GB, and two at once would not fit beside the tiny tests. They
    # go first, since together they are the longest chain; the tiny tests (one thread each) fill the other cores.
    for item in items:
        if item.get_closest_marker("real"):
            item.add_marker(pytest.mark.xdist_group("real"))
    items.sort(key=lambda item: item.get_closest_marker("real") is None)  # stable: each module keeps its order
