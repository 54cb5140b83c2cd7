"""The position-encoding protocol every backbone speaks.

A backbone describes its tokens with a :class:`PositionLayout` (positions, which tokens
have a position, which are padding, the grid if any) and its input space with a
:class:`Geometry`. An encoding (:class:`PositionEncoding`) may act at three places:

1. ``embed``            - add something to the input tokens (absolute encodings);
2. ``transform_qk``     - transform queries and keys per layer, possibly widening them
                          (RoPE family, PaPE's efficient form);
3. ``bias``             - an additive (B, H, Nq, Nk) attention bias per layer
                          (ALiBi, relpos, PaPE's reference form).

A bias encoding may also offer the same bias as a FlexAttention ``score_mod`` (and extra
masking as a ``mask_mod``): a function of (batch, head, query, key) indices closed over
small per-token tensors, which FlexAttention evaluates inside its kernel, so the N x N
bias is never stored. The attention core uses it on CUDA; ``bias`` stays the reference.

Per-layer parameters live in :class:`LayerEncoding` modules built by
``PositionEncoding.make_layer``. Encodings that return no bias never build an N x N tensor:
the attention core then calls the fused SDPA kernel with at most a key-padding mask.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import ClassVar, TypeVar

import torch
from pydantic import BaseModel, ConfigDict
from torch import Tensor, nn


class Principle(str, Enum):
    """The design principles of PaPE Section 3, plus kernel compatibility."""

    TRANSLATION_INVARIANCE = "translation-invariance"
    ROTATION_INVARIANCE = "rotation-invariance"
    DISTANCE_DECAY = "distance-decay"
    DIRECTIONALITY = "directionality"
    CONTEXT_AWARENESS = "context-awareness"
    FUSED_KERNEL = "fused-kernel"


@dataclass(frozen=True)
class Geometry:
    """Where the tokens of a task live.

    pos_dim:           P, the number of position coordinates per token.
    grid_shape:        the training grid of positioned tokens (row-major), or None when
                       positions are irregular (points, events).
    units:             what one unit of position means ("patch", "second", "token", "m").
    num_prefix_tokens: tokens without position (CLS, registers) placed before the others.
    """

    pos_dim: int
    grid_shape: tuple[int, ...] | None = None
    units: str = "patch"
    num_prefix_tokens: int = 0

    @property
    def is_grid(self) -> bool:
        return self.grid_shape is not None


def padding_mask(valid: Tensor) -> Tensor | None:
    """A (B, N) validity mask as a layout's ``valid``: None when nothing is padded, so SDPA
    keeps its mask-free kernels. Compiled (``trainer.compile``), the mask is kept as it is:
    testing it there is a data-dependent graph break and a wait for the GPU, and an all-True
    mask changes no result."""
    if torch.compiler.is_compiling() or not bool(valid.all()):
        return valid
    return None


@dataclass
class PositionLayout:
    """Positions of one token sequence, as the attention layers see them.

    coords:     (B, N, P) float positions. Entries of tokens without position are ignored.
    has_pos:    (B, N) bool, False for CLS/register tokens: they must stay position-free.
    valid:      (B, N) bool key-padding mask, False for padding; None when nothing is padded.
                Padding's coordinates must be finite (their values are otherwise free): the
                encodings zero coordinates by ``has_pos``, so a loader that marks padding with
                NaN must give it has_pos False too (PaPE's efficient form turned every real
                token's output into NaN from a NaN padding key with has_pos True; stop 71).
    grid_shape: the current grid of the positioned tokens (row-major after the prefix
                tokens), or None for irregular positions.

    A layout made by :meth:`sharing_features` also carries a memo for
    :func:`shared_per_forward`; every other layout (a new one, or ``with_coords``) has none.
    """

    coords: Tensor
    has_pos: Tensor
    valid: Tensor | None = None
    grid_shape: tuple[int, ...] | None = None
    _shared: dict | None = field(default=None, init=False, repr=False, compare=False)
    #: whether the memo was made inside torch.compile: then the forward that uses it is
    #: compiled with it, whole (per_forward_memo's ``within_compiled_forward``)
    _shared_compiled: bool = field(default=False, init=False, repr=False, compare=False)

    def sharing_features(self) -> PositionLayout:
        """A copy of this layout with an empty memo of position-only features (rotation
        tables, key-centred coordinates, position-only biases): the layers of one forward
        that see it compute each such feature once (:func:`shared_per_forward`).

        A backbone calls this once per forward on the layout all its layers see, so the
        memo lives as long as that forward: nothing is reused from one batch to the next
        (whose positions, dtype or grad mode may differ), and a benchmark that times
        forwards on one layout object still pays for every forward's features.
        """
        layout = replace(self)
        layout._shared = {}
        layout._shared_compiled = torch.compiler.is_compiling()
        return layout

    @property
    def pos_dim(self) -> int:
        return self.coords.shape[-1]

    @property
    def positioned(self) -> Tensor:
        """Tokens that carry a position and are not padding."""
        return self.has_pos if self.valid is None else self.has_pos & self.valid

    def with_coords(self, coords: Tensor) -> PositionLayout:
        return replace(self, coords=coords)

    def coords_or_zero(self, dtype: torch.dtype | None = None) -> Tensor:
        """Coordinates (cast to ``dtype``) with the rows of position-free tokens set to 0 by
        ``where``. Their entries are to be ignored, and may be NaN or inf (a loader's "no
        position"): weighting them by 0 left NaN in the outputs, and 0 x NaN in the gradients
        of every parameter applied to them. For finite entries the bits are the product's."""
        coords = self.coords if dtype is None else self.coords.to(dtype)
        return torch.where(self.has_pos.unsqueeze(-1), coords, 0.0)

    @staticmethod
    def grid(
        batch: int,
        grid_shape: tuple[int, ...],
        num_prefix_tokens: int = 0,
        device: torch.device | str | None = None,
        scale: float = 1.0,
    ) -> PositionLayout:
        """Layout of prefix tokens followed by a row-major grid with unit spacing from 0."""
        axes = [torch.arange(n, device=device, dtype=torch.float32) for n in grid_shape]
        coords = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, len(grid_shape))
        coords = coords * scale
        prefix = torch.zeros(num_prefix_tokens, len(grid_shape), device=device)
        coords = torch.cat([prefix, coords]).expand(batch, -1, -1)
        has_pos = torch.ones(1, coords.shape[1], dtype=torch.bool, device=device)
        has_pos[:, :num_prefix_tokens] = False
        # Both expanded (stride 0 over the batch): every sample shares one grid, which lets
        # position-only biases be built once (first_sample_if_shared).
        return PositionLayout(coords=coords, has_pos=has_pos.expand(batch, -1), grid_shape=tuple(grid_shape))


@dataclass
class AttentionInputs:
    """Everything a per-layer encoding may use besides q and k."""

    x_q: Tensor  # (B, Nq, D) normalised tokens that produced the queries
    x_k: Tensor  # (B, Nk, D) normalised tokens that produced the keys
    query: PositionLayout
    key: PositionLayout
    causal: bool = False
    #: True when the attention core has folded the layer's ``LayerEncoding.qk_basis`` into
    #: the q and k projections: q and k arrive already multiplied by it, and ``transform_qk``
    #: must not apply it again
    qk_in_basis: bool = False
    #: values of the keys alone that the chunks of queries of one attention call share
    #: (:func:`shared_by_query_chunks`); None outside such a call
    key_memo: dict | None = None

    def for_queries(self, rows: Tensor | slice) -> AttentionInputs:
        """These inputs for the queries ``rows`` only (every key stays; in self-attention the
        key layout is still the whole sequence's). The restricted query layout has no grid.
        A slice keeps a batch-shared layout shared (stride 0), an index tensor copies it."""
        query = self.query
        valid = None if query.valid is None else query.valid[:, rows]
        part = PositionLayout(coords=query.coords[:, rows], has_pos=query.has_pos[:, rows], valid=valid)
        return replace(self, x_q=self.x_q[:, rows], query=part)


Shared = TypeVar("Shared")


def shared_per_forward(inputs: AttentionInputs, name: Hashable, compute: Callable[[], Shared]) -> Shared:
    """``compute()``, evaluated once per forward for all layers that ask with the same
    ``name`` and the same key layout: features that depend on positions only (and on
    buffers every layer shares), so every layer would compute the same value.

    The memo is the query layout's (:meth:`PositionLayout.sharing_features`); without one,
    and inside ``torch.compile`` (whose common-subexpression elimination already merges
    the layers' identical computations into one), this is ``compute()``. ``name`` must
    name everything the value depends on besides the layouts (e.g. the dtype, or the
    module whose buffers it reads). Cross-attention keeps one entry per key layout object.
    """
    memo = per_forward_memo(inputs.query)
    if memo is None:
        return compute()
    slot = (name, id(inputs.key))
    entry = memo.get(slot)
    if entry is None or entry[0] is not inputs.key:  # the layout itself guards against a reused id
        entry = memo[slot] = (inputs.key, compute())
    return entry[1]


def per_forward_memo(layout: PositionLayout | None, within_compiled_forward: bool = False) -> dict | None:
    """The memo that the layers of one forward share through ``layout`` (made by
    :meth:`PositionLayout.sharing_features`), or None: for a layout without one, and inside
    ``torch.compile``, where a graph may hold only some of the layers (a backbone compiled
    block by block) and common-subexpression elimination merges what one graph repeats.
    ``within_compiled_forward``: inside torch.compile too where the memo was made in the
    compiled code (a model compiled whole), for values CSE cannot merge because each layer's
    differs (Cayley-STRING's solves). Entries are keyed by their users;
    :func:`shared_per_forward` keys by name and key layout."""
    if layout is None or layout._shared is None:
        return None
    if torch.compiler.is_compiling() and not (within_compiled_forward and layout._shared_compiled):
        return None
    return layout._shared


def shared_by_query_chunks(inputs: AttentionInputs, name: Hashable, compute: Callable[[], Shared]) -> Shared:
    """``compute()``, evaluated once per attention call for all its chunks of queries (the
    dense path's ``query_chunks``, which gives them one ``key_memo``): values of the keys
    alone, such as PaPE's key features, which every chunk would compute again from the same
    keys. Outside a chunked call, ``compute()``. ``name`` must name everything the value
    depends on besides the keys and this layer (one memo serves one layer's call).

    Not :func:`shared_per_forward`: that memo is the query layout's, and a chunk's query
    layout is a new one; and values here may depend on the layer's parameters (PaPE's W_p).
    """
    memo = inputs.key_memo
    if memo is None:
        return compute()
    if name not in memo:
        memo[name] = compute()
    return memo[name]


def _shared_over_batch(t: Tensor | None) -> bool:
    """True when every sample of ``t`` is the same memory (one sample, or expanded)."""
    return t is None or t.shape[0] == 1 or t.stride(0) == 0


def first_sample_if_shared(inputs: AttentionInputs) -> AttentionInputs:
    """``inputs`` cut to its first sample when all samples share their positions, position
    flags and padding, else ``inputs`` unchanged.

    For a bias that depends on positions alone (ALiBi, LookHere, relpos) the cut gives a
    (1, H, Nq, Nk) bias that SDPA broadcasts over the batch, instead of B identical copies:
    at 24 x 24 patches and batch 64 those copies made LookHere's dense bias 20x the cost of
    its attention. Sharing is read from the strides (a grid layout is expanded, stride 0),
    never from the values: no data-dependent branch, and an exact test (per-sample
    augmentations such as CAPE's make new tensors, which stay per sample).
    """
    layouts = (inputs.query,) if inputs.key is inputs.query else (inputs.query, inputs.key)
    if inputs.x_q.shape[0] == 1 or not all(
        _shared_over_batch(t) for layout in layouts for t in (layout.coords, layout.has_pos, layout.valid)
    ):
        return inputs

    def first(layout: PositionLayout) -> PositionLayout:
        valid = None if layout.valid is None else layout.valid[:1]
        return replace(layout, coords=layout.coords[:1], has_pos=layout.has_pos[:1], valid=valid)

    query = first(inputs.query)
    key = query if inputs.key is inputs.query else first(inputs.key)
    return replace(inputs, x_q=inputs.x_q[:1], x_k=inputs.x_k[:1], query=query, key=key)


class EncodingOptions(BaseModel):
    """Base of every encoding's options: unknown keys are errors that name the key."""

    model_config = ConfigDict(extra="forbid", frozen=True)


#: FlexAttention's score_mod: (score, batch, head, q_idx, kv_idx) -> modified score.
ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]
#: FlexAttention's mask_mod: (batch, head, q_idx, kv_idx) -> True where attention is allowed.
MaskMod = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


