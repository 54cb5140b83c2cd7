"""Cayley-STRING's P for every layer in one batched solve per forward (string_cayley.CayleyBank):
the same bits as each layer solving alone on the CPU, outputs and every gradient, in both basis
placements; one solve per forward instead of one per layer; and each layer alone where a
forward has no shared memo (a bare layout, torch.compile)."""

from __future__ import annotations

import pytest
import torch

from pe_bench.adapters import Geometry, PositionLayout, build, string_cayley
from pe_bench.harness.blocks import TransformerEncoder
from pe_bench.harness.conformance.probes import random_layout

DIM, HEADS, DEPTH = 48, 3, 3


def encoder(basis: str) -> TransformerEncoder:
    torch.manual_seed(0)
    encoding = build("string-cayley", Geometry(pos_dim=2), DIM, HEADS, DEPTH, {"basis": basis})
    model = TransformerEncoder(DIM, DEPTH, HEADS, encoding)
    with torch.no_grad():  # each layer its own S, away from P = I
        for name, parameter in model.named_parameters():
            if name.endswith("s_upper"):
                parameter.normal_(0.0, 0.5)
    return model


def alone(model: TransformerEncoder) -> TransformerEncoder:
    """``model`` with the option ``solve: per_layer``, each layer solving for its own P (the
    reference), and the same weights."""
    encoding = model.encoding
    options = encoding.options.model_dump() | {"solve": "per_layer"}
    reference = TransformerEncoder(
        DIM, DEPTH, HEADS, build("string-cayley", encoding.geometry, DIM, HEADS, DEPTH, options)
    )
    reference.load_state_dict(model.state_dict())
    assert all(block.attn.encoding.bank is None for block in reference.blocks)
    return reference.to(next(model.parameters()).device)


def step(model: TransformerEncoder, x: torch.Tensor, layout: PositionLayout) -> tuple[torch.Tensor, dict]:
    model.zero_grad(set_to_none=True)
    out = model(x, layout)
    (out * torch.linspace(-1, 1, out.numel(), device=out.device).view_as(out)).sum().backward()
    return out, {name: p.grad for name, p in model.named_parameters() if p.grad is not None}


def padded_layout(seed: int = 1) -> tuple[PositionLayout, torch.Tensor]:
    layout, _ = random_layout(2, 10, 2, prefix=1, seed=seed)
    tokens = layout.coords.shape[1]
    valid = torch.ones(2, tokens, dtype=torch.bool)
    valid[1, -3:] = False
    layout = PositionLayout(coords=layout.coords.float(), has_pos=layout.has_pos, valid=valid)
    return layout, torch.randn(2, tokens, DIM, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("basis", ["folded", "per_token"])
def test_one_batched_solve_gives_the_bits_of_a_solve_per_layer(basis: str) -> None:
    model = encoder(basis)
    reference = alone(model)
    layout, x = padded_layout()
    out, grads = step(model, x, layout)
    ref_out, ref_grads = step(reference, x, layout)
    assert torch.equal(out, ref_out)
    assert set(grads) == set(ref_grads) and sum(name.endswith("s_upper") for name in grads) == DEPTH
    for name, grad in ref_grads.items():
        assert torch.equal(grads[name], grad), name


@pytest.mark.parametrize("basis", ["folded", "per_token"])
def test_a_forward_solves_once_for_all_layers(basis: str, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, ...]] = []
    solve = string_cayley.cayley

    def counted(upper: torch.Tensor, dim: int) -> torch.Tensor:
        calls.append(tuple(upper.shape[:-1]))
        return solve(upper, dim)

    monkeypatch.setattr(string_cayley, "cayley", counted)
    model = encoder(basis)
    layout, x = padded_layout()
    model(x, layout)
    assert calls == [(DEPTH, HEADS)]  # (layers, heads) at once
    calls.clear()
    model(x, layout)  # the next forward solves again: parameters may have changed in between
    assert calls == [(DEPTH, HEADS)]
    calls.clear()
    alone(model)(x, layout)
    assert calls == [(HEADS,)] * DEPTH


