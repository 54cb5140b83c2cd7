"""Fixtures of the adapters' tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from pe_bench.adapters._fused import FusedFunction


@pytest.fixture
def fused_calls(monkeypatch: pytest.MonkeyPatch) -> Callable[[FusedFunction], list[int]]:
    """``fused_calls(function)``: a list that each call of ``function``'s compiled form (an
    ``adapters/_fused.py`` FusedFunction) appends to, for the rest of the test."""

    def counting(function: FusedFunction) -> list[int]:
        calls: list[int] = []
        compiled = function.compiled
        monkeypatch.setattr(function, "compiled", lambda *args: calls.append(1) or compiled(*args))
        return calls

    return counting