class LayerEncoding(nn.Module):
    """Per-attention-layer part of an encoding. Default: does nothing."""

    #: names of this module's parameters that are position-indexed tables (an entry per
    #: position or offset, added or embedded as it is): the parameters
    #: ``optim.table_lr_scale`` applies to (see :func:`position_table_parameters`).
    tables: ClassVar[frozenset[str]] = frozenset()
    #: whether ``bias`` of some of the queries (``inputs.for_queries(rows)`` with those rows
    #: of the transformed q) equals those rows of the whole bias, for non-causal attention: the
    #: attention core then builds a dense bias above ``DENSE_BIAS_CHUNK_ELEMENTS``
    #: (harness/attention.py) one chunk of queries at a time. Tested for every encoding that
    #: sets it (tests/harness/test_bias_chunks.py); False for biases of all queries at once
    #: (SaPE²'s compares two queries' own vectors).
    bias_by_query_chunks: ClassVar[bool] = False

    def transform_qk(self, q: Tensor, k: Tensor, inputs: AttentionInputs) -> tuple[Tensor, Tensor]:
        """q: (B, H, Nq, E), k: (B, H, Nk, E) -> transformed (may widen E, equally for q and k)."""
        return q, k

    def qk_basis(self) -> Tensor | None:
        """A position-free linear map M that ``transform_qk`` applies first to every head's q
        and k (z -> M z; (H, E, E) per head or (E, E) for all), or None (default): STRING's
        orthogonal P or Fourier basis. The attention core may fold M into the q and k
        projections (W -> M W, b -> M b: one (E x E) x (E x D) product per head and forward,
        where applying M costs a matrix product and its copies per token, for q and for k) and
        then passes ``inputs.qk_in_basis``, on which ``transform_qk`` must skip M. The two are
        the same function up to rounding; the conformance suite checks it."""
        return None

    def forward_qk_basis(self, layout: PositionLayout) -> Tensor | None:
        """``qk_basis`` as a forward whose query layout is ``layout`` uses it (the attention
        core and the per-token path ask here): an encoding may compute every layer's M at once
        in the layout's :func:`per_forward_memo` (Cayley-STRING's one batched solve).
        Default: ``qk_basis()``, this layer's M alone, the reference."""
        return self.qk_basis()

    def fold_qk_basis(self, device: torch.device) -> bool:
        """Whether the core should fold ``qk_basis`` into the projections for tensors on
        ``device`` (an encoding option may decide; see STRING's ``basis``)."""
        return False

    def bias(self, q: Tensor, k: Tensor, inputs: AttentionInputs) -> Tensor | None:
        """Additive bias (B or 1, H, Nq, Nk) on the *scaled* logits q.k / sqrt(E), as ALiBi and
        relpos define it. Encodings whose bias lives inside S = q.k (PaPE Eq. 9) scale it."""
        return None

    def dense_bias_elements(self, q: Tensor, k: Tensor, inputs: AttentionInputs) -> int:
        """Elements of the largest tensor ``bias`` builds, which the attention core weighs
        (``trainer.attention_kernel: auto`` on CUDA) against FlexAttention, and against its
        budget per chunk of queries on the dense path (``bias_by_query_chunks``): one (B or 1, H,
        Nq, Nk) bias, one sample's when the batch shares positions and padding
        (``first_sample_if_shared``) and no key padding must be masked into it per sample.
        Encodings whose dense path builds more (per-sample gates, a per-pair m-vector) say so."""
        per_sample = inputs.key.valid is not None
        batch = q.shape[0] if per_sample else first_sample_if_shared(inputs).x_q.shape[0]
        return batch * q.shape[1] * q.shape[-2] * k.shape[-2]

    def score_mod(self, q: Tensor, k: Tensor, inputs: AttentionInputs) -> ScoreMod | None:
        """``bias`` as a FlexAttention score_mod (optional): ``score + bias[b, h, i, j]``, with
        the bias computed from per-token tensors inside the function, never stored as N x N.
        ``q``, ``k`` are the transformed heads. Key padding and causality are the attention
        core's business, not the score_mod's. None: the encoding has no Flex form."""
        return None

    def query_groups(self, inputs: AttentionInputs) -> list[Tensor] | None:
        """Groups of query indices (a partition of 0..Nq-1) that the attention core transforms
        and attends separately: ``transform_qk`` then sees one group's queries (``inputs``
        restricted by ``AttentionInputs.for_queries``) with every key, and the outputs are put
        back in query order. For encodings whose transform is better per group (PaPE's
        ``frame_tile``: a frame per tile of queries); only for encodings without a bias.
        None (default): all queries at once."""
        return None

    def mask_mod(self, inputs: AttentionInputs) -> MaskMod | None:
        """Positions the encoding forbids (LookHere's fields of view) as a FlexAttention
        mask_mod, True where attention is allowed (optional; the core adds padding and
        causality). Only consulted together with ``score_mod``."""
        return None


