"""RoPE-Mixed (Heo et al., "Rotary Position Embedding for Vision Transformer", arXiv 2403.13298).

Rotation pair f of head h in layer l turns by the angle <θ_{l,h,f}, r>, with θ_{l,h,f} in R^P
a learnable frequency *vector*: unlike axial RoPE, a pair can mix the position axes, so each
head learns which directions it is sensitive to. Since the angle is linear in r, scores
depend on positions only through r_j - r_i (translation invariance), and a head resolves
directions, not only distances (directionality).

Tokens without a position (CLS) get angle 0, in a frame centred on the mean position of the
positioned keys: positions are rotated as r - mean(r_keys) (shared by queries and keys, so
exact for pairs of positioned tokens). Rotating by absolute r would put the CLS at the
absolute origin, and translating all patches would change its logits; centred, a
translation changes no logit at all, the CLS's included. Smaller angles are also more
precise in low precision. The centroid is that of the *valid* keys, so masking keys
(padding, dropped tokens, cross-attention onto another key set) changes the CLS's logits.
The official rope-vit code leaves the CLS unrotated with patch positions from 0 (the CLS
sits at the top-left patch); the official PaPE code rotates it at (0, 0) with patches at
(1..W, 1..H).

Initialisation (our generalisation of rope-vit's ``init_2d_freqs`` to any P): the F rotated
pairs form ``levels = head_dim // (2P)`` magnitude levels times P directions. Level l has
magnitude base^(-l / levels) (base 10 as rope-vit's mixed models: magnitudes from 1 down to
about 1/base, whatever P). The P directions are the columns of a random rotation Q_h in
SO(P), drawn per layer and head (Haar, from torch's global RNG): in 2D these are exactly
rope-vit's random angle a and a + π/2. So at initialisation each head is axial RoPE in its
own randomly rotated frame: the heads together see every direction, and no head prefers
the coordinate axes. Pairs are laid out direction-major, [dir 1: levels, dir 2: levels, ..],
as rope.py's axial layout; channels beyond 2 * levels * P are not rotated.
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor, nn

from .base import (
    AttentionInputs,
    EncodingOptions,
    LayerEncoding,
    PositionEncoding,
    PositionLayout,
    Principle,
    key_centred_layouts,
)
from .registry import register
from .rope import rotate_qk, rotation_angles


class RoPEMixedOptions(EncodingOptions):
    base: float = Field(10.0, gt=0.0)  # rope-vit's theta for RoPE-Mixed (axial RoPE uses 100)
    # False freezes the initial frequency vectors (each head axial RoPE in its own random
    # frame): an ablation that tells what learning the mixed directions adds or costs.
    learn_frequencies: bool = True
    # False starts every head in the coordinate axes' frame instead of its own random one
    # (pairs then rotate by one axis each at initialisation, as axial RoPE's do): the ablation
    # that tells what the mixing of the axes at initialisation adds or costs. With
    # learn_frequencies=False and base=100 too, the layer is axial RoPE's rotation.
    random_frame: bool = True


def random_rotation(pos_dim: int) -> Tensor:
    """A Haar-random matrix of SO(P) (QR of a Gaussian, signs fixed)."""
    q, r = torch.linalg.qr(torch.randn(pos_dim, pos_dim, dtype=torch.float64))
    q = q * torch.sign(torch.diagonal(r)).unsqueeze(0)
    if torch.det(q) < 0:  # O(P) -> SO(P): a reflection is not a rotation of the frame
        q[:, 0] = -q[:, 0]
    return q.float()


def mixed_frequencies(num_heads: int, pos_dim: int, levels: int, base: float, rotate: bool = True) -> Tensor:
    """(H, P, F) frequency vectors, F = levels * P: column f is pair f's θ (see module doc).

    ``rotate`` False uses the coordinate axes as every head's frame: axial RoPE's frequencies
    in the mixed layout (what STRING starts from).
    """
    magnitudes = base ** (-torch.arange(levels, dtype=torch.float32) / levels)  # (levels,)
    heads = []
    for _ in range(num_heads):
        # Columns = the head's P directions.
        frame = random_rotation(pos_dim) if rotate else torch.eye(pos_dim)
        # (P coords, P directions, levels) -> direction-major pair index.
        heads.append((frame.unsqueeze(-1) * magnitudes).flatten(1))
    return torch.stack(heads)


def mixed_angles(layout: PositionLayout, frequencies: Tensor) -> Tensor:
    """Angles <θ_f, r>: (B, N, P) positions, (H, P, F) frequencies -> (B, H, N, F); 0 without position."""
    pos_dim, pairs = frequencies.shape[-2:]
    # rope.py's helper gives the per-axis terms θ_{p,f} r_p; a mixed pair adds them up.
    return rotation_angles(layout, frequencies).unflatten(-1, (pos_dim, pairs)).sum(-2)


def rotate_mixed(q: Tensor, k: Tensor, inputs: AttentionInputs, frequencies: Tensor) -> tuple[Tensor, Tensor]:
    """Rotate q and k by their own layouts' mixed angles (layouts may differ: cross-attention)."""
    query, key = key_centred_layouts(inputs, frequencies.dtype)
    q_angle = mixed_angles(query, frequencies)
    k_angle = q_angle if key is query else mixed_angles(key, frequencies)
    return rotate_qk(q, k, q_angle, k_angle)


class MixedRotaryLayer(LayerEncoding):
    def __init__(self, frequencies: Tensor, learn_frequencies: bool = True) -> None:
        super().__init__()
        # (H, P, F) per layer; a frozen one stays a parameter, so checkpoints keep one layout
        self.frequencies = nn.Parameter(frequencies, requires_grad=learn_frequencies)

    def transform_qk(self, q: Tensor, k: Tensor, inputs: AttentionInputs) -> tuple[Tensor, Tensor]:
        return rotate_mixed(q, k, inputs, self.frequencies)


def rope_levels(head_dim: int, pos_dim: int, name: str) -> int:
    levels = head_dim // (2 * pos_dim)
    if levels == 0:
        raise ValueError(f"{name} needs head_dim >= 2 * P, got {head_dim} for P={pos_dim}")
    return levels


@register("rope-mixed")
class RoPEMixed(PositionEncoding):
    principles = frozenset({Principle.TRANSLATION_INVARIANCE, Principle.DIRECTIONALITY, Principle.FUSED_KERNEL})
    Options = RoPEMixedOptions

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.levels = rope_levels(self.head_dim, self.geometry.pos_dim, self.name)

    def make_layer(self, layer_index: int) -> LayerEncoding:
        freqs = mixed_frequencies(self.num_heads, self.geometry.pos_dim, self.levels, self.options.base)
        if not self.options.random_frame:
            # The random frames above are drawn all the same and dropped, so the global RNG
            # moves on as in a random-frame run and every other weight of the model starts
            # as it does there: the ablation changes the frames only.
            freqs = mixed_frequencies(
                self.num_heads, self.geometry.pos_dim, self.levels, self.options.base, rotate=False
            )
        return MixedRotaryLayer(freqs, self.options.learn_frequencies)
