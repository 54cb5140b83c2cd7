"""Waits of the host for the GPU (harness/reports/host_sync.py), found on the CPU by their
operators: the recorder finds them, and a ViT training step of every encoding waits nowhere
but where it is declared (WePE's one copy of its half-periods per forward)."""

from __future__ import annotations

import pytest
import torch

from pe_bench.adapters import EncodingFactory, Geometry, NotApplicableError, PositionLayout, build, wepe
from pe_bench.adapters._host import on_host
from pe_bench.adapters.registry import available
from pe_bench.harness import attention
from pe_bench.harness.attention import attention_kernel
from pe_bench.harness.blocks import TransformerEncoder
from pe_bench.harness.config import ModelConfig
from pe_bench.harness.grid.methods import parse_method
from pe_bench.harness.reports.host_sync import (
    COPY_TO_HOST,
    HostSyncRecorder,
    host_syncs_per_step,
    task_training_waits,
    waits_for_device,
)
from pe_bench.tasks._shared.vit import ViT, image_geometry

TINY = ModelConfig(dim=32, depth=2, num_heads=4, mlp_ratio=2.0, patch_size=4)
#: what CUDA runs by default where the CPU runs another form (the ``auto`` options), and the
#: forms a user picks: each has code paths of its own
CUDA_AND_CHOSEN_FORMS = (
    "pape[space=position]", "pape[space=projected]", "pape[low_precision=bias]", "pape[low_precision=round]",
    "pape[form=explicit]", "pape-ri[form=explicit]", "string-cayley[basis=folded]",
    "string-circulant[basis=folded]", "wepe[mode=lut]", "cope[abspos=true]",
)  # fmt: skip
#: encodings whose training step waits on purpose, and where: none but WePE's lattice search
DECLARED = {"wepe": [COPY_TO_HOST], "wepe[mode=lut]": [COPY_TO_HOST]}


def _vit(method: str) -> ViT:
    parsed = parse_method(method)
    torch.manual_seed(0)
    return ViT(EncodingFactory(parsed.name, dict(parsed.options)), image_geometry((16, 16), 4), TINY, 3, 10)


def _operators(recorder: HostSyncRecorder) -> list[str]:
    return [sync.operator for sync in recorder.syncs]


X = torch.randn(4, 4)
SPD = X @ X.T + 4 * torch.eye(4)


@pytest.mark.parametrize(
    ("call", "operator"),
    [
        (lambda: X.sum().item(), "aten._local_scalar_dense.default"),
        (lambda: bool(X[0, 0] > 0), "aten._local_scalar_dense.default"),
        (lambda: X[X > 0], "aten.index.Tensor"),
        (lambda: X.clone().index_put_((X > 0,), torch.tensor(0.0)), "aten.index_put_.default"),
        (lambda: X.nonzero(), "aten.nonzero.default"),
        (lambda: torch.linalg.solve(SPD, X), "aten._linalg_check_errors.default"),
        (lambda: X.unique(), "aten._unique2.default"),
        (lambda: torch.bincount(torch.tensor([0, 2])), "aten.bincount.default"),
        (lambda: torch.equal(X, X), "aten.equal.default"),
    ],
    ids=["item", "bool", "mask-index", "mask-index-put", "nonzero", "solve", "unique", "bincount", "equal"],
)
def test_recorder_finds_the_operators_that_wait(call, operator):
    with HostSyncRecorder() as recorder:
        call()
    assert _operators(recorder) == [operator]
    assert recorder.syncs[0].source == "outside pe-bench"


def test_recorder_passes_what_does_not_wait():
    x = X.clone()
    with HostSyncRecorder() as recorder:
        torch.linalg.solve_ex(SPD, x)  # no singularity check
        x[torch.tensor([0, 2])]  # integer indices: the output size is known
        x.masked_fill(x > 0, 0.0)
        torch.where(x > 0, x, 0.0).cumsum(0).argsort(dim=1)
    assert recorder.syncs == []


def test_a_copy_from_a_device_to_the_host_waits():
    """What the CPU cannot run (its tensors are on the host already), on a meta tensor: a copy
    from any device to the CPU waits, one to the device or within the host does not."""
    to_copy = torch.ops.aten._to_copy.default
    on_device, on_host_ = torch.empty(2, device="meta"), torch.empty(2)
    assert waits_for_device(to_copy, (on_device,), {"device": torch.device("cpu")})
    assert not waits_for_device(to_copy, (on_host_,), {"device": torch.device("meta")})
    assert not waits_for_device(to_copy, (on_host_,), {"device": torch.device("cpu")})
    assert not waits_for_device(to_copy, (on_device,), {"dtype": torch.float16})


def test_declared_copy_is_one_wait_and_its_host_work_none():
    omega1, omega2 = wepe.WeierstrassPE.half_periods(_vit("wepe").encoding)
    with HostSyncRecorder() as recorder:
        chosen = wepe.lattice_indices(omega1, omega2, 120)
    assert len(recorder.syncs) == 1
    (sync,) = recorder.syncs
    assert sync.operator == COPY_TO_HOST and sync.source.startswith("pe_bench.adapters.wepe:")
    # the same search where the values stay on their device: five reads and two boolean masks
    with HostSyncRecorder() as recorder:
        searched = wepe._nearest_lattice_indices(omega1, omega2, 120)
    assert len(recorder.syncs) == 7 and all(s.source.startswith("pe_bench.adapters.wepe:") for s in recorder.syncs)
    assert torch.equal(chosen, searched)


