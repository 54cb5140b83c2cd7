"""PaPE's efficient form in position space (pape.py's "Position space"): Eq. 9 as a quadratic
form in the raw offset r_j - r_i, with M_i = W_p^T diag(a_i) W_p and β_i = W_p^T b_i. The
identity is exact, so in float64 it must give the explicit bias's logits, outputs and
gradients in every ablation, dimension and layout; in bf16 it must keep the split's
float32 accuracy; and "auto" must keep the stored records' projected arithmetic off CUDA."""

from __future__ import annotations

import contextlib
import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pe_bench.adapters import Geometry, PositionLayout, build
from pe_bench.adapters.base import AttentionInputs
from pe_bench.harness.attention import Attention, dense_bias_chunk_elements
from pe_bench.harness.conformance import measure
from pe_bench.harness.conformance.probes import with_padding
from pe_bench.harness.reports.pape_precision import pape_precision_table

DIM, HEADS = 32, 4

ABLATIONS = [
    dict(zip(("quadratic", "linear", "context", "softplus", "project"), flags, strict=True))
    for flags in itertools.product([True, False], repeat=5)
    if flags[0] or flags[1]  # neither term leaves nothing positional
]


def _layers(geometry: Geometry, seed: int, options: dict, forms: tuple[dict, ...]) -> list[Attention]:
    """The same weights in each of ``forms``, float64."""
    layers = []
    for form in forms:
        torch.manual_seed(seed)
        encoding = build("pape", geometry, DIM, HEADS, 1, {**options, **form})
        layers.append(Attention(DIM, HEADS, encoding.make_layer(0)).double())
    return layers


POSITION, PROJECTED, EXPLICIT = {"space": "position"}, {"space": "projected"}, {"form": "explicit"}


@settings(max_examples=40, deadline=None)
@given(
    ablation=st.sampled_from(ABLATIONS),
    grid=st.lists(st.integers(1, 5), min_size=1, max_size=3),
    m=st.integers(1, 9),
    prefix=st.integers(0, 2),
    tile=st.sampled_from([None, 2]),
    causal=st.booleans(),
    padded=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_position_space_equals_the_explicit_bias(ablation, grid, m, prefix, tile, causal, padded, seed):
    """Logits and outputs in float64, positions scaled and far from the origin, with CLS-like
    prefix tokens, padding, causal masks and frames per tile."""
    grid = tuple(grid)
    geometry = Geometry(pos_dim=len(grid), grid_shape=grid, num_prefix_tokens=prefix)
    options = {"m": m, **ablation}
    forms = ({**POSITION, "frame_tile": tile}, {**POSITION, **EXPLICIT}, EXPLICIT)
    position, position_explicit, explicit = _layers(geometry, seed, options, forms)
    layout = PositionLayout.grid(2, grid, prefix)
    layout = layout.with_coords(layout.coords.double() * 1.7 + 3.0)
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(2, layout.coords.shape[1], DIM, dtype=torch.float64, generator=generator)
    if padded:  # two far, large padding tokens after the grid
        layout, x = with_padding(layout, x, 2, generator)
    for output, layer in itertools.product(("logits", "outputs"), (position, position_explicit)):
        expected, got = ((m.logits if output == "logits" else m)(x, layout, causal=causal) for m in (explicit, layer))
        finite = torch.isfinite(expected)
        assert torch.equal(finite, torch.isfinite(got)), output
        torch.testing.assert_close(got[finite], expected[finite], rtol=1e-9, atol=1e-9, msg=output)


@pytest.mark.parametrize("pos_dim", [2, 3])
def test_position_space_gradients_equal_the_projected_forms(pos_dim):
    """Every parameter's gradient (W_p's through M_i and β_i, W_ab's, qkv's) and the input's,
    float64, against the projected form with the same weights."""
    grid = (4, 5) if pos_dim == 2 else (3, 3, 2)
    geometry = Geometry(pos_dim=pos_dim, grid_shape=grid, num_prefix_tokens=1)
    layers = _layers(geometry, 0, {"m": 7}, (POSITION, PROJECTED))
    layout = PositionLayout.grid(2, grid, 1)
    layout = layout.with_coords(layout.coords.double() * 2.3 - 5.0)
    x = torch.randn(2, layout.coords.shape[1], DIM, dtype=torch.float64)
    grads = []
    for layer in layers:
        tokens = x.clone().requires_grad_()
        layer(tokens, layout).square().sum().backward()
        grads.append({"x": tokens.grad, **{name: p.grad for name, p in layer.named_parameters()}})
    assert grads[0].keys() == grads[1].keys() and "encoding.w_p" in grads[0]
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], rtol=1e-9, atol=1e-10, msg=name)


