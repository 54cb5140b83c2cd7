"""One attention layer with 3-D positions: operators and MiB written by a bf16 training step
with the rotation tables padded to the head's width (today's rope.py) against the form before
stop 50, which sliced the unrotated channels off and concatenated them back (reproduced here).

    .venv/bin/python benchmarks/cpu-string-basis-2026-11-27/rotation_3d.py
"""

import torch

from pe_bench.adapters import Geometry, PositionLayout, build, rope
from pe_bench.harness.attention import Attention
from pe_bench.harness.reports.op_count import OperatorCounter


def sliced_pair_tables(cos, sin, width):
    """Before stop 50: tables for the 2F rotated channels only."""
    return rope.RotationTables(cos.repeat_interleave(2, dim=-1), torch.stack([-sin, sin], dim=-1).flatten(-2))


def sliced_rotate(t, tables):
    """Before stop 50: rotate the first 2F channels, concatenate the rest back."""
    rotated = tables.cos.shape[-1]
    head = t if rotated == t.shape[-1] else t[..., :rotated]
    swapped = head.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)
    out = head * tables.cos + swapped * tables.sin
    return out if rotated == t.shape[-1] else torch.cat([out, t[..., rotated:]], dim=-1)


def training_step(name: str, batch: int = 8, tokens: int = 1024) -> tuple[int, float]:
    torch.manual_seed(0)
    encoding = build(name, Geometry(pos_dim=3), 768, 12, depth=1)
    attention = Attention(768, 12, encoding.make_layer(0)).train()
    coords = torch.randn(1, tokens, 3).expand(batch, -1, -1)
    layout = PositionLayout(coords=coords, has_pos=torch.ones(1, tokens, dtype=torch.bool).expand(batch, -1))
    x = torch.randn(batch, tokens, 768, requires_grad=True)
    with OperatorCounter() as counter:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = attention(x, layout).float().sum()
        loss.backward()  # outside autocast, as a mixed-precision trainer runs it
    return counter.total, counter.total_written / 2**20


if __name__ == "__main__":
    padded = rope.pair_tables, rope.rotate
    operators, mib = training_step("nopos")
    print(f"nopos: {operators} operators, {mib:.0f} MiB")
    for name in ("rope", "rope-mixed"):
        rope.pair_tables, rope.rotate = padded
        now = training_step(name)
        rope.pair_tables, rope.rotate = sliced_pair_tables, sliced_rotate
        before = training_step(name)
        print(f"{name}: {before[0]} -> {now[0]} operators, {before[1]:.0f} -> {now[1]:.0f} MiB")
    rope.pair_tables, rope.rotate = padded
