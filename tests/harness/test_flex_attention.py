"""FlexAttention path of the bias encodings: it must equal the SDPA + dense-bias reference.

On CPU FlexAttention runs eagerly and forward only (no backward), so these tests compare
outputs without gradients; the ``gpu`` tests compile it and check gradients on CUDA.
"""

from __future__ import annotations

import pytest
import torch

from pe_bench.adapters import Geometry, PositionLayout, build
from pe_bench.adapters.base import AttentionInputs, LayerEncoding
from pe_bench.harness import attention as attention_module
from pe_bench.harness.attention import Attention, attention_kernel

DIM, HEADS = 32, 4
GRID = (5, 6)
PREFIX = 1  # a CLS token: no position, no bias

#: every encoding with a Flex form (name, options); see each file for those without one.
FLEX_ENCODINGS = [
    ("alibi", {}),
    ("relpos", {}),
    ("relpos", {"window": 2}),  # offsets beyond the window share the edge cells
    ("pape", {"form": "explicit", "m": 6}),
    ("pape", {"form": "explicit", "m": 3, "linear": False}),
    ("pape", {"form": "explicit", "m": 6, "space": "position"}),  # Eq. 9 from the offsets themselves
    ("pape-ri", {"form": "explicit"}),
    ("pape-ri", {"form": "explicit", "wp_init": "geometric"}),  # a learned w_p: its gradient through Flex
    ("sape2", {}),
    ("sape2", {"mode": "q"}),
    ("lookhere", {}),  # 4 heads: LH-90's four quadrants
    ("lookhere", {"variant": "lh45"}),  # 45-degree eighths, half the plane unseen
    ("lookhere", {"variant": "custom", "head_groups": ["triangles", "none"], "layer_slopes": [0.5, 0.5]}),
]

no_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _layer(name: str, options: dict, dtype: torch.dtype, device: str = "cpu") -> Attention:
    torch.manual_seed(0)
    geometry = Geometry(pos_dim=2, grid_shape=GRID, num_prefix_tokens=PREFIX)
    encoding = build(name, geometry, DIM, HEADS, depth=1, options=options)
    layer = Attention(DIM, HEADS, encoding.make_layer(0)).to(device, dtype).eval()
    with torch.no_grad():
        for parameter in layer.encoding.parameters():
            # Larger than the initialisation, so that the bias moves the attention visibly.
            parameter.normal_(0.0, 0.5)
    return layer


def _inputs(dtype: torch.dtype, padded: bool, device: str = "cpu") -> tuple[torch.Tensor, PositionLayout]:
    gen = torch.Generator().manual_seed(3)
    layout = PositionLayout.grid(2, GRID, PREFIX)
    layout.coords = layout.coords.to(dtype)
    if padded:  # the second sample's last 7 tokens are padding
        layout.valid = torch.ones(2, PREFIX + GRID[0] * GRID[1], dtype=torch.bool)
        layout.valid[1, -7:] = False
    layout = PositionLayout(
        coords=layout.coords.to(device),
        has_pos=layout.has_pos.to(device),
        valid=None if layout.valid is None else layout.valid.to(device),
        grid_shape=layout.grid_shape,
    )
    x = torch.randn(2, layout.coords.shape[1], DIM, generator=gen, dtype=dtype).to(device)
    return x, layout


def _forward(layer: Attention, x: torch.Tensor, layout: PositionLayout, kernel: str, causal: bool = False):
    with torch.no_grad(), attention_kernel(kernel):
        out = layer(x, layout, causal=causal)
    if layout.valid is not None:  # padding rows are never read downstream
        out = out * layout.valid[..., None]
    return out