def test_position_space_narrows_the_widened_head():
    """Images at m = 50: 6 positional features instead of 101, and the keys' features are
    one tensor for every head (and every layer)."""
    geometry = Geometry(pos_dim=2, grid_shape=(4, 4), num_prefix_tokens=1)
    widths = {}
    for name, space in (("position", POSITION), ("projected", PROJECTED)):
        layer = build("pape", geometry, DIM, HEADS, 1, space).make_layer(0)
        layout = PositionLayout.grid(2, (4, 4), 1)
        x = torch.randn(2, 17, DIM)
        q_extra, k_extra = layer._extra_features(AttentionInputs(x_q=x, x_k=x, query=layout, key=layout))
        widths[name] = (q_extra.shape[-1], k_extra.shape[1])
    assert widths == {"position": (6, 1), "projected": (101, HEADS)}


def test_position_space_keeps_float32_accuracy_in_bf16():
    """Softmax total variation against float64 on a 64 x 64 grid (``bench --pape-precision``'s
    measure, smaller): with the hi/lo split and the positional bias, position space stays
    near the content logits' own bf16 rounding (nopos's row), where rounding its features to
    bf16 is far off, as in projected space (pape.py's "16-bit numerics")."""
    table = pape_precision_table(sides=(64,), methods=("nopos", "pape[space=position]"), dim=128, heads=2, queries=64)
    floor, row = table.loc[("nopos", "64x64")], table.loc[("pape[space=position]", "64x64")]
    for formulation in ("bf16 split", "bf16 bias"):
        assert row[f"{formulation} mean"] < 2 * floor["bf16 split mean"], formulation
        assert row[f"{formulation} max"] < 5 * floor["bf16 split max"], formulation
    assert row["bf16 round mean"] > 50 * floor["bf16 split mean"]
    assert row["float32 grad"] < 1e-3 and row["bf16 bias grad"] < 2 * row["bf16 content grad"]


def test_auto_keeps_the_projected_space_off_cuda_and_takes_the_narrower_on_cuda():
    geometry = Geometry(pos_dim=2, grid_shape=(4, 4))
    cpu, cuda = torch.device("cpu"), torch.device("cuda")

    def chooses(options: dict, device: torch.device) -> bool:
        return build("pape", geometry, DIM, HEADS, 1, options).make_layer(0).in_position_space(device)

    assert not chooses({}, cpu) and chooses({}, cuda)  # m = 50: 6 features against 101
    assert not chooses({"m": 2}, cuda)  # 5 features projected, 6 in position space
    assert chooses({"m": 3}, cuda)
    assert not chooses({"project": False}, cuda)  # W_p = I: position space is the wider
    assert chooses({"space": "position"}, cpu) and not chooses({"space": "projected"}, cuda)


def test_the_explicit_form_keeps_the_papers_terms_unless_position_space_is_asked_for():
    """The explicit form is the reference: "auto" keeps Eq. 9's m terms on CUDA too, and
    ``space: position`` evaluates the quadratic form of the offsets per pair instead."""
    geometry = Geometry(pos_dim=2, grid_shape=(4, 4))
    for space, expected in (({}, False), (POSITION, True)):
        layer = build("pape", geometry, DIM, HEADS, 1, {**EXPLICIT, **space}).make_layer(0)
        assert layer.in_position_space(torch.device("cuda")) is expected