class PositionEncoding(nn.Module):
    """Model-level part of an encoding, built once per model by the registry.

    Subclasses set ``name``, ``principles`` and ``Options`` and override any of
    ``prepare``, ``embed`` and ``make_layer``.
    """

    name: ClassVar[str] = ""
    #: position-indexed table parameters of this module (as :attr:`LayerEncoding.tables`).
    tables: ClassVar[frozenset[str]] = frozenset()
    #: principles the encoding claims; the conformance suite measures every claim.
    principles: ClassVar[frozenset[Principle]] = frozenset()
    #: position dimensionalities supported; None = any P.
    pos_dims: ClassVar[frozenset[int] | None] = None
    #: True when the encoding is only defined on a regular grid (abspos, LookHere, WePE).
    requires_grid: ClassVar[bool] = False
    #: False when scaling positions is meaningless (encodings that index grid cells, whose
    #: resize to a new grid already is their interpolation): extrapolation shows n/a then.
    supports_position_interpolation: ClassVar[bool] = True
    Options: ClassVar[type[EncodingOptions]] = EncodingOptions

    def __init__(
        self,
        geometry: Geometry,
        dim: int,
        num_heads: int,
        depth: int,
        options: EncodingOptions | None = None,
    ) -> None:
        super().__init__()
        reason = self.unsupported_reason(geometry)
        if reason:
            raise NotApplicableError(f"{self.name}: {reason}")
        self.geometry = geometry
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.depth = depth
        self.options = options if options is not None else self.Options()

    @classmethod
    def unsupported_reason(cls, geometry: Geometry) -> str | None:
        """Why the encoding is not defined for ``geometry`` (None if it is)."""
        if cls.pos_dims is not None and geometry.pos_dim not in cls.pos_dims:
            dims = ", ".join(str(d) for d in sorted(cls.pos_dims))
            return f"defined for {dims}-D positions only, got {geometry.pos_dim}-D"
        if cls.requires_grid and not geometry.is_grid:
            return "defined on regular grids only, the task's positions are irregular"
        return None

    def claimed_principles(self) -> frozenset[Principle]:
        """Principles this configured instance claims (options may drop some)."""
        return self.principles

    def prepare(self, layout: PositionLayout) -> PositionLayout:
        """Transform positions once per forward pass (e.g. CAPE's augmentation)."""
        return layout

    def embed(self, x: Tensor, layout: PositionLayout) -> Tensor:
        """Input-embedding action; x: (B, N, D)."""
        return x

    def make_layer(self, layer_index: int) -> LayerEncoding | None:
        """Per-layer module for attention layer ``layer_index`` (None = no per-layer action)."""
        return None