@pytest.mark.parametrize(("name", "options"), FLEX_ENCODINGS, ids=lambda v: str(v))
@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 1e-5), (torch.float64, 1e-12)], ids=["f32", "f64"])
@pytest.mark.parametrize("padded", [False, True], ids=["full", "padded"])
def test_flex_equals_the_dense_bias_reference(name, options, dtype, tol, padded, monkeypatch):
    layer = _layer(name, options, dtype)
    x, layout = _inputs(dtype, padded)
    calls = []
    real = attention_module.flex_attention_with_masks
    monkeypatch.setattr(
        attention_module, "flex_attention_with_masks", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    dense = _forward(layer, x, layout, "dense")
    assert not calls, "the dense policy must not use Flex"
    flex = _forward(layer, x, layout, "flex")
    assert calls, f"{name} offers a score_mod, so the flex policy must use it"
    torch.testing.assert_close(flex, dense, atol=tol, rtol=tol)
    # ... and the comparison can fail: without its bias the layer computes something else.
    unbiased = Attention(DIM, HEADS).to(dtype).eval()
    unbiased.load_state_dict({k: v for k, v in layer.state_dict().items() if not k.startswith("encoding.")})
    assert (_forward(unbiased, x, layout, "dense") - dense).abs().max() > 100 * tol


CAUSAL = [
    ("alibi", {}),
    ("relpos", {}),
    ("pape", {"form": "explicit", "m": 4}),
    ("pape", {"form": "explicit", "m": 4, "space": "position"}),
    ("pape-ri", {"form": "explicit"}),
    ("sape2", {}),
    ("lookhere", {}),
]


@pytest.mark.parametrize(("name", "options"), CAUSAL)
def test_flex_applies_causality_and_padding_together(name, options):
    layer = _layer(name, options, torch.float64)
    x, layout = _inputs(torch.float64, padded=True)
    dense = _forward(layer, x, layout, "dense", causal=True)
    flex = _forward(layer, x, layout, "flex", causal=True)
    torch.testing.assert_close(flex, dense, atol=1e-12, rtol=1e-12)


def test_cross_attention_flex_equals_dense():
    """Queries and keys on different layouts (different lengths): offsets r_j - r_i across them."""
    torch.manual_seed(0)
    encoding = build("alibi", Geometry(pos_dim=2, grid_shape=(4, 4)), DIM, HEADS, depth=1)
    layer = Attention(DIM, HEADS, encoding.make_layer(0), cross=True).double().eval()
    query = PositionLayout.grid(2, (3, 3), 1)
    key = PositionLayout.grid(2, (4, 4), 0, scale=0.7)
    query.coords, key.coords = query.coords.double(), key.coords.double()
    key.valid = torch.ones(2, 16, dtype=torch.bool)
    key.valid[0, -3:] = False
    x, context = torch.randn(2, 10, DIM, dtype=torch.float64), torch.randn(2, 16, DIM, dtype=torch.float64)
    outs = {}
    for kernel in ("dense", "flex"):
        with torch.no_grad(), attention_kernel(kernel):
            outs[kernel] = layer(x, query, context=context, key=key)
    torch.testing.assert_close(outs["flex"], outs["dense"], atol=1e-12, rtol=1e-12)


class _Diagonal(LayerEncoding):
    """A toy encoding with a Flex form: bias +1 on the diagonal, and keys after the query
    in token order are forbidden by its mask_mod."""

    def bias(self, q, k, inputs):
        n_q, n_k = q.shape[-2], k.shape[-2]
        eye = torch.eye(n_q, n_k, dtype=q.dtype)
        forbidden = torch.ones(n_q, n_k, dtype=torch.bool).triu(1)
        return eye.masked_fill(forbidden, float("-inf"))[None, None]

    def score_mod(self, q, k, inputs):
        return lambda score, b, h, i, j: score + (i == j).to(score.dtype)

    def mask_mod(self, inputs: AttentionInputs):
        return lambda b, h, i, j: j <= i


def test_an_encodings_mask_mod_joins_padding():
    layer = Attention(DIM, HEADS, _Diagonal()).double().eval()
    x, layout = _inputs(torch.float64, padded=True)
    dense = _forward(layer, x, layout, "dense")
    flex = _forward(layer, x, layout, "flex")
    torch.testing.assert_close(flex, dense, atol=1e-12, rtol=1e-12)


def test_auto_policy_keeps_the_dense_path_on_cpu(monkeypatch):
    monkeypatch.setattr(attention_module, "flex_attention_with_masks", lambda *a, **k: pytest.fail("Flex on CPU"))
    layer = _layer("alibi", {}, torch.float32)
    x, layout = _inputs(torch.float32, padded=False)
    with torch.no_grad():
        layer(x, layout)


def test_unknown_kernel_policy_is_named():
    with pytest.raises(ValueError, match="auto.*flex.*dense"), attention_kernel("fast"):
        pass


@pytest.mark.gpu
@no_cuda
@pytest.mark.parametrize(("name", "options"), FLEX_ENCODINGS, ids=lambda v: str(v))
@pytest.mark.parametrize("padded", [False, True], ids=["full", "padded"])
def test_compiled_flex_on_cuda_matches_dense_with_gradients(name, options, padded):
    """CUDA: the compiled Flex kernel, forward and backward, including the gradients of the
    tensors the score_mod closes over (relpos table, PaPE's W_a/W_b/W_p, SaPE² embeddings)."""
    grads = {}
    outs = {}
    for kernel in ("dense", "flex"):
        layer = _layer(name, options, torch.float32, "cuda")
        x, layout = _inputs(torch.float32, padded, "cuda")
        with attention_kernel(kernel):
            out = layer(x, layout)
        if layout.valid is not None:
            out = out * layout.valid[..., None]
        out.square().sum().backward()
        outs[kernel] = out.detach()
        grads[kernel] = {n: p.grad.clone() for n, p in layer.named_parameters() if p.grad is not None}
    torch.testing.assert_close(outs["flex"], outs["dense"], atol=2e-4, rtol=2e-4)
    assert grads["flex"].keys() == grads["dense"].keys()
    for key in grads["dense"]:
        torch.testing.assert_close(grads["flex"][key], grads["dense"][key], atol=2e-3, rtol=2e-3)


def _joint_graphs(layer: Attention, x: torch.Tensor, layout: PositionLayout, monkeypatch) -> list:
    """The joint (forward + backward) graphs of the score_mods that one training forward of
    ``layer`` on Flex builds: what Inductor lowers into the Flex backward on CUDA.

    On CPU eager Flex refuses inputs q, k, v that require gradients, so they are detached
    here; the tensors a score_mod closes over (the encoding's parameters and what is made
    from them) keep theirs, and Flex builds the joint graph for exactly those."""
    import sys

    from pe_bench.adapters import sape2 as sape2_module

    hop = sys.modules["torch._higher_order_ops.flex_attention"]  # the module, not the HOP of its name
    graphs, make_graphs, run_flex = [], hop.create_fw_bw_graph, attention_module.run_flex

    def spy(*args, **kwargs):
        made = make_graphs(*args, **kwargs)
        graphs.append(made[1])
        return made

    def detached(q, k, v, *args, **kwargs):
        return run_flex(q.detach(), k.detach(), v.detach(), *args, **kwargs)

    monkeypatch.setattr(hop, "create_fw_bw_graph", spy)
    # Eager Flex traces itself with Dynamo, which turns shapes seen to change (the tests
    # before) into symbols, and then fails to trace a joint graph on the CPU; CUDA's Flex is
    # compiled with static shapes (_flex.py): so is this one, from a clean Dynamo.
    torch._dynamo.reset()
    for module in (attention_module, sape2_module):
        monkeypatch.setattr(module, "run_flex", detached)
    with attention_kernel("flex"):
        layer(x, layout)
    return graphs


@pytest.mark.parametrize(("name", "options"), FLEX_ENCODINGS, ids=lambda v: str(v))
@pytest.mark.parametrize("padded", [False, True], ids=["full", "padded"])
def test_score_mods_pass_inductors_backward_check(name, options, padded, monkeypatch):
    """Inductor's Flex backward (every CUDA training step) refuses a score_mod that indexes a
    tensor requiring gradients more than once; its check reads the joint graph, which the CPU
    builds too. PaPE's explicit form and SaPE² failed it on an H100 (11-28) before their
    columns were split (_flex.indexed_once); this runs Inductor's own check on every Flex form."""
    from torch._inductor.kernel.flex.flex_attention import validate_joint_graph

    layer = _layer(name, options, torch.float32)
    x, layout = _inputs(torch.float32, padded)
    graphs = _joint_graphs(layer, x, layout, monkeypatch)
    learned = [p for p in layer.encoding.parameters() if p.requires_grad]
    if not learned:  # nothing the score_mod reads has a gradient: no joint graph is built
        assert graphs == []
        return
    assert graphs, f"{name} learns {len(learned)} tensors, but its Flex form built no joint graph"
    for graph in graphs:
        validate_joint_graph(graph.graph)


def test_the_backward_check_catches_a_tensor_indexed_twice(monkeypatch):
    """The check above can fail: a score_mod reading one learned table at i and at j."""
    from torch._inductor.kernel.flex.flex_attention import validate_joint_graph

    table = torch.nn.Parameter(torch.randn(2, 40))

    class _Twice(LayerEncoding):
        def bias(self, q, k, inputs):
            return table[0, : q.shape[-2], None] + table[1, None, : k.shape[-2]]

        def score_mod(self, q, k, inputs):
            return lambda score, b, h, i, j: score + table[0, i] + table[1, j]

    layer = Attention(DIM, HEADS, _Twice())
    x, layout = _inputs(torch.float32, padded=False)
    graphs = _joint_graphs(layer, x, layout, monkeypatch)
    assert graphs
    with pytest.raises(NotImplementedError, match="multiple indexing"):
        for graph in graphs:
            validate_joint_graph(graph.graph)


@pytest.mark.parametrize("return_lse", [False, True])
def test_heads_padded_for_the_cuda_kernels_give_the_same_attention(return_lse, monkeypatch):
    """CUDA's compiled Flex kernels refuse heads narrower than 16 (measured on an H200): run_flex
    zero-pads q, k and v there. Forced here on CPU (forward only: eager Flex has no backward
    on CPU; the gpu tests above compare gradients): same output and log-sum-exp."""
    from pe_bench.adapters import _flex

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 10, width, generator=gen) for width in (8, 8, 5))

    def bias(score, b, h, i, j):
        return score - 0.3 * (i - j).abs()

    def run() -> tuple[torch.Tensor, ...]:
        result = _flex.run_flex(q, k, v, bias, return_lse=return_lse)
        return result if return_lse else (result,)

    plain = run()
    monkeypatch.setattr(_flex, "kernel_min_head_dim", lambda device: 16)
    padded = run()
    for got, want in zip(padded, plain, strict=True):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want)
