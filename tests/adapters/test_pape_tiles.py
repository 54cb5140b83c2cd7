"""PaPE's ``frame_tile``: a frame per tile of queries. Exact (a translation per tile, under
which Eq. 9 is invariant): it must equal the explicit bias in float64 in every setting the
attention core supports, and the tiles must partition the queries."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pe_bench.adapters import Geometry, PositionLayout, build
from pe_bench.adapters.base import grid_tiles
from pe_bench.harness.attention import Attention
from pe_bench.harness.conformance import measure

DIM, HEADS = 32, 4


#: the encodings with ``frame_tile`` and their options here (PaPE at a small m)
TILED = {"pape": {"m": 6}, "pape-ri": {"wp_init": "geometric"}}


def _pair(method: str, geometry: Geometry, tile: int, seed: int, cross: bool = False) -> tuple[Attention, Attention]:
    """The same weights as the tiled efficient form and as the explicit bias, in float64."""
    layers = []
    for options in ({"frame_tile": tile}, {"form": "explicit"}):
        torch.manual_seed(seed)
        encoding = build(method, geometry, DIM, HEADS, 1, {**TILED[method], **options})
        layers.append(Attention(DIM, HEADS, encoding.make_layer(0), cross=cross).double())
    return layers[0], layers[1]


@pytest.mark.parametrize("method", sorted(TILED))
@settings(max_examples=30, deadline=None)
@given(
    grid=st.lists(st.integers(1, 5), min_size=1, max_size=3),
    tile=st.integers(1, 4),
    prefix=st.integers(0, 2),
    causal=st.booleans(),
    padded=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_tiled_frames_equal_the_explicit_bias(method, grid, tile, prefix, causal, padded, seed):
    grid = tuple(grid)
    geometry = Geometry(pos_dim=len(grid), grid_shape=grid, num_prefix_tokens=prefix)
    tiled, explicit = _pair(method, geometry, tile, seed)
    layout = PositionLayout.grid(2, grid, prefix)
    n = layout.coords.shape[1]
    layout = layout.with_coords(layout.coords.double() * 1.7 + 3.0)  # scaled, off the origin
    if padded and n > 1:
        valid = torch.ones(2, n, dtype=torch.bool)
        valid[1, -1] = False
        layout = PositionLayout(layout.coords, layout.has_pos, valid, layout.grid_shape)
    x = torch.randn(2, n, DIM, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    expected, got = explicit.logits(x, layout, causal=causal), tiled.logits(x, layout, causal=causal)
    assert torch.equal(torch.isneginf(got), torch.isneginf(expected))
    finite = torch.isfinite(expected)
    torch.testing.assert_close(got[finite], expected[finite], rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(
        tiled(x, layout, causal=causal), explicit(x, layout, causal=causal), rtol=1e-9, atol=1e-9
    )


@pytest.mark.parametrize("method", sorted(TILED))
def test_tiled_frames_in_cross_attention(method):
    geometry = Geometry(pos_dim=2, grid_shape=(4, 5), num_prefix_tokens=1)
    layers = _pair(method, geometry, 2, 0, cross=True)
    query = PositionLayout.grid(2, (4, 5), 1)
    query = query.with_coords(query.coords.double())
    key = PositionLayout(
        coords=torch.randn(2, 9, 2, dtype=torch.float64) * 4, has_pos=torch.ones(2, 9, dtype=torch.bool)
    )
    x, context = torch.randn(2, 21, DIM, dtype=torch.float64), torch.randn(2, 9, DIM, dtype=torch.float64)
    tiled, explicit = (layer(x, query, context=context, key=key) for layer in layers)
    torch.testing.assert_close(tiled, explicit, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize(("grid", "prefix", "edge"), [((14, 14), 1, 4), ((3, 4, 5), 0, 2), ((7,), 2, 3)])
def test_tiles_partition_the_tokens_into_grid_blocks(grid, prefix, edge):
    layout = PositionLayout.grid(1, grid, prefix)
    tiles = grid_tiles(layout, edge)
    everything = torch.cat(tiles)
    assert sorted(everything.tolist()) == list(range(layout.coords.shape[1]))  # each token once
    assert len(tiles) == math.prod(math.ceil(g / edge) for g in grid)
    assert set(range(prefix)) <= set(tiles[0].tolist())  # prefix tokens join the first tile
    for rows in tiles:
        cells = layout.coords[0, rows][layout.has_pos[0, rows]]
        assert ((cells.amax(0) - cells.amin(0)) < edge).all()  # a block of at most edge cells per axis


def test_without_a_grid_tiles_are_chunks_of_consecutive_tokens():
    layout = PositionLayout(coords=torch.randn(1, 10, 2), has_pos=torch.ones(1, 10, dtype=torch.bool))
    assert [t.tolist() for t in grid_tiles(layout, 2)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


@pytest.mark.parametrize("method", sorted(TILED))
def test_frame_tile_is_for_the_efficient_form_only(method):
    with pytest.raises(ValueError, match="frame_tile applies to form 'efficient' only"):
        build(method, Geometry(pos_dim=2, grid_shape=(4, 4)), DIM, HEADS, 1, {"form": "explicit", "frame_tile": 2})


@pytest.mark.parametrize("method", sorted(TILED))
def test_tiled_forms_pass_the_conformance_suite(method):
    report = measure(method, {"frame_tile": 2})
    assert report.passed, report.format()


def _tiled_vit():
    from pe_bench.adapters import EncodingFactory
    from pe_bench.harness.config import ModelConfig
    from pe_bench.tasks._shared.vit import ViT, image_geometry

    torch.manual_seed(0)
    config = ModelConfig(dim=DIM, depth=2, num_heads=HEADS, mlp_ratio=2.0, patch_size=4)
    return ViT(EncodingFactory("pape", {"frame_tile": 2, "m": 6}), image_geometry((16, 16), 4), config, 3, 10)


def test_tiled_pape_trains_after_an_inference_forward():
    """The tiles are made per forward: none made under inference_mode reaches autograd."""
    model, images = _tiled_vit(), torch.randn(2, 3, 16, 16)
    with torch.inference_mode():
        model.eval()(images)
    model.train()(images).sum().backward()
    assert model.encoder.blocks[0].attn.encoding.w_p.grad is not None


def test_tiled_pape_compiles_in_one_graph_and_computes_the_same():
    from pe_bench.harness.compile import maybe_compile
    from pe_bench.harness.config import TrainerConfig

    model, images = _tiled_vit().eval(), torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        eager = model(images)
        maybe_compile(model, TrainerConfig(compile=True), backend="aot_eager", fullgraph=True)
        torch.testing.assert_close(model(images), eager, rtol=1e-5, atol=1e-5)
