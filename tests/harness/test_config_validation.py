"""Values that cannot work stop the grid before it starts, with one line naming the key.

Before these checks each of them passed validation and then failed inside every cell (or,
for pydantic's raw errors, printed its text with a URL)."""

from __future__ import annotations

import typing

import pytest

from pe_bench.harness.cli import main
from pe_bench.harness.config import ConfigError, load_run_config, parse_overrides
from pe_bench.harness.grid.methods import parse_method
from pe_bench.tasks import get_task, implemented


@pytest.mark.parametrize(
    ("override", "line"),
    [
        ("optim.lr=-1", "imagenet/tiny: optim.lr: Input should be greater than 0, got -1"),
        ("optim.epochs=0", "imagenet/tiny: optim.epochs: Input should be greater than or equal to 1, got 0"),
        ("optim.batch_size=0", "imagenet/tiny: optim.batch_size: Input should be greater than or equal to 1, got 0"),
        ("model.dim=63", "imagenet/tiny: model.dim=63 is not divisible by model.num_heads=4"),
        ("trainer.precision=bogus", "imagenet/tiny: trainer.precision: Input should be 'auto', "),
    ],
)
def test_impossible_run_values_are_config_errors_naming_the_key(override, line):
    with pytest.raises(ConfigError) as err:
        load_run_config("imagenet", "tiny", parse_overrides([override]))
    message = str(err.value)
    assert message.startswith(line) and "\n" not in message and "pydantic" not in message


def test_image_size_must_hold_whole_patches():
    config = load_run_config("imagenet", "tiny", parse_overrides(["data.image_size=25"]))
    with pytest.raises(ConfigError, match=r"^imagenet/tiny: data.image_size=25 is not divisible by model.patch_size=4"):
        get_task("imagenet")(config)


def test_every_precision_lightning_accepts_is_accepted_and_ints_read_from_yaml_too():
    from lightning.fabric.plugins.precision.precision import _PRECISION_INPUT_STR, _PRECISION_INPUT_STR_ALIAS

    for precision in (*typing.get_args(_PRECISION_INPUT_STR), *typing.get_args(_PRECISION_INPUT_STR_ALIAS)):
        assert load_run_config("imagenet", "tiny", {"trainer": {"precision": precision}}).trainer.precision == precision
    assert load_run_config("imagenet", "tiny", parse_overrides(["trainer.precision=32"])).trainer.precision == "32"


@pytest.mark.parametrize("name", implemented())
@pytest.mark.parametrize("profile", ["tiny", "paper"])
def test_shipped_profiles_pass_the_new_bounds(name, profile):
    get_task(name)(load_run_config(name, profile))


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("pape[m=-1]", "pape[m=-1]: option m=-1: Input should be greater than or equal to 1"),
        ("pape[m=0]", "pape[m=0]: option m=0: Input should be greater than or equal to 1"),
        ("pape[m=abc]", "pape[m=abc]: option m='abc': Input should be a valid integer"),
        ("cape[max_scale=0.5]", "cape[max_scale=0.5]: option max_scale=0.5: Input should be greater than or equal"),
        ("string-circulant[block_size=2]", "string-circulant[block_size=2]: option block_size=2"),
    ],
)
def test_method_option_values_out_of_range_name_spec_key_and_value(spec, expected):
    with pytest.raises(ValueError) as err:
        parse_method(spec)
    message = str(err.value)
    assert message.startswith(expected) and "errors.pydantic.dev" not in message


def test_unknown_method_option_lists_the_valid_ones_and_a_close_match():
    with pytest.raises(ValueError) as err:
        parse_method("pape[mm=3]")
    message = str(err.value)
    assert message.startswith("pape[mm=3]: unknown option 'mm'; options of pape: m, form, ")
    assert message.endswith("(did you mean 'm'?)") and "pad_to" in message and "https://" not in message


def test_cli_stops_before_the_grid_with_one_line(tmp_path, capsys):
    base = ["run", "--tasks", "imagenet", "--out", str(tmp_path)]
    assert main([*base, "--methods", "pape[m=0]"]) == 2
    assert main([*base, "--methods", "rope", "--set", "model.dim=63"]) == 2
    assert main([*base, "--methods", "rope", "--set", "data.image_size=25"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "error: pape[m=0]: option m=0: Input should be greater than or equal to 1",
        "error: imagenet/tiny: model.dim=63 is not divisible by model.num_heads=4",
        "error: imagenet/tiny: data.image_size=25 is not divisible by model.patch_size=4; use e.g. 24 or 28",
    ]
    assert not (tmp_path / "runs").exists()  # no cell was started, so none was recorded as failed


@pytest.mark.parametrize("seeds", ["-1", "0,-2"])
def test_negative_seeds_are_rejected_by_the_cli(seeds, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--tasks", "imagenet", "--methods", "rope", f"--seeds={seeds}"])
    assert exit_.value.code == 2
    assert "--seeds expects non-negative integers" in capsys.readouterr().err


def test_label_smoothing_on_a_loss_without_it_is_an_error(tmp_path):
    """CTC, detection, segmentation and nuScenes losses never read optim.label_smoothing: a
    nonzero value would be stored as a setting the cell never trained with."""
    for task in ("wsj", "coco", "scannet", "nuscenes"):
        with pytest.raises(ConfigError, match=f"{task}'s loss has no label smoothing: set it to 0"):
            get_task(task)(load_run_config(task, "tiny", {"optim": {"label_smoothing": 0.1}}), tmp_path)
    for task in ("imagenet", "modelnet40", "wmt14-en-de"):  # cross-entropies: accepted
        get_task(task)(load_run_config(task, "tiny", {"optim": {"label_smoothing": 0.1}}), tmp_path)
