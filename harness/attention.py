"""The one attention core every backbone uses.

Positions enter through the layer's :class:`~pe_bench.adapters.base.LayerEncoding`:
q/k transforms run before SDPA, a bias (if any) is added to the logits. The logit scale
is always 1/sqrt(head_dim) of the *unwidened* head, so an encoding that widens q/k
(PaPE's efficient form) reproduces its bias form exactly.

An encoding whose q/k transform starts with a position-free linear map (``qk_basis``:
STRING's P) may ask the core to fold that map into the q and k projections
(``fold_qk_basis``): the core then projects with M W and M b, computed once per forward,
and tells the encoding through ``AttentionInputs.qk_in_basis`` not to apply M again.

An encoding may also split the queries into groups (``query_groups``, PaPE's
``frame_tile``): each group's queries are then transformed with every key and attended in
their own SDPA call, and the outputs are put back in query order.

Kernels: encodings without a bias run SDPA's fused kernels. A bias encoding that offers a
FlexAttention ``score_mod`` runs on FlexAttention on CUDA where its dense bias would be
large (more than ``DENSE_BIAS_MAX_ELEMENTS``), so no large N x N tensor is stored;
elsewhere the SDPA + dense-bias path runs, and it stays the reference that tests compare
Flex against (``attention_kernel("flex")`` forces Flex, on CPU too, where eager
FlexAttention runs forward only). Attention dropout has no Flex form, so training with
``dropout > 0`` keeps the dense path. A model's layers can be given their own choice
(``set_attention_kernel``, ``trainer.attention_kernel``).

The dense path's memory: a bias that would hold more than ``DENSE_BIAS_CHUNK_ELEMENTS``
(the encoding's ``dense_bias_elements``) is built and attended one chunk of queries at a
time, each chunk with every key, when the encoding's bias can be built for some of the
queries (``LayerEncoding.bias_by_query_chunks``) and the attention is not causal. Each
chunk's bias holds the same values as those rows of the whole bias, and softmax is per
row, so the output is the same function; without autograd (evaluation, the extrapolation
tables, the sweep) only one chunk's bias exists at a time, so memory grows linearly in the
queries instead of as Nq x Nk. This is the path of the bias encodings that have no Flex
form (CoPE, PaPE's and PaPE-RI's positional bias form), and of the others on CPU and
under ``attention_kernel: dense`` (SaPE² excepted: its bias compares two queries).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pe_bench.adapters._flex import make_block_mask, run_flex
from pe_bench.adapters.base import AttentionInputs, LayerEncoding, MaskMod, PositionLayout, ScoreMod

KernelPolicy = Literal["auto", "flex", "dense"]
_KERNEL_POLICIES = ("auto", "flex", "dense")
_kernel_policy: KernelPolicy = "auto"

#: "auto" on CUDA keeps SDPA with the dense bias up to this many bias elements per layer
#: (32 MiB in float32) and runs FlexAttention above. Measured at the two ends, not between:
#: at ViT-B/16 224² (12 x 197² = 0.47M elements, shared by the batch) Flex took 3.1-3.8x
#: nopos's training step on an H200 and the dense bias 1.09-1.23x (alibi, lookhere, relpos;
#: README, "On a GPU"); at 16,384 tokens (3.2G elements) the dense path took 367 ms and 25.9 GB for one
#: layer's forward, Flex 39 ms (issue 16's own ALiBi score_mod) and 129 ms (pe-bench's, on the
#: H200) in nopos's 121 MiB. Where the two cross is `.ci/gpu kernels`' question.
DENSE_BIAS_MAX_ELEMENTS = 2**23
#: the dense path's budget per SDPA call, in elements of the encoding's largest bias tensor
#: (``dense_bias_elements``; 512 MiB in float32): above it the queries are attended in
#: chunks (module doc). ViT-B/16 at 224² stays whole: PaPE's positional bias at batch 128 is
#: 128 x 12 x 197² = 60M elements.
DENSE_BIAS_CHUNK_ELEMENTS = 2**27
_chunk_elements = DENSE_BIAS_CHUNK_ELEMENTS
#: how "auto" resolves on CUDA, as a cell's config.yaml records it (effective.attention_kernel)
AUTO_ON_CUDA = f"flex above {DENSE_BIAS_MAX_ELEMENTS} bias elements, else dense"


@contextlib.contextmanager
def attention_kernel(policy: KernelPolicy) -> Iterator[None]:
    """Choose the bias encodings' kernel inside the block, for every layer: "flex" (Flex
    wherever the encoding offers a score_mod) or "dense" (SDPA with the N x N bias) override
    each layer's own choice (``set_attention_kernel``), as a measurement or a test needs;
    "auto" leaves each layer's own, whose "auto" is Flex on CUDA for large biases."""
    global _kernel_policy
    previous, _kernel_policy = _kernel_policy, check_kernel_policy(policy, "attention_kernel")
    try:
        yield
    finally:
        _kernel_policy = previous


