"""Operators that make the host wait for the GPU, counted per training step on any device.

A CUDA operator whose result the host must read waits until every kernel queued before it
has finished: a tensor's value (``.item()``, ``bool(t)``, ``if t:``), an output whose size
depends on the values (``nonzero``, boolean-mask indexing, ``unique``, ``bincount``,
``masked_select``, ``repeat_interleave`` without an output size), and linalg's singularity
checks (``linalg.solve``, ``inv``; their ``_ex`` forms skip them). After such a wait the
GPU idles until the host has queued the next kernels again, so one wait per layer costs an
eager step at small batches what issue 16 measured as per-operator overhead, and a
CUDA graph or a ``fullgraph`` compilation cannot hold it.

These are found by their operators, so CI (CPU only) keeps the attention core free of
them. What it cannot see there is an undeclared device-to-host copy (``.cpu()``,
``.to("cpu")``): on the CPU it copies nothing and dispatches nothing (on a GPU it is
found). pe-bench's one copy, WePE's choice of lattice points (once per forward), is
declared through ``adapters/_host.py``'s ``on_host`` and recorded as ``COPY_TO_HOST``.
"""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pe_bench.adapters import _host
from pe_bench.harness.reports.op_count import training_step_under

_aten = torch.ops.aten

#: operators that read a value on the host or size an output by values, whatever their inputs
WAITING_OPERATORS = frozenset({
    _aten._local_scalar_dense.default,  # .item(), bool(t), int(t), float(t)
    _aten.is_nonzero.default,
    _aten.equal.default,
    _aten.nonzero.default,
    _aten.masked_select.default,
    _aten._unique2.default,
    _aten.unique_dim.default,
    _aten.unique_consecutive.default,
    _aten.bincount.default,  # sizes its output by the largest value
    _aten.repeat_interleave.Tensor,  # without output_size, by the sum of the repeats
    _aten._linalg_check_errors.default,  # linalg.solve, inv, cholesky, ... (not their _ex forms)
})  # fmt: skip

#: indexing operators that wait when an index is a boolean mask (it becomes ``nonzero``)
_INDEXING = frozenset({_aten.index.Tensor, _aten.index_put.default, _aten.index_put_.default,
                       _aten._index_put_impl_.default})  # fmt: skip


class HostSync(NamedTuple):
    operator: str  # e.g. "aten._local_scalar_dense.default"
    source: str  # the innermost pe-bench line that called it, "pe_bench.adapters.wepe:103"


def waits_for_device(func: torch._ops.OpOverload, args: tuple, kwargs: dict) -> bool:
    """Whether ``func`` on these arguments makes a CUDA host wait for the device."""
    if func in WAITING_OPERATORS:
        return True
    if func in _INDEXING:
        return any(index is not None and index.dtype == torch.bool for index in args[1])
    if func is _aten._to_copy.default:  # .cpu(), .to("cpu") of a device tensor (seen on a GPU only)
        target = kwargs.get("device")
        return args[0].device.type != "cpu" and target is not None and torch.device(target).type == "cpu"
    return False


#: what a declared copy to the host (``adapters/_host.py``'s ``on_host``) is recorded as
COPY_TO_HOST = "copy to host"


class HostSyncRecorder(TorchDispatchMode):
    """Records every operator dispatched inside the block that would wait for a CUDA device,
    and every declared copy to the host, with the pe-bench line that called it (``syncs``, in
    order); operators of the host's own work inside ``on_host`` are not waits."""

    def __init__(self) -> None:
        super().__init__()
        self.syncs: list[HostSync] = []

    def _copied(self, line: str) -> None:
        self.syncs.append(HostSync(COPY_TO_HOST, line))

    def __enter__(self):
        _host._listeners.append(self._copied)
        return super().__enter__()

    def __exit__(self, *exc):
        _host._listeners.remove(self._copied)
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not _host.in_host_work() and waits_for_device(func, args, kwargs):
            self.syncs.append(HostSync(str(func), _host.calling_line()))
        return func(*args, **kwargs)

    def by_source(self) -> Counter[HostSync]:
        """How often each operator waited at each line (assertion messages, reports)."""
        return Counter(self.syncs)


def host_syncs_per_step(model: torch.nn.Module, inputs: torch.Tensor) -> HostSyncRecorder:
    """The waits of one training forward + backward of ``model`` on ``inputs``, as
    ``op_count`` counts its operators (loss on the summed outputs; no optimiser step)."""
    return training_step_under(HostSyncRecorder(), model, inputs)


def task_training_waits(task_name: str, method: str, profile: str = "tiny") -> HostSyncRecorder:
    """The waits of one training step's model work in ``task_name``'s ``profile`` (its first
    training batch; the module's ``training_loss`` and the backward; no optimiser step),
    with ``method``'s encoding. The tiny profiles generate their data, so this runs anywhere."""
    from pe_bench.harness.config import load_run_config
    from pe_bench.harness.grid.methods import parse_method
    from pe_bench.tasks import get_task

    config = load_run_config(task_name, profile)
    task = get_task(task_name)(config, None)
    spec = parse_method(method)
    make_encoding = spec.encoding(config.methods.get(spec.name))
    reason = make_encoding.unsupported_reason(task.geometry())
    if reason:
        raise ValueError(f"{method} is n/a on {task_name}: {reason}")
    torch.manual_seed(0)
    module = task.lightning_module(task.build_model(make_encoding))
    data = task.datamodule(seed=0)
    data.prepare_data()
    data.setup("fit")
    batch = next(iter(data.train_dataloader()))
    module.train()
    with HostSyncRecorder() as recorder:
        module.training_loss(batch).backward()
    return recorder
