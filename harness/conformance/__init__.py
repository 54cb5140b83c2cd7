"""Conformance suite: measure every principle an encoding claims, and check the protocol.

* :mod:`.probes`: the small models, probe geometries and layouts the suite runs an encoding
  on (also single-layer probes for paper-specific tests);
* :mod:`.principles`: the principle statistics (PaPE, Section 3) and their thresholds;
* :mod:`.protocol`: the protocol checks every encoding must pass (padding, CLS, gradients,
  extrapolation, cross-attention);
* :mod:`.report`: :func:`measure` (or :func:`check`) -> :class:`Report`; :func:`principles_table`.
"""

from .probes import PROBES, Probe
from .protocol import CheckResult
from .report import PrincipleResult, Report, check, clear_cache, measure, principles_table

__all__ = [
    "CheckResult",
    "PrincipleResult",
    "Probe",
    "PROBES",
    "Report",
    "check",
    "clear_cache",
    "measure",
    "principles_table",
]
