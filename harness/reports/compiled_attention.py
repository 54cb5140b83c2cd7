"""The attention kernels a compiled model runs, read from the graphs Inductor compiled.

``bench``'s kernel columns probe the eager model: ``torch._fused_sdp_choice`` on the tensors
SDPA receives. A compiled model need not run the same kernel. AOT autograd picks SDPA's
backend while it traces, on the strides the traced graph gives q, k and v, and Inductor may
lay out a tensor that an encoding computes (a rotated q, a widened k) otherwise than eager
code does; a kernel that refuses those strides falls to another one, silently. Issue 16's
compiled tables compare encodings that differ exactly there, so a compiled row's kernel is
read from its own graphs: after AOT autograd every SDPA call is one backend's operator
(``aten._scaled_dot_product_cudnn_attention``, ..., or on the math backend no such operator,
the product and softmax written out), and FlexAttention is its higher-order operator.

Recorded through Inductor's post-grad custom pass, which sees each graph as it is lowered
(forward and backward). A plain function there also keeps Inductor from answering from
its on-disk cache of compiled graphs, where no pass would run and nothing be seen.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch._inductor import config as inductor_config

#: operator name prefix -> the kernel's name as ``SDPBackend`` spells it (backward operators
#: share their forward's prefix; the CPU's flash kernel is ``..._flash_attention_for_cpu``)
_KERNELS = {
    "_scaled_dot_product_cudnn_attention": "CUDNN_ATTENTION",
    "_scaled_dot_product_flash_attention": "FLASH_ATTENTION",
    "_scaled_dot_product_efficient_attention": "EFFICIENT_ATTENTION",
    "_scaled_dot_product_fused_attention_overrideable": "OVERRIDEABLE",
    "flex_attention": "FLEX",
}


def kernel_of(target: object) -> str | None:
    """The attention kernel a graph node's target calls, or None for any other operator."""
    name = getattr(target, "__name__", None) or str(target)
    name = name.removeprefix("aten.")
    for prefix, kernel in _KERNELS.items():
        if name.startswith(prefix):
            return kernel
    return None


class CompiledAttention:
    """The attention kernels of the graphs compiled while :func:`recording` is active, per
    label (the method whose model compiled: ``attributing``)."""

    def __init__(self) -> None:
        self._label: str | None = None
        self._graphs: dict[str, int] = {}
        self._kernels: dict[str, set[str]] = {}

    @contextmanager
    def attributing(self, label: str) -> Iterator[None]:
        """Graphs compiled inside the block are ``label``'s."""
        previous, self._label = self._label, label
        try:
            yield
        finally:
            self._label = previous

    def read(self, graph: torch.fx.Graph) -> None:
        if self._label is None:
            return
        self._graphs[self._label] = self._graphs.get(self._label, 0) + 1
        kernels = self._kernels.setdefault(self._label, set())
        for node in graph.nodes:
            if node.op == "call_function" and (kernel := kernel_of(node.target)) is not None:
                kernels.add(kernel)

    def labels(self) -> set[str]:
        """The labels that compiled at least one graph."""
        return {label for label, graphs in self._graphs.items() if graphs}

    def kernels(self, label: str) -> str | None:
        """``label``'s kernels as one name or "FLEX+a" (as ``bench``'s eager probe names
        them); None when it compiled nothing here. A label is one mode (inference or a
        training step), which always runs attention, so where none of its graphs holds an
        attention operator, the math backend wrote it out as products: "MATH"."""
        if not self._graphs.get(label):
            return None
        kernels = self._kernels[label]
        sdpa = "+".join(sorted(kernels - {"FLEX"}))
        if "FLEX" in kernels:
            return f"FLEX+{sdpa}" if sdpa else "FLEX"
        return sdpa or "MATH"

    def column(self, method: str, eager: str) -> str:
        """The kernel column of ``method``'s compiled row, whose inference graphs were
        compiled under ``attributing(f"{method}:infer")`` and training steps' under
        ``f"{method}:train"``: in the eager probe's form ("a (training: b)" where they
        differ), with the probe's answer beside it where that differs; the probe's own,
        marked, where nothing compiled was seen."""
        infer, train = self.kernels(f"{method}:infer"), self.kernels(f"{method}:train")
        if infer is None and train is None:
            return f"{eager} (eager probe; no compiled graph seen)"
        if infer is None or train is None or infer == train:
            compiled = infer or train
        else:
            compiled = f"{infer} (training: {train})"
        return compiled if compiled == eager else f"{compiled} (eager: {eager})"


#: what every compiled table of this process has seen, by method and mode. Dynamo reuses a
#: graph it compiled for a new model of the same method and shapes (its guards hold for
#: any instance), so a second table of the same models compiles, and shows, nothing: the
#: record outlives a table, and its rows read the first table's graphs.
SEEN = CompiledAttention()


@contextmanager
def recording(active: bool = True) -> Iterator[CompiledAttention]:
    """Record in :data:`SEEN` the attention kernels of every graph Inductor compiles inside
    the block (an earlier custom post-grad pass, if any, still runs first). Not ``active``:
    Inductor untouched (an eager table's fused functions keep its cache)."""
    record = SEEN
    if not active:
        yield record
        return
    previous = inductor_config.post_grad_custom_post_pass

    def record_pass(graph: torch.fx.Graph) -> None:
        if previous is not None:
            previous(graph)
        record.read(graph)

    with inductor_config.patch(post_grad_custom_post_pass=record_pass):
        yield record