def test_on_host_copies_detached_values():
    a = torch.tensor(1.5, requires_grad=True)
    with on_host(a * 2, a + 1) as (doubled, shifted):
        assert not doubled.requires_grad and (doubled.item(), shifted.item()) == (3.0, 2.5)


@pytest.mark.parametrize("method", [*available(), *CUDA_AND_CHOSEN_FORMS])
def test_training_step_waits_only_where_declared(method):
    images = torch.randn(2, 3, 16, 16)
    with attention_kernel("dense"):
        recorder = host_syncs_per_step(_vit(method), images)
    assert _operators(recorder) == DECLARED.get(method, []), recorder.by_source()


def _padded_layout(geometry: str) -> tuple[Geometry, PositionLayout]:
    """Two samples of the other backbones' geometries, the second one padded."""
    if geometry == "3-D grid":  # video's tubelets, CLS first
        return Geometry(pos_dim=3, grid_shape=(2, 3, 3), num_prefix_tokens=1), PositionLayout.grid(2, (2, 3, 3), 1)
    pos_dim, n = (1, 10) if geometry == "1-D" else (3, 12)  # sequences; point clouds
    coords = (
        torch.randn(2, n, pos_dim) if pos_dim == 3 else torch.arange(n, dtype=torch.float32).expand(2, n)[..., None]
    )
    valid = torch.ones(2, n, dtype=torch.bool)
    valid[1, -3:] = False
    return Geometry(pos_dim=pos_dim), PositionLayout(coords.clone(), torch.ones(2, n, dtype=torch.bool), valid)


@pytest.mark.parametrize("geometry", ["1-D", "3-D grid", "3-D points"])
@pytest.mark.parametrize("method", available())
def test_other_geometries_wait_nowhere(method, geometry):
    """Every encoding where it applies, on 1-D sequences, 3-D grids and point clouds, with
    padding: a training pass of a two-block encoder waits nowhere (WePE is 2-D only)."""
    shape, layout = _padded_layout(geometry)
    torch.manual_seed(0)
    try:
        encoding = build(method, shape, 48, 3, depth=2)
    except NotApplicableError:
        pytest.skip(f"{method} is n/a on {geometry} positions")
    model = TransformerEncoder(48, 2, 3, encoding)
    with attention_kernel("dense"), HostSyncRecorder() as recorder:
        model(torch.randn(2, layout.coords.shape[1], 48), layout).sum().backward()
    assert recorder.syncs == [], recorder.by_source()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("method", [*available(), *CUDA_AND_CHOSEN_FORMS])
def test_training_step_on_cuda_waits_only_where_declared(method):
    """On a GPU the recorder also sees copies to the host (``_to_copy`` to the CPU), which the
    CPU cannot: an undeclared ``.cpu()`` in a CUDA-only path fails here."""
    images = torch.randn(2, 3, 16, 16, device="cuda")
    with attention_kernel("dense"):
        recorder = host_syncs_per_step(_vit(method).cuda(), images)
    assert _operators(recorder) == DECLARED.get(method, []), recorder.by_source()


FLEX_METHODS = ("alibi", "relpos", "lookhere", "sape2", "pape[form=explicit]", "pape-ri[form=explicit]")


@pytest.mark.parametrize("method", FLEX_METHODS)
def test_flex_inputs_are_made_without_waits(method, monkeypatch):
    """What the Flex path computes before its kernel (coordinates, per-head parameters, score
    and mask functions, block masks) waits nowhere: the kernel itself is a stand-in here, as a
    dispatch mode cannot run inside eager Flex (it compiles parts of itself)."""
    import pe_bench.adapters.sape2 as sape2

    calls = []

    def stand_in(q, k, v, score_mod=None, block_mask=None, scale=None, return_lse=False):
        calls.append(score_mod)
        out = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype)
        return (out, torch.zeros(q.shape[:-1])) if return_lse else out

    monkeypatch.setattr(attention, "run_flex", stand_in)
    monkeypatch.setattr(sape2, "run_flex", stand_in)
    model = _vit(method).train()
    with attention_kernel("flex"), HostSyncRecorder() as recorder:
        model(torch.randn(2, 3, 16, 16))
    assert calls, f"{method} made no FlexAttention call"
    assert recorder.syncs == [], recorder.by_source()


def test_task_training_waits_name_the_lines_that_wait():
    """A task's training step, the model's work: none in the image ViT, PTv3's grouping in
    the point clouds (its output sizes depend on the points), and n/a methods refused."""
    assert task_training_waits("cifar10", "rope").syncs == []
    points = task_training_waits("modelnet40", "rope").syncs
    assert points and any(sync.source.startswith("pe_bench.tasks._shared.grouping:") for sync in points)
    with pytest.raises(ValueError, match="wepe is n/a on modelnet40"):
        task_training_waits("modelnet40", "wepe")
