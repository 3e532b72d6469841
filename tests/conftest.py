import pytest
import torch


def pytest_configure(config):
    # Tiny models gain nothing from a second thread, and OpenMP threads that spin waiting for a busy core make
    # them many times slower; the real pair's fixture raises the count while it runs.
    torch.set_num_threads(1)
