"""Conformance of every registered encoding (built-in or plug-in), and proof that the suite
catches broken encodings. Definitions and thresholds: pe_bench.harness.conformance."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

from pe_bench.adapters import (
    AttentionInputs,
    LayerEncoding,
    PositionEncoding,
    PositionLayout,
    Principle,
    available,
    get,
)
from pe_bench.harness.conformance import PROBES, Report, measure, principles_table
from pe_bench.harness.conformance.principles import _fused_kernel_runs
from pe_bench.harness.conformance.probes import BATCH, DIM, HEADS, build_model, with_padding

NAMES = available()


def _skip_if_not_applicable(report: Report) -> None:
    if not report.applicable:
        pytest.skip(f"{report.encoding} supports none of the probe geometries: {report.not_applicable}")


@pytest.mark.parametrize("name", NAMES)
def test_claimed_principles_are_measured(name: str) -> None:
    report = measure(name)
    _skip_if_not_applicable(report)
    assert not report.principle_failures(), report.format()


@pytest.mark.parametrize("name", NAMES)
def test_protocol_checks_pass(name: str) -> None:
    report = measure(name)
    _skip_if_not_applicable(report)
    assert report.checks, "no protocol check ran"
    assert not report.check_failures(), report.format()


def test_principles_table_covers_the_registry() -> None:
    table = principles_table()
    assert list(table.index) == NAMES
    assert list(table.columns) == [p.value for p in Principle]
    allowed = {"✓", "✗", "n/a", "claimed ✓ (n/a)"} | {
        f"claimed {a} (measured {b})" for a, b in (("✓", "✗"), ("✗", "✓"))
    }
    assert set(table.to_numpy().ravel()) <= allowed
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert table.to_markdown() in readme, "README's principles table is not `pe-bench principles`'s output: paste it"


def test_report_is_readable() -> None:
    text = measure("pape").format()
    assert "pape" in text
    for principle in Principle:
        assert principle.value in text
    for probe in PROBES:
        assert probe.key in text


@pytest.mark.parametrize(
    ("options", "removed"),
    [
        ({"context": False}, Principle.CONTEXT_AWARENESS),
        ({"linear": False}, Principle.DIRECTIONALITY),
        ({"quadratic": False}, Principle.DISTANCE_DECAY),
        ({"form": "explicit"}, Principle.FUSED_KERNEL),
    ],
)
def test_measurements_separate_pape_ablations(options: dict, removed: Principle) -> None:
    """Each PaPE ablation removes exactly the principle it instantiates, as measured."""
    full, ablated = measure("pape"), measure("pape", options)
    assert full.principles[removed].measured is True
    assert ablated.principles[removed].measured is False
    assert not ablated.principles[removed].declared
    assert ablated.passed, ablated.format()


@pytest.mark.parametrize("layer", [0, 1, -1])
def test_layer_logits_are_those_the_forward_pass_attends_with(layer: int) -> None:
    """The statistics' logits come from the tokens and layout each block's attention really
    receives in forward, padding included."""
    model = build_model(get("pape"), PROBES[0], None, seed=0)
    gen = torch.Generator().manual_seed(0)
    layout = PROBES[0].layout(BATCH, gen)
    layout, x = with_padding(layout, torch.randn(BATCH, layout.coords.shape[1], DIM, generator=gen), 3, gen)
    seen = {}

    def record(_module, args) -> None:
        seen["args"] = args

    attn = model.blocks[layer].attn
    hook = attn.register_forward_pre_hook(record)
    with torch.no_grad():
        model(x, layout)
        hook.remove()
        tokens, prepared = seen["args"]
        expected = attn.logits(tokens, prepared)
        torch.testing.assert_close(model.layer_logits(x, layout, layer), expected, rtol=0, atol=0)
        nudge = torch.randn(tokens.shape, generator=gen)
        torch.testing.assert_close(
            model.layer_logits(x, layout, layer, perturbation=nudge), attn.logits(tokens + nudge, prepared)
        )
    assert torch.isneginf(expected[..., -3:]).all()  # padding keys are masked


def test_layer_logits_name_a_missing_layer() -> None:
    model = build_model(get("nopos"), PROBES[1], None, seed=0)
    with pytest.raises(IndexError, match="layer=2 is out of range for an encoder of depth 2"):
        model.layer_logits(torch.zeros(1, 16, DIM), PROBES[1].layout(1, torch.Generator()), layer=2)


# --------------------------------------------------------------------------- broken encodings
# Defined here, never registered: measure() accepts the class itself.


class AbsoluteInDisguise(PositionEncoding):
    """Claims translation invariance but adds sinusoids of absolute positions; also owns a
    parameter that nothing uses (so no gradient reaches it)."""

    name = "broken-absolute"
    principles = frozenset({Principle.TRANSLATION_INVARIANCE, Principle.FUSED_KERNEL})

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.unused = nn.Parameter(torch.ones(3))

    def embed(self, x: Tensor, layout: PositionLayout) -> Tensor:
        freqs = torch.arange(1, x.shape[-1] + 1, dtype=x.dtype) / x.shape[-1]
        phase = layout.coords.sum(-1, keepdim=True) * freqs
        return x + torch.sin(phase) * layout.has_pos.unsqueeze(-1)


class PaddingLeak(PositionEncoding):
    """Centres positions on the mean of *all* tokens, padding included."""

    name = "broken-padding"

    def embed(self, x: Tensor, layout: PositionLayout) -> Tensor:
        centre = layout.coords.mean(1, keepdim=True)  # should be masked_mean(coords, layout.positioned)
        freqs = torch.arange(1, x.shape[-1] + 1, dtype=x.dtype) / x.shape[-1]
        phase = (layout.coords - centre).sum(-1, keepdim=True) * freqs
        return x + torch.sin(phase) * layout.has_pos.unsqueeze(-1)


class DistanceBias(LayerEncoding):
    def __init__(self, respect_prefix: bool) -> None:
        super().__init__()
        self.respect_prefix = respect_prefix

    def bias(self, q: Tensor, k: Tensor, inputs: AttentionInputs) -> Tensor:
        if not self.respect_prefix:
            return -torch.cdist(inputs.query.coords.float(), inputs.key.coords.float()).unsqueeze(1)
        dist = torch.cdist(inputs.query.coords_or_zero(torch.float32), inputs.key.coords_or_zero(torch.float32))
        pair = inputs.query.has_pos.unsqueeze(-1) & inputs.key.has_pos.unsqueeze(-2)
        return -torch.where(pair, dist, 0.0).unsqueeze(1)


class ClsAtOrigin(PositionEncoding):
    """A correct relative distance bias between patches, but the CLS token's (ignored)
    coordinates take part: it silently sits at position 0."""

    name = "broken-cls"
    principles = frozenset({Principle.TRANSLATION_INVARIANCE, Principle.DISTANCE_DECAY})

    def make_layer(self, layer_index: int) -> LayerEncoding:
        return DistanceBias(respect_prefix=False)


class FalseClaims(PositionEncoding):
    """A content-independent bias that claims context awareness and the fused kernel."""

    name = "broken-claims"
    principles = frozenset({Principle.TRANSLATION_INVARIANCE, Principle.CONTEXT_AWARENESS, Principle.FUSED_KERNEL})

    def make_layer(self, layer_index: int) -> LayerEncoding:
        return DistanceBias(respect_prefix=True)


def _failed_checks(report: Report) -> set[str]:
    return {c.name for c in report.checks if not c.passed}


def test_suite_catches_absolute_positions_claiming_translation_invariance() -> None:
    report = measure(AbsoluteInDisguise)
    result = report.principles[Principle.TRANSLATION_INVARIANCE]
    assert result.declared and result.measured is False and result.statistic > 1e-2
    assert any("translation-invariance" in f for f in report.failures())
    assert "gradients" in _failed_checks(report)
    assert "unused: no gradient" in report.format()


def test_suite_catches_padding_leak() -> None:
    report = measure(PaddingLeak)
    assert not report.passed
    assert "padding" in _failed_checks(report)
    failing = {c.geometry for c in report.checks if c.name == "padding" and not c.passed}
    assert failing == {probe.key for probe in PROBES}


def test_suite_catches_cls_with_a_position() -> None:
    report = measure(ClsAtOrigin)
    # Between patches the bias is relative and decays: those claims hold ...
    assert report.principles[Principle.TRANSLATION_INVARIANCE].measured is True
    assert report.principles[Principle.DISTANCE_DECAY].measured is True
    # ... but the CLS token is not position-free.
    cls = [c for c in report.checks if c.name == "cls"]
    assert len(cls) == 1 and not cls[0].passed
    assert "(a)" in cls[0].message and "(c)" in cls[0].message


def test_suite_catches_false_context_and_fused_claims() -> None:
    report = measure(FalseClaims)
    context = report.principles[Principle.CONTEXT_AWARENESS]
    fused = report.principles[Principle.FUSED_KERNEL]
    assert context.declared and context.measured is False and context.statistic < 1e-4
    assert fused.declared and fused.measured is False
    assert not report.check_failures(), report.format()  # the protocol itself is respected
    assert len(report.principle_failures()) == 2
    assert math.isfinite(report.principles[Principle.TRANSLATION_INVARIANCE].statistic)


class ContentDecay(LayerEncoding):
    """-softplus(w_h . x_i) |r_j - r_i|^2: each query's decay adapts to its content (PaPE's a_i)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.a = nn.Linear(dim, heads)

    def bias(self, q: Tensor, k: Tensor, inputs: AttentionInputs) -> Tensor:
        rate = nn.functional.softplus(self.a(inputs.x_q)).transpose(1, 2)  # (B, H, Nq)
        dist2 = torch.cdist(inputs.query.coords_or_zero(torch.float32), inputs.key.coords_or_zero(torch.float32))
        pair = inputs.query.has_pos.unsqueeze(-1) & inputs.key.has_pos.unsqueeze(-2)
        return -rate.unsqueeze(-1) * torch.where(pair, dist2.square(), 0.0).unsqueeze(1)


