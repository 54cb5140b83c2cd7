"""Host-side work inside a forward, declared as such: ``on_host``.

An encoding that must decide something on the host from a learned value (WePE's choice of
lattice points) copies that value to the CPU, and the copy waits for the GPU to finish
everything queued before it. ``on_host`` makes that copy in one piece and tells an active
``HostSyncRecorder`` (harness/reports/host_sync.py) about it, which on the CPU could not see
it otherwise (a CPU tensor's ``.cpu()`` dispatches nothing); what runs inside is host work,
which the recorder leaves out.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

#: the active recorders' callbacks, each called with the calling line of a declared copy
_listeners: list[Callable[[str], None]] = []
_host_depth = 0
#: modules whose frames are the recording's own, never the line that made a wait
_PLUMBING = {__name__, "pe_bench.harness.reports.host_sync"}


def calling_line() -> str:
    """The innermost frame of pe-bench's own code above the caller, as module:line (frames of
    this module and of the recorder left out)."""
    frame = sys._getframe(1)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module.startswith("pe_bench.") and module not in _PLUMBING:
            return f"{module}:{frame.f_lineno}"
        frame = frame.f_back
    return "outside pe-bench"


def in_host_work() -> bool:
    """Whether the caller runs inside ``on_host``."""
    return _host_depth > 0


@contextmanager
def on_host(*tensors: Tensor) -> Iterator[tuple[Tensor, ...]]:
    """CPU copies (detached) of ``tensors``, made by one copy: they are stacked on their device
    first, so all must have one shape and dtype. The block is the host's work on them."""
    global _host_depth
    line = calling_line()
    for listener in _listeners:
        listener(line)
    _host_depth += 1  # from here on host work, the copy's own operators included
    try:
        detached = [t.detach() for t in tensors]
        if any(t.device.type != "cpu" for t in detached):
            copies = tuple(torch.stack(detached).cpu().unbind())
        else:  # already there: no copy, no operator (the operator counts stay those of the CPU)
            copies = tuple(detached)
        yield copies
    finally:
        _host_depth -= 1
