"""``trainer.compile`` on the tasks' own backbones: a training step of the tiny profile traces
as one graph where the token count is fixed by the batch (a break splits the model into
graphs inductor cannot fuse across, and a data-dependent one waits for the GPU).

The point backbones (modelnet40, scannet and nuScenes' LiDAR branch) are compiled block by
block instead: their voxel pooling, serialization and patching produce tensors whose sizes
depend on the points (README, "trainer.compile")."""

from __future__ import annotations

import itertools

import pytest
import torch

from pe_bench.adapters import EncodingFactory
from pe_bench.harness.blocks import EncoderBlock
from pe_bench.harness.compile import compile_regions, maybe_compile
from pe_bench.harness.config import TrainerConfig, load_run_config
from pe_bench.tasks.base import get_task
from pe_bench.tasks.points.bench import random_scene
from pe_bench.tasks.points.ptv3 import PTv3, PTv3Config, points_geometry

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


def test_whole_backbones_compile_whole():
    """Only a backbone that declares data-dependent sizes is compiled block by block."""
    task = get_task("imagenet")(load_run_config("imagenet", "tiny", {}))
    model = task.build_model(EncodingFactory("rope", {}))
    assert compile_regions(model) == [model]


@pytest.mark.parametrize("task_name", ["modelnet40", "nuscenes"])
def test_point_backbones_compile_each_block_in_one_graph(task_name):
    """Voxel pooling, serialization and patching size tensors by the data, so the point
    backbones compile each transformer block instead of the whole model: every block traces as
    one graph (fullgraph), training steps on batches of other point counts reuse the compiled
    blocks (dynamic shapes) without reaching Dynamo's recompile limit (where it would run
    them uncompiled without an error), and every step's loss is eager's."""
    task = get_task(task_name)(load_run_config(task_name, "tiny", {}))
    torch.manual_seed(0)
    model = task.build_model(EncodingFactory("rope", {})).train()
    regions = compile_regions(model)
    assert regions and all(isinstance(region, EncoderBlock) for region in regions)
    assert len(regions) == sum(isinstance(m, EncoderBlock) for m in model.modules())
    module = task.lightning_module(model)
    data = task.datamodule(0)
    data.prepare_data()
    data.setup("fit")
    batches = list(itertools.islice(data.train_dataloader(), 3))
    eager = []
    for batch in batches:
        torch.manual_seed(1)
        eager.append(_loss(module.training_step(batch, 0)).detach())
    torch._dynamo.reset()
    maybe_compile(model, TrainerConfig(compile=True), backend="aot_eager", fullgraph=True)
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
        for batch, expected in zip(batches, eager, strict=True):
            torch.manual_seed(1)
            loss = _loss(module.training_step(batch, 0))
            loss.backward()
            torch.testing.assert_close(loss.detach(), expected, atol=1e-5, rtol=1e-5)


def test_deep_point_backbone_stays_compiled_past_dynamos_default_recompile_limit():
    """All blocks share one code object, and Dynamo keeps one entry per guard set on it (a
    stage's width; training or evaluation): a PTv3 of 10 stages needs more than Dynamo's
    default of 8 (the paper ScanNet PTv3 has 9 stages and 22 blocks), past which the
    remaining blocks would run uncompiled without an error. ``maybe_compile`` raises the
    limit; the same compilation under the default limit is shown to reach it."""
    widths = list(range(8, 88, 8))
    cfg = PTv3Config(enc_depths=[1] * 10, enc_channels=widths, enc_num_head=[1] * 10, stride=1, cpe="none")
    model = PTv3(EncodingFactory("rope", {}), points_geometry(0.02, 50.0), cfg, 6, 0.02, "cls", patch_size=64)
    points = random_scene(300, 0.02, 6, "cpu")

    def train_then_evaluate() -> None:
        model.train()(points).square().mean().backward()
        with torch.no_grad():
            model.eval()(points)

    with torch._dynamo.config.patch(recompile_limit=8, fail_on_recompile_limit_hit=True):
        torch._dynamo.reset()
        for region in compile_regions(model):
            region.compile(backend="aot_eager")
        with pytest.raises(Exception, match="recompile_limit"):
            train_then_evaluate()
        torch._dynamo.reset()
        maybe_compile(model, TrainerConfig(compile=True), backend="aot_eager")
        train_then_evaluate()