class ContextInLayerZero(PositionEncoding):
    """Claims context awareness, but only layer 0 adapts its decay to content: later layers
    have a fixed Gaussian decay."""

    name = "broken-context-layer0"
    principles = frozenset({Principle.TRANSLATION_INVARIANCE, Principle.CONTEXT_AWARENESS})

    def make_layer(self, layer_index: int) -> LayerEncoding:
        if layer_index == 0:
            return ContentDecay(self.dim, self.num_heads)
        return GaussianBias(self.num_heads, directional=False)


class ContextInEveryLayer(ContextInLayerZero):
    name = "context-every-layer"

    def make_layer(self, layer_index: int) -> LayerEncoding:
        return ContentDecay(self.dim, self.num_heads)


def test_suite_measures_context_awareness_in_every_layer() -> None:
    # The same content-dependent decay in every layer is context-aware ...
    assert measure(ContextInEveryLayer).principles[Principle.CONTEXT_AWARENESS].measured is True
    # ... in layer 0 only, it is not: the content-free later layer counts.
    report = measure(ContextInLayerZero)
    result = report.principles[Principle.CONTEXT_AWARENESS]
    assert result.declared and result.measured is False and result.statistic < 1e-4, report.format()
    assert report.principles[Principle.TRANSLATION_INVARIANCE].measured is True
    assert [f.split(":")[0] for f in report.principle_failures()] == ["context-awareness"]