@contextlib.contextmanager
def dense_bias_chunk_elements(elements: int) -> Iterator[None]:
    """The dense path's budget per chunk of queries inside the block (``query_chunks``), in
    place of ``DENSE_BIAS_CHUNK_ELEMENTS``: tests and the conformance check force chunks of
    a few queries on small inputs with it."""
    global _chunk_elements
    if elements < 1:
        raise ValueError(f"dense_bias_chunk_elements: the budget must be at least 1 element, got {elements}")
    previous, _chunk_elements = _chunk_elements, elements
    try:
        yield
    finally:
        _chunk_elements = previous


def check_kernel_policy(policy: str, where: str) -> KernelPolicy:
    if policy not in _KERNEL_POLICIES:
        raise ValueError(f"{where}: the attention kernel must be one of {_KERNEL_POLICIES}, got {policy!r}")
    return policy


def wants_flex(
    device: torch.device, layer_policy: KernelPolicy = "auto", dense_elements: Callable[[], int] | None = None
) -> bool:
    """Whether a bias encoding should take the Flex path for tensors on ``device``: an
    ``attention_kernel`` block's choice, else the layer's own, else ("auto") Flex on CUDA
    when its dense bias would hold more than ``DENSE_BIAS_MAX_ELEMENTS`` (``dense_elements``;
    None: always)."""
    policy = layer_policy if _kernel_policy == "auto" else _kernel_policy
    if policy == "auto":
        return device.type == "cuda" and (dense_elements is None or dense_elements() > DENSE_BIAS_MAX_ELEMENTS)
    return policy == "flex"


def set_attention_kernel(model: nn.Module, policy: KernelPolicy) -> nn.Module:
    """Give every attention layer of ``model`` its own choice of the bias encodings' kernel
    (``trainer.attention_kernel``, ``bench --attention-kernel``); "auto": Flex on CUDA for
    large biases (``wants_flex``). Set before compiling: a compiled graph keeps the kernel it
    was traced with."""
    check_kernel_policy(policy, "set_attention_kernel")
    for module in model.modules():
        if isinstance(module, Attention):
            module.kernel = policy
    return model