def test_position_space_positional_bias_form_equals_the_projected_one():
    """``low_precision: bias`` in bf16 forms the positional logits to float32 accuracy in
    either space: both as close to the float64 logits as bf16's rounding of the logits and
    of the coefficient projection allows."""
    geometry = Geometry(pos_dim=2, grid_shape=(6, 6), num_prefix_tokens=1)
    layout = PositionLayout.grid(2, (6, 6), 1)
    layout64 = layout.with_coords(layout.coords.double())
    x = torch.randn(2, 37, DIM)
    errors = {}
    for name, space in (("position", POSITION), ("projected", PROJECTED)):
        reference, layer = _layers(geometry, 0, {**space, "low_precision": "bias", "m": 12}, ({}, {}))
        expected = reference.logits(x.double(), layout64).detach()
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            got = layer.float().logits(x, layout).double()
        errors[name] = float((got - expected).abs().max() / expected.abs().max())
    assert errors["position"] < 2**-7 and errors["position"] < 2 * errors["projected"], errors


def test_position_space_passes_the_conformance_suite():
    """What CUDA's default runs: every principle PaPE claims, measured, and every protocol
    check (the fused kernel with the narrower head, padding, chunked queries...)."""
    report = measure("pape", {"space": "position"})
    assert report.checks and not report.check_failures(), report.format()
    assert not report.principle_failures(), report.format()


def test_position_space_bias_form_in_chunks_of_queries_equals_one_call():
    """The positional bias form at long sequences runs in chunks of queries; position space's
    key features are shared by the chunks (and the layers), so each chunk must still meet
    the same keys: outputs and gradients as in one call, bf16 autocast."""
    geometry = Geometry(pos_dim=2, grid_shape=(6, 6), num_prefix_tokens=1)
    layout = PositionLayout.grid(2, (6, 6), 1)
    x = torch.randn(2, 37, DIM)
    (layer,) = _layers(geometry, 0, {**POSITION, "low_precision": "bias", "m": 12}, ({},))
    layer = layer.float()
    results = []
    for budget in (None, 5 * 37 * HEADS * 2):  # about 5 query rows per chunk
        layer.zero_grad()
        with contextlib.ExitStack() as stack:
            if budget is not None:
                stack.enter_context(dense_bias_chunk_elements(budget))
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = layer(x, layout)
            out.float().square().sum().backward()
        results.append((out.detach(), layer.encoding.w_p.grad.clone()))
    (whole, whole_grad), (chunked, chunked_grad) = results
    torch.testing.assert_close(chunked, whole, rtol=1e-6, atol=1e-6)
    # W_p's gradient passes through the bf16 product of the folded W_b (``context``), which
    # each chunk rounds on its own, as it does any weight's gradient in a 16-bit step
    assert float((chunked_grad - whole_grad).norm() / whole_grad.norm()) < 2**-9


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_runs_position_space_by_default_with_the_cpu_forms_outputs():
    """CUDA's default ("auto") is position space; in float32 it gives the outputs of the
    projected form the records were trained with on CPU."""
    geometry = Geometry(pos_dim=2, grid_shape=(14, 14), num_prefix_tokens=1)
    torch.manual_seed(0)
    layer = Attention(256, 4, build("pape", geometry, 256, 4, 1, {}).make_layer(0))
    x = torch.randn(2, 197, 256)
    with torch.no_grad():
        on_cpu = layer(x, PositionLayout.grid(2, (14, 14), 1))
        layer.cuda()
        assert layer.encoding.in_position_space(x.cuda().device)
        on_cuda = layer(x.cuda(), PositionLayout.grid(2, (14, 14), 1, device="cuda")).cpu()
    torch.testing.assert_close(on_cuda, on_cpu, rtol=1e-4, atol=1e-4)


def test_position_space_trains_after_an_inference_mode_forward():
    """``bench`` counts an inference-mode forward, then a training step, on one model: nothing
    position space keeps between calls (its pairs of coordinates) may be an inference tensor."""
    geometry = Geometry(pos_dim=2, grid_shape=(4, 4), num_prefix_tokens=1)
    (layer,) = _layers(geometry, 0, POSITION, ({},))
    layout, x = PositionLayout.grid(2, (4, 4), 1), torch.randn(2, 17, DIM, dtype=torch.float64)
    with torch.inference_mode():
        layer(x, layout)
    layer(x, layout).sum().backward()
    assert layer.encoding.w_p.grad.abs().sum() > 0