def position_table_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The position-indexed tables among :func:`positional_parameters` (each encoding module
    names its own in ``tables``): entries that a short schedule must grow from about zero,
    unlike projections (PaPE's W_p, rope-mixed's frequencies), whose effect a step of the
    learning rate already scales by the positions or features they multiply."""
    return [
        getattr(module, name)
        for module in model.modules()
        if isinstance(module, (PositionEncoding, LayerEncoding))
        for name in sorted(module.tables)
    ]


def positional_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """The parameters of ``model`` that belong to its position encoding(s), in
    ``named_parameters`` order and names: those of every :class:`PositionEncoding` and every
    per-layer :class:`LayerEncoding` (submodules included). Decided by type, so it holds
    whatever attribute name a backbone gives its encodings (``encoding``,
    ``encoder_encoding``, a per-stage list, ...)."""
    owned = {
        id(param)
        for module in model.modules()
        if isinstance(module, (PositionEncoding, LayerEncoding))
        for param in module.parameters()
    }
    return [(name, param) for name, param in model.named_parameters() if id(param) in owned]


class NotApplicableError(ValueError):
    """The encoding is not defined for the task's geometry (the table shows n/a)."""


def masked_mean(coords: Tensor, mask: Tensor) -> Tensor:
    """Mean over tokens where ``mask`` is True: (B, N, P), (B, N) -> (B, 1, P). Tokens outside
    the mask are left out by ``where``, not weighted by 0: their coordinates are to be ignored
    (``PositionLayout``), and a NaN there times 0 would still be NaN, in every centred position.
    For finite coordinates the bits are those of the weighted sum (a zero of either sign adds
    nothing; the count, a sum of 0s and 1s, is exact)."""
    selected = mask.unsqueeze(-1)
    count = selected.sum(1, keepdim=True).clamp_min(1).to(coords.dtype)
    return torch.where(selected, coords, 0.0).sum(1, keepdim=True) / count