class KeyMixing(LayerEncoding):
    """Mixes the keys by attention weights of its own, softmax(q k^T / sqrt(E)) k: no bias, but
    an Nq x Nk tensor per head, which a fused kernel never holds."""

    def transform_qk(self, q: Tensor, k: Tensor, inputs: AttentionInputs) -> tuple[Tensor, Tensor]:
        scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
        if inputs.key.valid is not None:
            scores = scores.masked_fill(~inputs.key.valid[:, None, None, :], float("-inf"))
        return q, k + scores.softmax(-1) @ k


class OwnAttentionWeights(PositionEncoding):
    name = "broken-own-attention"
    principles = frozenset({Principle.FUSED_KERNEL})

    def make_layer(self, layer_index: int) -> LayerEncoding:
        return KeyMixing()


def test_suite_catches_a_per_pair_tensor_without_a_bias() -> None:
    result = measure(OwnAttentionWeights).principles[Principle.FUSED_KERNEL]
    assert result.declared and result.measured is False, result
    assert "per-pair tensors built in the layers" in result.note
    assert "bias()" not in result.note and "attn_mask (" not in result.note  # no bias, no N x N mask
    assert all(result.per_geometry[probe.key] > 0 for probe in PROBES), result.per_geometry  # caught everywhere


@pytest.mark.parametrize("probe", PROBES, ids=[probe.key for probe in PROBES])
def test_fused_kernel_token_counts_are_no_width_of_the_probe(probe) -> None:
    """A (.., tokens, features) tensor must not look like a per-pair (Nq, Nk) one."""
    widths = {DIM, HEADS, DIM // HEADS, 2 * DIM, 3 * DIM, *range(1, probe.geometry.pos_dim + 1)}
    for x, layout in _fused_kernel_runs(probe, torch.Generator().manual_seed(0)):
        assert x.shape[1] == layout.coords.shape[1] and x.shape[1] not in widths


class BasisTwice(LayerEncoding):
    """A fixed linear map of q and k that ignores ``inputs.qk_in_basis``: when the core folds it
    into the projections, it is applied twice. (Not orthogonal: an orthogonal map applied to
    both q and k cancels in their dot product, once or twice.)"""

    def __init__(self, head_dim: int) -> None:
        super().__init__()
        self.register_buffer("basis", torch.eye(head_dim) + torch.randn(head_dim, head_dim) / head_dim**0.5)

    def qk_basis(self) -> Tensor:
        return self.basis

    def transform_qk(self, q: Tensor, k: Tensor, inputs: AttentionInputs) -> tuple[Tensor, Tensor]:
        basis = self.basis.to(q.dtype)
        return q @ basis.T, k @ basis.T  # should skip this when inputs.qk_in_basis


class FoldedTwice(PositionEncoding):
    name = "broken-basis"

    def make_layer(self, layer_index: int) -> LayerEncoding:
        return BasisTwice(self.head_dim)


def test_suite_catches_a_basis_applied_twice_when_folded() -> None:
    report = measure(FoldedTwice)
    failing = {c.geometry for c in report.checks if c.name == "qk basis" and not c.passed}
    assert failing == {probe.key for probe in PROBES}, report.format()
    assert all("folding qk_basis" in c.message for c in report.checks if c.name == "qk basis")


# --------------------------------------------------------------------------- audit findings


class OnlyFourD(PositionEncoding):
    """Supports none of the probe geometries, and is plainly absolute."""

    name = "broken-only-4d"
    pos_dims = frozenset({4})
    principles = frozenset({Principle.TRANSLATION_INVARIANCE, Principle.FUSED_KERNEL})

    def embed(self, x: Tensor, layout: PositionLayout) -> Tensor:
        return x + layout.coords.sum(-1, keepdim=True)


class CrashesAtBuild(PositionEncoding):
    name = "broken-build"
    principles = frozenset({Principle.FUSED_KERNEL})

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        raise ZeroDivisionError("float division by zero")


def test_no_applicable_geometry_is_not_checked_and_does_not_pass() -> None:
    report = measure(OnlyFourD)
    assert report.verdict == "NOT CHECKED" and not report.passed
    assert "NOT CHECKED" in report.format()
    assert report.principles[Principle.FUSED_KERNEL].declared  # the class's declaration


def test_build_crash_is_an_error_naming_the_exception() -> None:
    report = measure(CrashesAtBuild)
    assert report.verdict == "ERROR" and not report.passed
    assert "ZeroDivisionError" in report.format().splitlines()[1]
    assert set(report.cells().values()) == {"error (ZeroDivisionError)"}
    assert report.principles[Principle.FUSED_KERNEL].declared


class CentredSinCos(PositionEncoding):
    """Absolute sinusoids of the positions minus their centroid: a global shift cannot see it."""

    name = "broken-centred-sincos"
    principles = frozenset({Principle.TRANSLATION_INVARIANCE, Principle.FUSED_KERNEL})

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.register_buffer("f", torch.arange(1, self.dim + 1).float() / self.dim * 3, persistent=False)

    def embed(self, x: Tensor, layout: PositionLayout) -> Tensor:
        positioned = layout.has_pos.unsqueeze(-1).to(layout.coords.dtype)
        centre = (layout.coords * positioned).sum(1, keepdim=True) / positioned.sum(1, keepdim=True)
        phase = (layout.coords - centre).sum(-1, keepdim=True) * self.f
        return x + torch.sin(phase) * positioned


def test_suite_catches_absolute_positions_in_the_centred_frame() -> None:
    result = measure(CentredSinCos).principles[Principle.TRANSLATION_INVARIANCE]
    assert result.declared and result.measured is False and result.statistic > 0.1


class IndexTable(PositionEncoding):
    """A ViT-style table indexed by token order, ignoring the coordinates."""

    name = "broken-index-table"
    principles = frozenset({Principle.FUSED_KERNEL})

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.table = nn.Parameter(torch.randn(128, self.dim) * 0.5)

    def embed(self, x: Tensor, layout: PositionLayout) -> Tensor:
        return x + self.table[: x.shape[1]] * layout.has_pos.unsqueeze(-1)


def test_suite_catches_token_order_instead_of_coordinates() -> None:
    report = measure(IndexTable)
    failing = {c.geometry for c in report.checks if c.name == "token order" and not c.passed}
    assert failing == {probe.key for probe in PROBES}
    assert "reads token order" in report.format()


class GaussianBias(LayerEncoding):
    """-w |d|^2, plus (``directional``) a linear term in d, which is not rotation invariant."""

    def __init__(self, heads: int, directional: bool) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.full((heads,), 0.3))
        self.d = nn.Parameter(torch.randn(heads, 3)) if directional else None

    def bias(self, q: Tensor, k: Tensor, inputs: AttentionInputs) -> Tensor:
        delta = inputs.key.coords[:, None, :, :] - inputs.query.coords[:, :, None, :]
        pair = (inputs.query.has_pos[:, :, None] & inputs.key.has_pos[:, None, :])[:, None]
        out = -self.w[None, :, None, None] * delta.square().sum(-1)[:, None]
        if self.d is not None:
            out = out + torch.einsum("bijp,hp->bhij", delta, self.d[:, : delta.shape[-1]])
        return torch.where(pair, out, torch.zeros_like(out))


