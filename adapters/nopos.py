"""No position encoding: the transformer sees a bag of tokens (the control experiment).

CLS: nothing is positional, so the CLS is treated like every other token, as in any
reference without positions.
"""

from __future__ import annotations

from .base import PositionEncoding, Principle
from .registry import register


@register("nopos")
class NoPosition(PositionEncoding):
    # Attention without positions is trivially invariant to any transform of positions.
    principles = frozenset({Principle.TRANSLATION_INVARIANCE, Principle.ROTATION_INVARIANCE, Principle.FUSED_KERNEL})