def test_a_bare_layout_or_torch_compile_solves_per_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a forward's memo, and inside torch.compile with a memo made outside it (a
    backbone compiled block by block, each graph holding some layers), each layer solves for
    its own P: never all layers' P once per layer."""
    model = encoder("folded")
    layer = model.blocks[1].attn.encoding
    layout, _ = padded_layout()
    shared = layout.sharing_features()
    assert torch.equal(layer.forward_qk_basis(layout), string_cayley.cayley(layer.s_upper, layer.head_dim))
    assert torch.equal(layer.forward_qk_basis(shared), layer.qk_basis())
    assert len(shared._shared) == 1
    fresh = layout.sharing_features()  # made outside torch.compile
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    layer.forward_qk_basis(fresh)
    assert fresh._shared == {}


def test_every_layer_of_the_bank_gets_a_gradient_even_one_that_did_not_run() -> None:
    """The behaviour the batched solve changes (string_cayley's module doc): a layer that did
    not run gets a zero gradient for S, not None; layers that ran get theirs unchanged."""
    model = encoder("folded")
    layout, x = padded_layout()
    shared = layout.sharing_features()
    first = model.blocks[0].attn.encoding
    first.forward_qk_basis(shared).sum().backward()
    grads = [block.attn.encoding.s_upper.grad for block in model.blocks]
    assert all(grad is not None for grad in grads)
    assert grads[0].abs().sum() > 0 and all(torch.equal(g, torch.zeros_like(g)) for g in grads[1:])
    alone_grad = torch.autograd.grad(string_cayley.cayley(first.s_upper, first.head_dim).sum(), first.s_upper)[0]
    assert torch.equal(grads[0], alone_grad)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_batched_solve_matches_a_solve_per_layer_under_bf16_autocast() -> None:
    """CUDA's default (folded basis, bf16 autocast): CUDA's solvers may pick another kernel for
    the larger batch, so the two agree to rounding rather than to the bit."""
    model = encoder("auto").cuda()
    reference = alone(model)
    layout, x = padded_layout()
    layout = PositionLayout(coords=layout.coords.cuda(), has_pos=layout.has_pos.cuda(), valid=layout.valid.cuda())
    results = []
    for net in (model, reference):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            results.append(step(net, x.cuda(), layout))
    (out, grads), (ref_out, ref_grads) = results
    torch.testing.assert_close(out, ref_out, rtol=2e-2, atol=2e-2)
    assert set(grads) == set(ref_grads)
    for name, grad in ref_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=5e-2, atol=5e-3, msg=name)


def _solves_per_graph(model: torch.nn.Module, regions: list[torch.nn.Module], x, layout) -> list[list[tuple]]:
    """Compiles ``regions`` (aot_eager, each in one graph), runs ``model``, and returns the
    shapes of the matrices (I + S) of each linear solve, per graph Dynamo captured."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    for region in regions:
        region.compile(backend=backend, fullgraph=True)
    model(x, layout)
    return [
        [tuple(node.args[0].meta["example_value"].shape) for node in graph.graph.nodes if "solve" in str(node.target)]
        for graph in graphs
    ]


def test_a_model_compiled_whole_solves_once_and_one_compiled_per_block_per_layer() -> None:
    """Compiled whole, the memo is made inside the compiled forward, and its one graph holds
    one solve for all layers; compiled block by block (the point backbones' trainer.compile),
    each block's graph solves for its own layer. Outputs as eager either way."""
    layout, x = padded_layout()
    eager = encoder("folded")(x, layout)
    whole = encoder("folded")
    d = whole.blocks[0].attn.head_dim
    assert _solves_per_graph(whole, [whole], x, layout) == [[(DEPTH, HEADS, d, d)]]
    torch.testing.assert_close(whole(x, layout), eager)
    per_block = encoder("folded")
    graphs = _solves_per_graph(per_block, list(per_block.blocks), x, layout)  # blocks may share a graph
    assert graphs and all(solves == [(HEADS, d, d)] for solves in graphs), graphs
    torch.testing.assert_close(per_block(x, layout), eager)
    torch._dynamo.reset()
