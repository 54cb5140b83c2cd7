"""``trainer.compile`` on the tasks' own backbones: a training step of the tiny profile traces
as one graph where the token count is fixed by the batch (a break splits the model into
graphs inductor cannot fuse across, and a data-dependent one waits for the GPU).

The point backbones (modelnet40, scannet and nuScenes' LiDAR branch) are not in this list:
their voxel pooling, serialization and patching produce tensors whose sizes depend on the
points, so Dynamo splits them into dozens of graphs there (README, "trainer.compile")."""

from __future__ import annotations

import pytest
import torch

from pe_bench.adapters import EncodingFactory
from pe_bench.harness.config import load_run_config
from pe_bench.tasks.base import get_task

# training_step logs; outside a Trainer Lightning warns that nothing records it
pytestmark = pytest.mark.filterwarnings("ignore:You are trying to `self.log\\(\\)`")


def _loss(out) -> torch.Tensor:
    return out["loss"] if isinstance(out, dict) else out


@pytest.mark.parametrize("task_name", ["ucf101", "wmt14-en-de"])
def test_padded_batches_train_compiled_in_one_graph(task_name):
    """Videos of several lengths and sentences with padding: the padding mask is kept as it
    is under compile (``padding_mask``) rather than tested for all-True, which broke the
    graph; the compiled step computes the eager loss."""
    task = get_task(task_name)(load_run_config(task_name, "tiny", {}))
    torch.manual_seed(0)
    model = task.build_model(EncodingFactory("rope", {})).train()
    module = task.lightning_module(model)
    data = task.datamodule(0)
    data.prepare_data()
    data.setup("fit")
    batch = next(iter(data.train_dataloader()))
    torch.manual_seed(1)
    eager = _loss(module.training_step(batch, 0)).detach()
    torch._dynamo.reset()
    model.compile(backend="aot_eager", fullgraph=True)
    torch.manual_seed(1)
    compiled = _loss(module.training_step(batch, 0))
    compiled.backward()
    torch.testing.assert_close(compiled.detach(), eager, atol=1e-5, rtol=1e-5)
