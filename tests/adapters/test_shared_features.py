"""Position-only features computed once per forward (``shared_per_forward``): the memo's
lifetime and keys, the same numbers as computing them in every layer, and the operators
it saves (counted, not timed)."""

from __future__ import annotations

import pytest
import torch

from pe_bench.adapters import EncodingFactory, PositionLayout
from pe_bench.adapters.base import AttentionInputs, key_centred_coords, shared_per_forward
from pe_bench.adapters.registry import available
from pe_bench.harness.config import ModelConfig
from pe_bench.harness.reports.op_count import OperatorCounter, bytes_written_per_step, operators_per_pass
from pe_bench.tasks._shared.vit import ViT, image_geometry

TINY = ModelConfig(dim=32, depth=4, num_heads=4, mlp_ratio=2.0, patch_size=4)


def _inputs(query: PositionLayout, key: PositionLayout | None = None) -> AttentionInputs:
    x = torch.zeros(query.coords.shape[0], query.coords.shape[1], 4)
    return AttentionInputs(x_q=x, x_k=x, query=query, key=query if key is None else key)


def _counting(values):
    calls = []

    def compute():
        calls.append(1)
        return values[len(calls) - 1]

    return compute, calls


def test_sharing_features_gives_a_fresh_memo_that_copies_do_not_inherit():
    layout = PositionLayout.grid(2, (3, 3))
    shared = layout.sharing_features()
    assert layout._shared is None and shared._shared == {}
    assert shared.coords is layout.coords and shared.has_pos is layout.has_pos
    assert shared.with_coords(shared.coords + 1)._shared is None  # other positions: no memo
    assert shared.sharing_features()._shared is not shared._shared  # the next forward starts empty


def test_computes_once_per_name_and_key_layout():
    query = PositionLayout.grid(1, (2, 2)).sharing_features()
    other_key = PositionLayout.grid(1, (3, 3))
    compute, calls = _counting(["self", "cross", "dtype"])
    self_attention, cross_attention = _inputs(query), _inputs(query, other_key)
    assert shared_per_forward(self_attention, "f", compute) == "self"
    assert shared_per_forward(self_attention, "f", compute) == "self"  # a later layer: memo
    assert shared_per_forward(cross_attention, "f", compute) == "cross"  # another key layout
    assert shared_per_forward(cross_attention, "f", compute) == "cross"
    assert shared_per_forward(self_attention, ("f", torch.float64), compute) == "dtype"  # another name
    assert len(calls) == 3


def test_without_a_memo_every_call_computes():
    layout = PositionLayout.grid(1, (2, 2))  # not made by sharing_features
    compute, calls = _counting([1, 2])
    assert [shared_per_forward(_inputs(layout), "f", compute) for _ in range(2)] == [1, 2]
    assert len(calls) == 2


def test_a_reused_id_does_not_return_another_layouts_value():
    """The entry remembers its key layout: a new layout that happens to get the id of a
    dead one (CPython reuses addresses) must not read the dead one's value."""
    query = PositionLayout.grid(1, (2, 2)).sharing_features()
    key = PositionLayout.grid(1, (2, 2))
    query._shared[("f", id(key))] = (object(), "stale")  # an entry of a different layout at that id
    assert shared_per_forward(_inputs(query, key), "f", lambda: "fresh") == "fresh"


def _vit(method: str) -> ViT:
    torch.manual_seed(0)
    return ViT(EncodingFactory(method, {}), image_geometry((16, 16), 4), TINY, 3, 10)