class DirectionalInLayerOne(PositionEncoding):
    name = "broken-layer1"
    principles = frozenset({Principle.TRANSLATION_INVARIANCE, Principle.ROTATION_INVARIANCE})

    def make_layer(self, layer_index: int) -> LayerEncoding:
        return GaussianBias(self.num_heads, directional=layer_index >= 1)


def test_suite_measures_every_layer() -> None:
    result = measure(DirectionalInLayerOne).principles[Principle.ROTATION_INVARIANCE]
    assert result.declared and result.measured is False and result.statistic > 0.1


class ZeroInitAbsolute(PositionEncoding):
    """A learned absolute projection of the coordinates, zero at initialisation."""

    name = "broken-zero-init"
    principles = frozenset({Principle.TRANSLATION_INVARIANCE, Principle.FUSED_KERNEL})

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.proj = nn.Parameter(torch.zeros(self.geometry.pos_dim, self.dim))

    def embed(self, x: Tensor, layout: PositionLayout) -> Tensor:
        return x + torch.sin(layout.coords @ self.proj) * layout.has_pos.unsqueeze(-1)


def test_suite_randomises_the_encoding_parameters() -> None:
    result = measure(ZeroInitAbsolute).principles[Principle.TRANSLATION_INVARIANCE]
    assert result.declared and result.measured is False and result.statistic > 1e-2


class ZeroTimesNaN(PositionEncoding):
    """Rotation-free learned sinusoids whose CLS rows are zeroed by weighting with has_pos: right
    for finite garbage, NaN for a NaN coordinate (0 x NaN), in the outputs and the gradients."""

    name = "broken-nan-times-zero"
    principles = frozenset({Principle.FUSED_KERNEL})

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.proj = nn.Parameter(torch.randn(self.geometry.pos_dim, self.dim))

    def embed(self, x: Tensor, layout: PositionLayout) -> Tensor:
        return x + torch.sin(layout.coords @ self.proj) * layout.has_pos.unsqueeze(-1)


def test_suite_catches_position_free_tokens_zeroed_by_a_product() -> None:
    report = measure(ZeroTimesNaN)
    cls = [c for c in report.checks if c.name == "cls"]
    assert len(cls) == 1 and not cls[0].passed, report.format()
    assert "(a)" not in cls[0].message and "(b)" not in cls[0].message  # finite garbage is ignored
    for value in ("nan", "inf", "-inf"):
        assert f"(d) CLS coordinates {value} change the outputs" in cls[0].message
        assert f"(d) CLS coordinates {value} make non-finite gradients of encoding.proj" in cls[0].message