def flex_attention_with_masks(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    score_mod: ScoreMod,
    key: PositionLayout,
    causal: bool,
    scale: float,
    mask_mod: MaskMod | None = None,
) -> Tensor:
    """FlexAttention with the encoding's score_mod, key padding, causality and the
    encoding's own mask_mod: what ``attention_mask`` + SDPA compute, without N x N tensors.

    Key padding goes into the score_mod (-inf), so the common padded, non-causal case needs
    no block mask at all; causality (aligned as ``attention_mask``: key j <= query i +
    Nk - Nq) and the encoding's mask go into a block mask, which also skips whole blocks.
    """
    valid = key.valid
    if valid is None:
        scores = score_mod
    else:

        def scores(score: Tensor, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
            return torch.where(valid[b, j], score_mod(score, b, h, i, j), float("-inf"))

    n_q, n_k = q.shape[-2], k.shape[-2]
    masks = []
    if causal:
        offset = n_k - n_q
        masks.append(lambda b, h, i, j: j <= i + offset)
    if mask_mod is not None:
        masks.append(mask_mod)
    block_mask = None
    if masks:
        from torch.nn.attention.flex_attention import and_masks

        combined = masks[0] if len(masks) == 1 else and_masks(*masks)
        batch = None if mask_mod is None else q.shape[0]  # causality alone is the same for every sample
        block_mask = make_block_mask(combined, batch, n_q, n_k, q.device)
    return run_flex(q, k, v, scores, block_mask, scale)


class QueryGroup(NamedTuple):
    """Queries an encoding transforms together: their indices (None: all), q and k after the
    transform, and the inputs restricted to those queries."""

    rows: Tensor | None
    q: Tensor
    k: Tensor
    inputs: AttentionInputs


def group_mask(key: PositionLayout, causal: bool, rows: Tensor, n_q: int) -> Tensor | None:
    """The (B or 1, 1, len(rows), Nk) boolean mask of the queries ``rows`` of Nq: key padding,
    and causality aligned as ``attention_mask``'s (key j <= query i + Nk - Nq)."""
    mask = None if key.valid is None else key.valid[:, None, None, :]
    if causal:
        n_k = key.coords.shape[1]
        allowed = torch.arange(n_k, device=rows.device) <= rows[:, None] + (n_k - n_q)
        mask = allowed[None, None] if mask is None else mask & allowed
    return mask


def attention_mask(
    bias: Tensor | None, key: PositionLayout, causal: bool, n_q: int, dtype: torch.dtype
) -> tuple[Tensor | None, bool]:
    """Combine bias, key padding and causality into SDPA's (attn_mask, is_causal).

    Without a bias the mask stays a broadcastable (B, 1, 1, Nk) boolean, so no N x N
    tensor is built for bias-free encodings.
    """
    key_valid = None if key.valid is None else key.valid[:, None, None, :]
    if bias is None:
        if not causal:
            return key_valid, False
        n_k = key.coords.shape[-2]
        if key_valid is None and n_q == n_k:
            return None, True  # SDPA's is_causal aligns top-left: the same mask only when square
        allowed = torch.ones(n_q, n_k, dtype=torch.bool, device=key.coords.device).tril(n_k - n_q)
        return allowed if key_valid is None else key_valid & allowed, False
    bias = bias.to(dtype)
    if causal:
        n_k = bias.shape[-1]
        future = torch.ones(n_q, n_k, dtype=torch.bool, device=bias.device).triu(n_k - n_q + 1)
        bias = bias.masked_fill(future, float("-inf"))
    if key_valid is not None:
        bias = bias.masked_fill(~key_valid, float("-inf"))
    return bias, False


class Attention(nn.Module):
    """Multi-head attention on ``scaled_dot_product_attention`` with a pluggable encoding.

    Self-attention when called with one layout, cross-attention when ``context`` (keys and
    values) and its ``key`` layout are given.
    """

    #: the bias encodings' kernel for this layer ("auto": Flex on CUDA for large biases);
    #: ``set_attention_kernel`` sets it for a whole model (``trainer.attention_kernel``)
    kernel: KernelPolicy = "auto"

    def __init__(
        self,
        dim: int,
        num_heads: int,
        encoding: LayerEncoding | None = None,
        qkv_bias: bool = True,
        dropout: float = 0.0,
        cross: bool = False,
        context_dim: int | None = None,
    ) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim={dim} must be divisible by num_heads={num_heads}")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.cross = cross
        if cross:
            self.q = nn.Linear(dim, dim, bias=qkv_bias)
            self.kv = nn.Linear(context_dim or dim, 2 * dim, bias=qkv_bias)
        else:
            self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.encoding = encoding
        self.dropout = dropout

    def _heads(self, t: Tensor, blocks: int = 1) -> tuple[Tensor, ...]:
        """The ``blocks`` blocks of heads of a projection's output ``t`` (B, N, blocks * dim),
        each (B, H, N, head_dim), as views of ``t``.

        Split by ``unbind`` of a block dimension, not ``chunk`` of the last one: the backward
        then stacks the blocks' gradients into t's in one pass from whatever layout they
        come in. After ``chunk`` each block's gradient is reshaped to (B, N, dim) first,
        which copies it whenever it is not laid out as one: a slice of a widened head's
        gradient (PaPE's q and k) cost a copy of q's and of k's gradient per layer.
        """
        b, n, _ = t.shape
        heads = t.view(b, n, blocks, self.num_heads, self.head_dim).unbind(2)
        return tuple(h.transpose(1, 2) for h in heads)

    def _project(
        self, x: Tensor, query: PositionLayout, context: Tensor | None, key: PositionLayout | None, causal: bool
    ) -> tuple[Tensor, Tensor, Tensor, AttentionInputs]:
        """q, k (position-transformed), v and the encoding's inputs, all queries at once (an
        encoding that groups its queries, see ``query_groups``, is transformed per group in
        ``transformed_groups``)."""
        q, k, v, inputs = self._raw_heads(x, query, context, key, causal)
        return *self.transform(q, k, inputs), v, inputs

    def transform(self, q: Tensor, k: Tensor, inputs: AttentionInputs) -> tuple[Tensor, Tensor]:
        """The encoding's q/k transform of all queries (identity without an encoding)."""
        return (q, k) if self.encoding is None else self.encoding.transform_qk(q, k, inputs)

    def query_groups(self, inputs: AttentionInputs) -> list[Tensor] | None:
        """The encoding's groups of queries (``LayerEncoding.query_groups``), None: all at once."""
        return None if self.encoding is None else self.encoding.query_groups(inputs)

    def transformed_groups(
        self, x: Tensor, query: PositionLayout, context: Tensor | None, key: PositionLayout | None, causal: bool
    ) -> tuple[list[QueryGroup], Tensor, AttentionInputs]:
        """The position-transformed q and k of every group of queries the encoding transforms
        together (one group, ``rows`` None, unless the encoding's ``query_groups`` splits
        them), v, and the inputs of all queries."""
        q, k, v, inputs = self._raw_heads(x, query, context, key, causal)
        groups = self.query_groups(inputs)
        if groups is None:
            return [QueryGroup(None, *self.transform(q, k, inputs), inputs)], v, inputs
        return [self.transform_group(q, k, inputs, rows) for rows in groups], v, inputs

    def transform_group(self, q: Tensor, k: Tensor, inputs: AttentionInputs, rows: Tensor) -> QueryGroup:
        """The encoding's transform of the queries ``rows`` (of the untransformed q) with every key."""
        part = inputs.for_queries(rows)
        q_rows, k_rows = self.encoding.transform_qk(q[:, :, rows], k, part)
        return QueryGroup(rows, q_rows, k_rows, part)

    def _raw_heads(
        self, x: Tensor, query: PositionLayout, context: Tensor | None, key: PositionLayout | None, causal: bool
    ) -> tuple[Tensor, Tensor, Tensor, AttentionInputs]:
        """q, k, v split into heads (no position transform yet) and the encoding's inputs."""
        folds = self.encoding is not None and self.encoding.fold_qk_basis(x.device)
        basis = self.encoding.forward_qk_basis(query) if folds else None
        if self.cross:
            if context is None or key is None:
                raise ValueError("cross-attention needs context tokens and their key layout")
            (q,) = self._heads(self._project_in_basis(self.q, x, basis, "q"))
            k, v = self._heads(self._project_in_basis(self.kv, context, basis, "kv"), blocks=2)
        else:
            context, key = x, query
            q, k, v = self._heads(self._project_in_basis(self.qkv, x, basis, "qkv"), blocks=3)
        inputs = AttentionInputs(x_q=x, x_k=context, query=query, key=key, causal=causal, qk_in_basis=basis is not None)
        return q, k, v, inputs

    def _project_in_basis(self, linear: nn.Linear, x: Tensor, basis: Tensor | None, blocks: str) -> Tensor:
        """``linear(x)``, whose output is the blocks of heads ``blocks`` names ("qkv", "q" or
        "kv"), with the encoding's ``qk_basis`` M (None: none) folded into the weight and bias
        rows of the q and k heads: those come out as M times ``linear(x)``'s, v's as they are.
        The fold is one batched product of every head's (E x E) map with its (E x D) rows (the
        identity for v's, which is exact), in the weights' dtype even under autocast, so the
        folded weights are rounded to 16 bits once, as plain weights are; it replaces an
        (E x E) product per token of q and of k."""
        if basis is None:
            return linear(x)
        weight, bias = linear.weight, linear.bias
        heads = (len(blocks), self.num_heads, self.head_dim)
        with torch.autocast(weight.device.type, enabled=False):
            m = basis.to(weight.dtype).expand(self.num_heads, -1, -1)
            identity = torch.eye(self.head_dim, dtype=weight.dtype, device=weight.device).expand_as(m)
            maps = torch.stack([identity if block == "v" else m for block in blocks])  # (blocks, H, E, E)
            weight = (maps @ weight.unflatten(0, heads)).flatten(0, 2)
            if bias is not None:
                bias = (maps @ bias.unflatten(0, (*heads, 1))).flatten()
        return F.linear(x, weight, bias)

    def _bias(self, q: Tensor, k: Tensor, inputs: AttentionInputs) -> Tensor | None:
        return None if self.encoding is None else self.encoding.bias(q, k, inputs)

    def _flex_score_mod(self, q: Tensor, k: Tensor, inputs: AttentionInputs) -> ScoreMod | None:
        """The encoding's score_mod when the Flex path should run, else None."""
        if self.encoding is None or (self.training and self.dropout > 0):
            return None
        if not wants_flex(q.device, self.kernel, lambda: self.encoding.dense_bias_elements(q, k, inputs)):
            return None
        return self.encoding.score_mod(q, k, inputs)

    def forward(
        self,
        x: Tensor,
        query: PositionLayout,
        context: Tensor | None = None,
        key: PositionLayout | None = None,
        causal: bool = False,
    ) -> Tensor:
        q, k, v, inputs = self._raw_heads(x, query, context, key, causal)
        groups = self.query_groups(inputs)
        if groups is not None:
            return self._merge_heads(self._grouped_attention(q, k, v, inputs, groups))
        q, k = self.transform(q, k, inputs)
        score_mod = self._flex_score_mod(q, k, inputs)
        if score_mod is not None:
            mask_mod = self.encoding.mask_mod(inputs)
            scale = 1.0 / math.sqrt(self.head_dim)
            out = flex_attention_with_masks(q, k, v, score_mod, inputs.key, causal, scale, mask_mod)
            return self._merge_heads(out)
        chunks = self.query_chunks(q, k, inputs)
        if chunks is not None:
            return self._merge_heads(self._chunked_bias_attention(q, k, v, inputs, chunks))
        bias = self._bias(q, k, inputs)
        mask, is_causal = attention_mask(bias, inputs.key, causal, q.shape[-2], q.dtype)
        return self._merge_heads(self._sdpa(q, k, v, mask, is_causal))

    def query_chunks(self, q: Tensor, k: Tensor, inputs: AttentionInputs) -> list[slice] | None:
        """Consecutive chunks of queries whose dense bias stays within the budget each
        (``DENSE_BIAS_CHUNK_ELEMENTS``, or ``dense_bias_chunk_elements``'s; at least one query
        per chunk), or None: the bias is small or absent, or the encoding builds its bias for
        all queries at once, or the attention is causal (an encoding aligns its own causal
        mask by the shapes it sees: a chunk's queries would be taken for the last ones)."""
        if self.encoding is None or inputs.causal or not self.encoding.bias_by_query_chunks:
            return None
        elements, n_q = self.encoding.dense_bias_elements(q, k, inputs), q.shape[-2]
        if elements <= _chunk_elements or n_q == 1:
            return None
        size = max(1, _chunk_elements * n_q // elements)
        return [slice(start, min(start + size, n_q)) for start in range(0, n_q, size)]

    # Eager even inside a compiled model (a graph break): a few hundred chunks per layer, as
    # evaluation at a large grid makes, would unroll into the graph and its compilation, and at
    # these sizes a chunk's N x Nk work dwarfs its launches.
    @torch.compiler.disable
    def _chunked_bias_attention(
        self, q: Tensor, k: Tensor, v: Tensor, inputs: AttentionInputs, chunks: list[slice]
    ) -> Tensor:
        """SDPA with the encoding's dense bias, one chunk of queries (``query_chunks``) at a
        time: (B, H, Nq, head_dim), the function of the whole bias. The chunks share one
        ``key_memo`` (``shared_by_query_chunks``): what the encoding builds from the keys
        alone is built once per call, not once per chunk (PaPE's key features and their
        pieces for the positional bias's product: at 65,536 tokens, 385 chunks each of which
        would rebuild 12 x 65,536 x 606 bf16 pieces)."""
        inputs, outs = replace(inputs, key_memo={}), []
        for rows in chunks:
            q_rows = q[:, :, rows]
            bias = self.encoding.bias(q_rows, k, inputs.for_queries(rows))
            mask, _ = attention_mask(bias, inputs.key, False, q_rows.shape[-2], q.dtype)
            outs.append(self._sdpa(q_rows, k, v, mask, False))
        return torch.cat(outs, dim=2)

    def _sdpa(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool) -> Tensor:
        """SDPA with the logit scale of the unwidened head; (B, H, Nq, head_dim)."""
        if v.shape[-1] != q.shape[-1] and q.device.type != "cuda":
            # Widened q/k (PaPE): the fused CPU kernels need equal q/k/v widths and otherwise
            # fall back to the math kernel, which materialises N x N. Zero columns in v keep
            # the fused path; they are sliced off the output again. CUDA's cuDNN and
            # memory-efficient kernels take a narrower v, which saves the padded PV product.
            v = F.pad(v, (0, q.shape[-1] - v.shape[-1]))
        return F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            dropout_p=self.dropout if self.training else 0.0,
            is_causal=is_causal,
            scale=1.0 / math.sqrt(self.head_dim),
        )[..., : self.head_dim]

    def _grouped_attention(
        self, q: Tensor, k: Tensor, v: Tensor, inputs: AttentionInputs, groups: list[Tensor]
    ) -> Tensor:
        """One SDPA call per group of queries (``query_groups``), every key in each, outputs
        back in query order. Each group is transformed just before its call, so without
        autograd only one group's transformed keys exist at a time. Grouping encodings have
        no bias, so only padding and causality mask."""
        n_q, outs = q.shape[-2], []
        for rows in groups:
            group = self.transform_group(q, k, inputs, rows)
            if self.encoding.bias(group.q, group.k, group.inputs) is not None:
                raise NotImplementedError(f"{type(self.encoding).__name__}: query groups with a bias")
            mask = group_mask(inputs.key, inputs.causal, rows, n_q)
            outs.append(self._sdpa(group.q, group.k, v, mask, False))
        return torch.cat(outs, dim=2)[:, :, torch.argsort(torch.cat(groups))]

    def _merge_heads(self, out: Tensor) -> Tensor:
        b, _, n, _ = out.shape
        return self.proj(out.transpose(1, 2).reshape(b, n, -1))

    def logits(
        self,
        x: Tensor,
        query: PositionLayout,
        context: Tensor | None = None,
        key: PositionLayout | None = None,
        causal: bool = False,
    ) -> Tensor:
        """Pre-softmax logits (B, H, Nq, Nk), masked entries -inf: for analysis and tests.

        This builds the N x N matrix explicitly; training never calls it.
        """
        groups, _, inputs = self.transformed_groups(x, query, context, key, causal)
        if groups[0].rows is None:
            return self._masked_logits(groups[0].q, groups[0].k, inputs)
        n_q, parts = inputs.query.coords.shape[1], []
        for group in groups:
            scores = (group.q @ group.k.transpose(-1, -2)) / math.sqrt(self.head_dim)
            mask = group_mask(inputs.key, inputs.causal, group.rows, n_q)
            parts.append(scores if mask is None else scores.masked_fill(~mask, float("-inf")))
        order = torch.cat([group.rows for group in groups])
        return torch.cat(parts, dim=2)[:, :, torch.argsort(order)]

    def _masked_logits(self, q: Tensor, k: Tensor, inputs: AttentionInputs) -> Tensor:
        """q . k / sqrt(head_dim) plus the encoding's bias, with padding and causality as -inf."""
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        n_q = q.shape[-2]
        mask, is_causal = attention_mask(self._bias(q, k, inputs), inputs.key, inputs.causal, n_q, scores.dtype)
        if is_causal:
            n_k = scores.shape[-1]
            mask = torch.ones(n_q, n_k, dtype=torch.bool, device=scores.device).tril(n_k - n_q)
        if mask is None:
            return scores
        if mask.dtype == torch.bool:
            return scores.masked_fill(~mask, float("-inf"))
        return scores + mask
