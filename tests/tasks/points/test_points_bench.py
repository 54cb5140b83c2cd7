"""``pe-bench bench --task scannet --compile``: the training-step table that tells whether
``trainer.compile`` pays on the point backbones (measured on a GPU; here its CPU form)."""

from __future__ import annotations

import re

from pe_bench.tasks.points.bench import compile_table
from pe_bench.tasks.points.task import ModelNet40


def test_compile_table_times_each_variant_after_its_compilation():
    table = compile_table(ModelNet40, "cpu", sizes=(400,), profile="tiny", variants=("eager", "per block"))
    rows = {line.split("|")[1].strip(): line.split("|")[2:-1] for line in table.splitlines() if line.startswith("| ")}
    assert set(rows) == {"variant", "eager", "per block"}
    eager_graphs, eager_seconds = (cell.strip() for cell in rows["eager"])
    block_graphs, block_seconds = (cell.strip() for cell in rows["per block"])
    assert eager_graphs == "0"
    # the tiny backbone's 3 blocks: a static graph, then a dynamic one once the point count
    # changes, at most 2 per block, all before the timed steps (a timed step that still
    # compiled would say "(recompiled)" and fail the pattern below)
    assert 1 <= int(block_graphs) <= 6
    for seconds in (eager_seconds, block_seconds):
        assert re.fullmatch(r"\d+\.\d{3}", seconds), table