def _outputs_and_grads(model: ViT, images: torch.Tensor) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    out = model(images)
    out.square().sum().backward()
    return [out.detach()] + [p.grad for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize("method", available())
def test_sharing_changes_no_number(method, monkeypatch):
    """Every encoding, forward and gradients, bit for bit: the memo hands each layer the very
    values it would have computed itself."""
    model = _vit(method).train()
    images = torch.randn(2, 3, 16, 16)
    torch.manual_seed(1)  # the same augmentation draws (CAPE) in both runs
    shared = _outputs_and_grads(model, images)
    monkeypatch.setattr(PositionLayout, "sharing_features", lambda self: self)
    torch.manual_seed(1)
    per_layer = _outputs_and_grads(model, images)
    assert len(shared) == len(per_layer)
    for a, b in zip(shared, per_layer, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    ("method", "operator"),
    [
        ("rope", "aten.cos"),  # the rotation tables
        ("pape", "aten.clamp_min"),  # the key-centred frame (masked mean)
        ("alibi", "aten._cdist_forward"),  # the dense bias
        ("relpos", "aten.round"),  # the table cells
        ("lookhere", "aten.sqrt"),  # distances and fields of view
        ("sape2", "aten.amin"),  # the grid's origin (its cells and masks: sape2.GridLines)
    ],
)
def test_position_only_features_are_computed_once_per_forward(method, operator):
    model = _vit(method).eval()
    with torch.no_grad(), OperatorCounter() as counter:
        model(torch.randn(2, 3, 16, 16))
    assert counter.counts[operator] == 1, f"{method}: {operator} ran {counter.counts[operator]}x in 4 layers"


def test_sape2_on_flex_shares_its_cells_with_the_same_numbers(monkeypatch):
    """SaPE²'s Flex form (CUDA's from 2²³ bias elements on) takes its cells and step values
    from the forward's memo too: the same outputs as computing them in every layer, and the
    grid's origin found once."""
    from pe_bench.adapters import sape2
    from pe_bench.harness.attention import attention_kernel

    calls, cell_indices = [], sape2.cell_indices
    monkeypatch.setattr(sape2, "cell_indices", lambda layout: calls.append(1) or cell_indices(layout))
    model = _vit("sape2").eval()
    images = torch.randn(2, 3, 16, 16)
    with torch.no_grad(), attention_kernel("flex"):
        shared = model(images)
    assert len(calls) == 1  # 4 layers
    monkeypatch.setattr(PositionLayout, "sharing_features", lambda self: self)
    with torch.no_grad(), attention_kernel("flex"):
        per_layer = model(images)
    assert len(calls) == 1 + 4
    assert torch.equal(shared, per_layer)


def test_the_memo_dies_with_its_forward():
    """An inference forward's tables (inference tensors) are not reused by the next forward,
    where autograd would have to save them."""
    model = _vit("rope")
    images = torch.randn(2, 3, 16, 16)
    with torch.inference_mode():
        model.eval()(images)
    model.train()(images).sum().backward()


def test_operator_counter_counts_kernels_not_views():
    x = torch.randn(4, 6)
    with OperatorCounter() as counter:
        y = x.view(6, 4).t().unsqueeze(0)[0]  # views only
        assert counter.total == 0
        (y * 2).sum()
    assert dict(counter.counts) == {"aten.mul": 1, "aten.sum": 1}
    assert dict(counter.written) == {"aten.mul": 4 * 6 * 4, "aten.sum": 4}  # float32 outputs


def test_rope_forward_adds_few_operators_over_nopos():
    """The count behind eager per-operator overhead: with tables shared, RoPE adds the
    rotation of q and k per layer (swap, two products, a sum each) and one table setup."""
    images = torch.randn(1, 3, 16, 16)
    nopos, _ = operators_per_pass(_vit("nopos"), images)
    rope, _ = operators_per_pass(_vit("rope"), images)
    per_layer = 2 * 4  # flip, two muls, add for q and for k
    setup = 20  # centring, angles, cos/sin, casts, table layout: once per forward
    assert nopos + TINY.depth * per_layer <= rope <= nopos + TINY.depth * per_layer + setup


def _per_sample(layout: PositionLayout) -> PositionLayout:
    """``layout`` with every sample's positions and flags stored (no stride 0 over the batch)."""
    return PositionLayout(layout.coords.contiguous(), layout.has_pos.contiguous(), grid_shape=layout.grid_shape)


def _store_grid_positions_per_sample(monkeypatch) -> None:
    """Backbones' grid layouts stored per sample, which defeats building them once per batch."""
    grid = PositionLayout.grid
    stored = staticmethod(lambda *args, **kwargs: _per_sample(grid(*args, **kwargs)))
    monkeypatch.setattr(PositionLayout, "grid", stored)


@pytest.mark.parametrize("method", available())
def test_positions_shared_by_the_batch_change_no_output(method, monkeypatch):
    """A grid layout is expanded over the batch (stride 0), so position-only features are
    built for one sample and broadcast (``first_sample_if_shared``); with every sample's
    positions stored separately they are built per sample. Outputs are equal bit for bit;
    gradients of position parameters (PaPE's W_p, learned frequencies) sum the samples in
    another order, so they agree to rounding."""
    model = _vit(method).train()
    images = torch.randn(3, 3, 16, 16)
    torch.manual_seed(1)
    shared = _outputs_and_grads(model, images)
    _store_grid_positions_per_sample(monkeypatch)
    torch.manual_seed(1)
    separate = _outputs_and_grads(model, images)
    assert torch.equal(shared[0], separate[0])
    for a, b in zip(shared[1:], separate[1:], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_key_centred_positions_of_a_shared_grid_are_built_once():
    shared = PositionLayout.grid(4, (3, 3), 1)
    separate = _per_sample(shared)
    r_shared, _ = key_centred_coords(_inputs(shared))
    r_separate, _ = key_centred_coords(_inputs(separate))
    assert r_shared.shape == (1, 10, 2) and r_separate.shape == (4, 10, 2)
    assert torch.equal(r_shared.expand(4, -1, -1), r_separate)


@pytest.mark.parametrize("method", ["pape", "rope-mixed", "string-cayley"])
def test_positions_shared_by_the_batch_are_written_once(method, monkeypatch):
    """The point of building a grid's position features for one sample: a training step
    writes fewer bytes than with every sample's positions stored separately."""
    model = _vit(method)
    images = torch.randn(4, 3, 16, 16)
    shared = bytes_written_per_step(model, images)
    _store_grid_positions_per_sample(monkeypatch)
    assert shared < 0.95 * bytes_written_per_step(model, images)
