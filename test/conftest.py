"""Suite-wide settings for a small shared machine (CI has 2 cores)."""
import os

import pytest
import torch

# The tiny test models gain nothing from intra-op threads, and OpenMP threads that
# spin against the other processes of a DDS test (node, player, test) make every
# step many times slower. Exported so node subprocesses inherit it.
os.environ.setdefault('OMP_NUM_THREADS', '1')


@pytest.fixture(scope='session', autouse=True)
def single_torch_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
