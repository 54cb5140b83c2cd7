"""Detection tests train small models: one torch thread, as the grid's ``trainer.threads=1``
does, because several threads on a busy machine made the fixed-batch test 20x slower here."""

import pytest
import torch


@pytest.fixture(autouse=True)
def one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
