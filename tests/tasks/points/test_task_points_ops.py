"""PTv3 building blocks: sparse conv vs dense conv3d, serialization, pooling, patch grouping."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pe_bench.adapters import PositionLayout, build
from pe_bench.harness.blocks import EncoderBlock
from pe_bench.tasks._shared.grouping import grid_pool, grid_unpool, make_patches, segment_reduce, unique_rows
from pe_bench.tasks._shared.serialization import ORDERS, encode, serialize
from pe_bench.tasks.points.ptv3 import points_geometry
from pe_bench.tasks.points.sparse_conv import SubMConv3d, neighbour_table, spconv_available


def sparse_grid(batch: int, side: int, fill: float, seed: int = 0):
    """Random occupied voxels of a side^3 grid per batch element (unique per element)."""
    g = torch.Generator().manual_seed(seed)
    occupied = torch.rand(batch, side, side, side, generator=g) < fill
    idx = occupied.nonzero()
    return idx[:, 1:], idx[:, 0], occupied


@pytest.mark.parametrize("kernel", [3, 5])
def test_submanifold_conv_matches_dense_conv3d_outputs_and_gradients(kernel):
    torch.manual_seed(0)
    grid_coord, batch, occupied = sparse_grid(2, 6, 0.4)
    c_in, c_out = 3, 4
    conv = SubMConv3d(c_in, c_out, kernel, bias=True, backend="torch").double()
    feat = torch.randn(len(batch), c_in, dtype=torch.double, requires_grad=True)
    out = conv(feat, grid_coord, batch)

    feat_d = feat.detach().clone().requires_grad_()
    b, x, y, z = batch, *grid_coord.T
    dense_in = torch.zeros(2, 6, 6, 6, c_in, dtype=torch.double).index_put((b, x, y, z), feat_d)
    weight = conv.weight.detach().clone().requires_grad_()
    w = weight.reshape(kernel, kernel, kernel, c_in, c_out).permute(4, 3, 0, 1, 2)
    dense = F.conv3d(dense_in.permute(0, 4, 1, 2, 3), w, conv.bias.detach(), padding=kernel // 2)
    ref = dense.permute(0, 2, 3, 4, 1)[b, x, y, z]  # submanifold: read only at active sites
    torch.testing.assert_close(out, ref)

    grad = torch.randn_like(out)
    out.backward(grad)
    ref.backward(grad)
    torch.testing.assert_close(feat.grad, feat_d.grad)
    torch.testing.assert_close(conv.weight.grad, weight.grad)


HAS_SPCONV = torch.cuda.is_available() and spconv_available(torch.device("cuda"))


@pytest.mark.skipif(not HAS_SPCONV, reason="needs CUDA and the optional spconv package")
def test_spconv_and_torch_backends_agree():
    grid_coord, batch, _ = sparse_grid(2, 8, 0.3)
    conv = SubMConv3d(8, 8, 3, backend="torch").cuda()
    feat = torch.randn(len(batch), 8, device="cuda")
    grid_coord, batch = grid_coord.cuda(), batch.cuda()
    ref = conv(feat, grid_coord, batch)
    conv.backend = "spconv"
    torch.testing.assert_close(conv(feat, grid_coord, batch), ref, atol=1e-4, rtol=1e-4)


def full_grid(side: int) -> torch.Tensor:
    r = torch.arange(side)
    return torch.stack(torch.meshgrid(r, r, r, indexing="ij"), -1).reshape(-1, 3)


@pytest.mark.parametrize("order", ORDERS)
def test_serialization_orders_are_permutations_with_unique_codes(order):
    grid_coord, batch, _ = sparse_grid(3, 9, 0.3)
    codes = encode(grid_coord, batch, order)
    assert len(torch.unique(codes)) == len(codes)
    perm = serialize(grid_coord, batch, (order,))[0]
    assert torch.equal(torch.sort(perm).values, torch.arange(len(batch)))
    assert torch.all(batch[perm][1:] >= batch[perm][:-1])  # batch elements stay contiguous


def test_hilbert_steps_are_face_adjacent_and_z_order_is_local():
    grid = full_grid(8)
    batch = torch.zeros(len(grid), dtype=torch.long)
    for order in ("hilbert", "hilbert-trans"):
        walk = grid[serialize(grid, batch, (order,))[0]]
        assert torch.all((walk[1:] - walk[:-1]).abs().sum(1) == 1), order
    random_walk = grid[torch.randperm(len(grid), generator=torch.Generator().manual_seed(0))]
    random_step = (random_walk[1:] - random_walk[:-1]).abs().sum(1).float().mean()
    for order in ("z", "z-trans"):
        walk = grid[serialize(grid, batch, (order,))[0]]
        assert (walk[1:] - walk[:-1]).abs().sum(1).float().mean() < random_step / 3, order
    # transposed curves swap the roles of x and y
    z, zt = (grid[serialize(grid, batch, (o,))[0]] for o in ("z", "z-trans"))
    assert torch.equal(z[:, [1, 0, 2]], zt)


def test_grid_pool_and_unpool_round_trip():
    grid_coord, batch, _ = sparse_grid(2, 8, 0.5)
    coord = grid_coord.float() + 0.5
    clusters = grid_pool(grid_coord, batch, coord, 2)
    # every child lands in the parent voxel that contains it, in its own batch element
    assert torch.equal(clusters.grid_coord[clusters.inverse], grid_coord // 2)
    assert torch.equal(clusters.batch[clusters.inverse], batch)
    assert len(torch.unique(torch.cat([clusters.batch[:, None], clusters.grid_coord], 1), dim=0)) == len(clusters.batch)
    # unpooling a pooled constant-per-parent signal restores it exactly
    parent_value = torch.randn(len(clusters.batch), 5)
    child = grid_unpool(parent_value, clusters)
    assert torch.equal(segment_reduce(child, clusters.inverse, len(parent_value), "amax"), parent_value)
    torch.testing.assert_close(segment_reduce(child, clusters.inverse, len(parent_value), "mean"), parent_value)


@pytest.mark.parametrize("ties", [False, True])
def test_segment_max_gradient_equals_torchs_scatter_reduce_backward(ties):
    """The hand-written backward of "amax" (faster on CPU) must give torch's gradient, ties
    (ReLU zeros, repeated values) shared evenly, empty groups included."""
    g = torch.Generator().manual_seed(0)
    values = torch.randn(300, 6, generator=g)
    if ties:
        values = values.round().clamp_min(0)  # many exact ties, as after a ReLU
    index = torch.randint(0, 40, (300,), generator=g)  # groups 40..44 stay empty
    upstream = torch.randn(45, 6, generator=g)
    ours = values.clone().requires_grad_(True)
    segment_reduce(ours, index, 45, "amax").backward(upstream)
    # The reference starts from -inf: torch's backward counts the excluded initial value as one
    # more tie when it equals the maximum (a group whose maximum is 0 over zeros would lose a
    # share of its gradient); ours does not.
    reference = values.clone().requires_grad_(True)
    out = reference.new_full((45, 6), float("-inf")).scatter_reduce(
        0, index[:, None].expand(-1, 6), reference, reduce="amax", include_self=False
    )
    out.backward(upstream)
    forward = segment_reduce(values, index, 45, "amax")
    assert torch.equal(forward[:40], out.detach()[:40]) and not forward[40:].any()
    torch.testing.assert_close(ours.grad, reference.grad)
    if ties:  # every group hands on all of its gradient
        members = torch.zeros(45, 6).index_add_(0, index, ours.grad)
        torch.testing.assert_close(members[:40], upstream[:40])


def test_patches_cover_every_point_once_and_never_span_samples():
    counts = [5, 130, 64, 1]
    batch = torch.cat([torch.full((n,), i) for i, n in enumerate(counts)])
    perm = torch.arange(len(batch))
    patches = make_patches(perm, batch, 32)
    assert patches.index.shape == (1 + 5 + 2 + 1, 32)
    members = patches.index[patches.valid]
    assert torch.equal(torch.sort(members).values, perm)
    for row in patches.index:
        assert len(torch.unique(batch[row[row >= 0]])) == 1
    sizes = patches.valid.sum(1)
    assert sizes.tolist() == [5, 26, 26, 26, 26, 26, 32, 32, 1]  # near-equal within a sample
    values = torch.randn(len(batch), 3)
    assert torch.equal(patches.scatter(patches.gather(values)), values)


@pytest.mark.parametrize("method", ["rope", "alibi", "pape", "sincos"])
def test_padding_slots_change_nothing(method):
    torch.manual_seed(0)
    encoding = build(method, points_geometry(0.1, 10.0), 32, 2, 1, {"m": 4} if method == "pape" else {})
    block = EncoderBlock(32, 2, encoding, 0).eval()
    counts = [20, 7]
    batch = torch.cat([torch.full((n,), i) for i, n in enumerate(counts)])
    x, pos = torch.randn(len(batch), 32), torch.randn(len(batch), 3) * 3
    outs = []
    for patch_size in (32, 48):  # more padding slots, same patches
        patches = make_patches(torch.arange(len(batch)), batch, patch_size)
        garbage = torch.where(patches.valid[..., None], patches.gather(x), torch.full((), 1e4))
        layout = PositionLayout(patches.gather(pos), patches.valid, patches.valid)
        outs.append(patches.scatter(block(garbage, layout)))
    torch.testing.assert_close(outs[0], outs[1], atol=1e-5, rtol=1e-5)


def test_neighbours_never_cross_batch_elements_even_for_large_batches():
    grid_coord, _, _ = sparse_grid(1, 4, 0.6)
    batch = torch.arange(40).repeat_interleave(len(grid_coord))  # 40 identical samples
    table = neighbour_table(grid_coord.repeat(40, 1), batch, 3)
    found = table < len(batch)
    assert torch.equal(batch[table[found]], batch[:, None].expand_as(table)[found])
    assert torch.equal(found[: len(grid_coord)].repeat(40, 1), found)


def test_unique_rows_equals_torch_unique_over_rows():
    g = torch.Generator().manual_seed(1)
    rows = torch.randint(-5, 6, (500, 4), generator=g)
    rows[:, 0] = torch.randint(0, 3, (500,), generator=g)  # a batch column
    expected, expected_inverse = torch.unique(rows, dim=0, return_inverse=True)
    unique, inverse = unique_rows(rows)
    assert torch.equal(unique, expected) and torch.equal(inverse, expected_inverse)
    empty, empty_inverse = unique_rows(rows[:0])
    assert empty.shape == (0, 4) and empty_inverse.shape == (0,)
