"""``model.paired_init``: encodings draw their initial values from a stream of their own, so at
one seed every encoding's backbone starts from the same weights (adapters/init_stream.py)."""

from __future__ import annotations

import pytest
import torch

from pe_bench.adapters.init_stream import encoding_draws, encoding_stream_seed, paired_initialisation
from pe_bench.adapters.registry import EncodingFactory
from pe_bench.harness.config import ConfigError, load_run_config
from pe_bench.harness.grid.runner import model_parts
from pe_bench.tasks.base import get_task

#: encodings that draw random initial values (frames, projections, tables) and ones that draw none
METHODS = ["nopos", "rope", "rope-mixed", "pape", "abspos", "string-cayley", "cape", "relpos", "alibi", "sincos"]


def _task(paired: bool):
    config = load_run_config("ucf101", "tiny", {"model": {"paired_init": paired}})
    return get_task("ucf101")(config)


def _built(method: str, paired: bool, seed: int = 3) -> tuple[dict[str, torch.Tensor], float]:
    """The model's backbone weights (every parameter not of the encoding) built as a cell builds
    it, and the global generator's next number after the build."""
    torch.manual_seed(seed)
    task = _task(paired)
    with paired_initialisation(seed) if paired else torch.random.fork_rng(devices=[]):
        model = task.build_model(EncodingFactory(method))
        after = torch.rand(()).item()
    backbone = {k: v.detach().clone() for k, v in model.state_dict().items() if "encoding." not in k}
    return backbone, after


def test_paired_backbones_start_from_the_same_weights() -> None:
    reference, reference_after = _built("nopos", paired=True)
    for method in METHODS[1:]:
        backbone, after = _built(method, paired=True)
        assert backbone.keys() == reference.keys(), method
        for key, value in reference.items():
            torch.testing.assert_close(backbone[key], value, rtol=0, atol=0, msg=f"{method}: {key}")
        assert after == reference_after, method  # training's draws start from the same state too


def test_unpaired_backbones_differ_where_the_encoding_draws() -> None:
    """The default (every shipped record): drawing encodings shift the weights after them, so the
    test above could fail."""
    nopos, _ = _built("nopos", paired=False)
    rope, _ = _built("rope", paired=False)
    mixed, _ = _built("rope-mixed", paired=False)
    assert all(torch.equal(rope[k], v) for k, v in nopos.items())  # rope draws nothing
    assert not all(torch.equal(mixed[k], v) for k, v in nopos.items())


def test_paired_encodings_are_seeded_and_deterministic() -> None:
    def frames(seed: int) -> torch.Tensor:
        torch.manual_seed(seed)
        with paired_initialisation(seed):
            model = _task(True).build_model(EncodingFactory("rope-mixed"))
        return model.encoder.blocks[0].attn.encoding.frequencies.detach().clone()

    torch.testing.assert_close(frames(3), frames(3), rtol=0, atol=0)
    assert not torch.equal(frames(3), frames(4))
    # layers get different frames: the stream moves on between make_layer calls
    torch.manual_seed(3)
    with paired_initialisation(3):
        model = _task(True).build_model(EncodingFactory("rope-mixed"))
    blocks = model.encoder.blocks
    assert not torch.equal(blocks[0].attn.encoding.frequencies, blocks[1].attn.encoding.frequencies)


def test_outside_paired_initialisation_nothing_changes() -> None:
    torch.manual_seed(5)
    with encoding_draws():
        inside = torch.rand(3)
    torch.manual_seed(5)
    torch.testing.assert_close(inside, torch.rand(3), rtol=0, atol=0)
    assert encoding_stream_seed(0) != 0 and encoding_stream_seed(0) != encoding_stream_seed(1)


def test_model_parts_reads_the_option() -> None:
    """A cell with ``model.paired_init`` builds the paired model; the option is validated."""
    paired, _ = _built("rope-mixed", paired=True, seed=2)
    model, _, _ = model_parts(_task(True), EncodingFactory("rope-mixed"), 2)
    for key, value in paired.items():
        torch.testing.assert_close(model.state_dict()[key], value, rtol=0, atol=0)
    with pytest.raises(ConfigError, match="paired_init"):
        load_run_config("ucf101", "tiny", {"model": {"paired_init": "sometimes"}})


def test_tables_tell_paired_cells_from_unpaired_ones() -> None:
    """A paired cell is another configuration than the shipped (unpaired) records, which lack
    the key; an explicit false is the same configuration as theirs."""
    from pe_bench.harness.config_diff import config_differences

    assert [key for key, *_ in config_differences("ucf101", {"model": {"paired_init": True}}, {"model": {}})] == [
        "model.paired_init"
    ]
    assert config_differences("ucf101", {"model": {"paired_init": False}}, {"model": {}}) == []