def key_centred_coords(inputs: AttentionInputs, dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
    """Query and key positions (in ``dtype``) relative to the mean positioned key.

    Translation invariance makes the shift exact, and it keeps the squared terms of the
    efficient forms small. Returns the same tensor twice for self-attention. Computed once
    per forward and dtype (:func:`shared_per_forward`).
    """
    return shared_per_forward(inputs, ("key-centred", dtype), lambda: _key_centred_coords(inputs, dtype))


def _key_centred_coords(inputs: AttentionInputs, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    shared = first_sample_if_shared(inputs)
    query, key = shared.query, shared.key
    origin = masked_mean(key.coords.to(dtype), key.positioned)
    r_q = query.coords.to(dtype) - origin
    r_k = r_q if key is query else key.coords.to(dtype) - origin
    return r_q, r_k


def group_centred_coords(inputs: AttentionInputs, dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
    """Query and key positions (in ``dtype``) relative to the mean positioned *query*, for a
    group of queries (``LayerEncoding.query_groups``) that shares one frame; a group without
    a positioned query keeps the mean positioned key as its origin (its queries carry no
    positional term). The same translation as ``key_centred_coords``, another origin."""
    query, key = inputs.query, inputs.key
    q_coords, k_coords = query.coords.to(dtype), key.coords.to(dtype)
    positioned = query.positioned
    has_any = positioned.any(1, keepdim=True).unsqueeze(-1)  # (B, 1, 1)
    origin = torch.where(has_any, masked_mean(q_coords, positioned), masked_mean(k_coords, key.positioned))
    return q_coords - origin, k_coords - origin


def grid_tiles(layout: PositionLayout, edge: int) -> list[Tensor]:
    """The token indices of ``layout`` in tiles of ``edge`` cells per axis of its grid (the
    positioned tokens are row-major after the prefix tokens, which join the first tile), or,
    without a grid, in chunks of ``edge ** P`` consecutive tokens (1-D sequences, and
    serialised point patches, are compact in token order). On the layout's device.

    Assumes the tokens after the prefix are exactly the grid's cells: tokens after the grid
    (padding appended to it) are counted as prefix tokens, which shifts every tile off its
    block, still exact, but without the bf16 accuracy that compact tiles are for; such a
    layout should drop its ``grid_shape`` (the tasks pad inside their grids)."""
    n, device = layout.coords.shape[1], layout.coords.device
    return [torch.tensor(rows, device=device) for rows in _tile_rows(n, layout.grid_shape, edge, layout.pos_dim)]


@torch.compiler.assume_constant_result  # host-side arithmetic on shapes: a constant to torch.compile
def _tile_rows(n: int, grid: tuple[int, ...] | None, edge: int, pos_dim: int) -> tuple[tuple[int, ...], ...]:
    # Plain Python on the grid's shape, once per forward (the memo shares it between layers).
    if grid is None or math.prod(grid) > n:
        size = edge**pos_dim
        return tuple(tuple(range(start, min(start + size, n))) for start in range(0, n, size))
    prefix = n - math.prod(grid)
    tiles: dict[tuple[int, ...], list[int]] = {}
    for cell, index in enumerate(itertools.product(*(range(g) for g in grid))):  # row-major
        tiles.setdefault(tuple(i // edge for i in index), []).append(prefix + cell)
    ordered = [tiles[key] for key in sorted(tiles)]
    ordered[0] = list(range(prefix)) + ordered[0]
    return tuple(tuple(rows) for rows in ordered)


def key_centred_layouts(inputs: AttentionInputs, dtype: torch.dtype) -> tuple[PositionLayout, PositionLayout]:
    """Query and key layouts with positions relative to the mean positioned key (see module doc)."""
    dtype = torch.promote_types(inputs.query.coords.dtype, dtype)
    r_q, r_k = key_centred_coords(inputs, dtype)
    shared = first_sample_if_shared(inputs)
    query = shared.query.with_coords(r_q)
    key = query if shared.key is shared.query else shared.key.with_coords(r_k)
    return query, key


def at_least_float32(*dtypes: torch.dtype) -> torch.dtype:
    """The widest of ``dtypes`` and float32: the dtype of positional arithmetic (squares of
    positions, phases of tens of radians), which 16 bits would round away."""
    return functools.reduce(torch.promote_types, dtypes, torch.float32)


def sinusoid_features(coords: Tensor, frequencies: Tensor) -> Tensor:
    """cos/sin of coords projected on frequency vectors: (..., P), (F, P) -> (..., 2F), in
    float32 or wider under autocast too: autocast runs a matmul in 16 bits, and phases of
    hundreds of radians (CAPE on speech: seconds x 30) would keep no digit of their fraction."""
    dtype = at_least_float32(coords.dtype, frequencies.dtype)
    with torch.autocast(coords.device.type, enabled=False):
        phase = coords.to(dtype) @ frequencies.to(dtype).T
    return torch.cat([torch.cos(phase), torch.sin(phase)], dim=-1)


def geometric_frequencies(count: int, base: float = 10000.0) -> Tensor:
    """Vaswani et al.'s frequencies base^(-k/count), k = 0..count-1."""
    return torch.exp(-math.log(base) * torch.arange(count, dtype=torch.float32) / count)


def init_truncated_normal(param: Tensor, std: float) -> Tensor:
    """``nn.init.trunc_normal_`` (cut at +-2, timm's tables) that also takes ``std = 0``: the
    options allow a zero initialisation, for which torch's divides by the deviation."""
    if std == 0:
        return nn.init.zeros_(param)
    return nn.init.trunc_normal_(param, std=std)
