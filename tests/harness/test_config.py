"""Typed configs: bad keys and values are errors that name the key; overrides merge."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pe_bench.harness.config import ConfigError, load_run_config, parse_overrides
from pe_bench.harness.grid.methods import parse_method, parse_methods
from pe_bench.tasks import get_task


def test_profiles_of_every_task_validate():
    for task in ("imagenet", "cifar10", "cifar100"):
        for profile in ("tiny", "paper"):
            config = load_run_config(task, profile)
            get_task(task)(config)  # data section validated by the task


def test_paper_profile_carries_table_8_imagenet_column():
    config = load_run_config("imagenet", "paper")
    assert (config.model.dim, config.model.depth, config.model.num_heads, config.model.patch_size) == (768, 12, 12, 16)
    assert config.optim.lr == 0.0006 and config.optim.batch_size == 1024 and config.optim.epochs == 300
    assert config.optim.warmup_epochs == 15 and config.optim.label_smoothing == 0.1
    assert config.model.drop_path == 0.1 and config.model.head_init == "zero"


def test_unknown_key_is_named():
    with pytest.raises(ConfigError, match=r"imagenet/tiny: optim\.lrr"):
        load_run_config("imagenet", "tiny", parse_overrides(["optim.lrr=0.1"]))


def test_bad_value_is_named():
    with pytest.raises(ConfigError, match=r"model\.depth"):
        load_run_config("imagenet", "tiny", parse_overrides(["model.depth=deep"]))


def test_bad_data_key_is_named_by_the_task():
    config = load_run_config("imagenet", "tiny", parse_overrides(["data.image_sise=32"]))
    with pytest.raises(ConfigError, match=r"data: image_sise"):
        get_task("imagenet")(config)


def test_overrides_are_parsed_as_yaml_scalars():
    config = load_run_config("imagenet", "tiny", parse_overrides(["optim.epochs=2", "model.dim=32"]))
    assert config.optim.epochs == 2 and config.model.dim == 32


def test_unknown_profile():
    with pytest.raises(ConfigError, match="no profile 'huge'"):
        load_run_config("imagenet", "huge")


def test_method_specs_with_options():
    spec = parse_method("pape[m=8,form=explicit]")
    assert spec.name == "pape" and dict(spec.options) == {"m": 8, "form": "explicit"}
    labels = [m.label for m in parse_methods("rope,pape[m=2,linear=false],nopos")]
    assert labels == ["rope", "pape[m=2,linear=false]", "nopos"]
    from pe_bench.adapters import available

    expanded = [m.label for m in parse_methods("rope,all,pape[m=2]")]
    assert expanded == ["rope", *[n for n in available() if n != "rope"], "pape[m=2]"]


def test_method_options_may_be_lists():
    """Commas inside a value's [...] belong to it: one method, two options."""
    (spec,) = parse_methods("cape[coordinate_scale=[0.3,0.3,0.02],max_scale=1.2]")
    assert dict(spec.options) == {"coordinate_scale": [0.3, 0.3, 0.02], "max_scale": 1.2}
    assert {spec} == {spec}  # hashable although a value is a list (cells are keyed by it)
    with pytest.raises(ValueError, match=r"option coordinate_scale=\[0.3, -1\]: must be a number > 0"):
        parse_method("cape[coordinate_scale=[0.3,-1]]")


def test_with_options_writes_a_spec_that_parses_back():
    """MethodSpec.with_options: the label a user would type, validated, options in order."""
    assert parse_method("pape[m=8]").with_options(space="position").label == "pape[m=8,space=position]"
    assert parse_method("pape").with_options(space="projected").label == "pape[space=projected]"
    spec = parse_method("cape[coordinate_scale=[0.3,0.3,0.02]]").with_options(max_scale=1.2)
    assert spec.label == "cape[coordinate_scale=[0.3,0.3,0.02],max_scale=1.2]"
    assert parse_method(spec.label) == spec and dict(spec.options)["coordinate_scale"] == [0.3, 0.3, 0.02]
    replaced = parse_method("pape[m=8,form=explicit]").with_options(m=2)
    assert dict(replaced.options) == {"m": 2, "form": "explicit"}
    with pytest.raises(ValueError, match="space"):  # validated: a bad value names its option
        parse_method("pape").with_options(space="polar")


_SCALARS = st.one_of(
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.booleans(),
    st.none(),
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz_0123456789.", min_size=1, max_size=8),
)


_OPTION_NAMES = st.from_regex(r"[a-z_]{1,8}", fullmatch=True)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(_OPTION_NAMES, st.one_of(_SCALARS, st.lists(_SCALARS, max_size=4)), max_size=4))
def test_method_label_round_trips_through_the_spec_reader(options):
    """Every value a label carries reads back as itself: numbers YAML would read as strings
    (1e-05), words it would read as booleans or null ('yes', 'null') and lists included."""
    import yaml

    from pe_bench.harness.grid.methods import method_label, split_top_level

    label = method_label("enc", options)
    assert " " not in label  # a label is also a directory name
    pairs = split_top_level(label[len("enc[") : -1]) if options else []
    read = {key: yaml.safe_load(raw) for key, _, raw in (pair.partition("=") for pair in pairs)}
    assert read == options


def test_every_task_profile_brings_off_grid_positions_to_capes_range():
    """CAPE maps images to [-1, 1] (cape.txt Eq. 3-4); off the grid, raw units (metres, 2 cm
    voxels, 50 ms steps) span many of its wavelengths and its global scale scrambles them. Every
    profile of a task with off-grid positions therefore sets coordinate_scale (one number, or one
    per axis, which must match the task's axes), or the paper's own units (speech: freq_scale)."""
    from pe_bench.adapters import build
    from pe_bench.tasks import implemented

    checked = 0
    for task in implemented():
        for profile in ("tiny", "paper"):
            config = load_run_config(task, profile)
            geometry = get_task(task)(config).geometry()
            options = (config.methods or {}).get("cape", {})
            build("cape", geometry, 32, 4, 1, options)  # validates the values and their axis count
            if geometry.grid_shape is None:
                assert "coordinate_scale" in options or "freq_scale" in options, f"{task}/{profile}"
                checked += 1
    assert checked >= 10  # dvsgesture, gen1, modelnet40, scannet, nuscenes: tiny and paper


def test_bad_method_option_names_the_key():
    with pytest.raises(ValueError, match="mm"):
        parse_method("pape[mm=8]")


def test_unknown_method_lists_names_and_close_match():
    with pytest.raises(KeyError) as info:
        parse_method("roppe")
    message = str(info.value)
    assert "Did you mean 'rope'?" in message and "pape" in message and "nopos" in message


def test_trainer_threads_must_be_positive():
    from pe_bench.harness.config import load_run_config

    assert load_run_config("imagenet", "tiny", {"trainer": {"threads": 1}}).trainer.threads == 1
    with pytest.raises(ConfigError, match="imagenet/tiny: trainer.threads"):
        load_run_config("imagenet", "tiny", {"trainer": {"threads": 0}})


def test_studies_are_valid_method_grids():
    from pe_bench.harness.config import load_study, studies

    assert {"pape-ablation", "pape-m"} <= set(studies())
    ablation = load_study("pape-ablation")
    specs = parse_methods(",".join(ablation.methods))
    assert [dict(s.options) for s in specs][1:] == [
        {"quadratic": False}, {"linear": False}, {"context": False}, {"softplus": False}, {"project": False},
    ]  # fmt: skip
    assert ablation.overrides["paper"]["optim"]["epochs"] == 150  # ViT-S, 150 epochs (PaPE Section 5.4)
    assert [dict(s.options)["m"] for s in parse_methods(",".join(load_study("pape-m").methods))] == [
        2,
        4,
        8,
        16,
        32,
        64,
    ]
    with pytest.raises(ConfigError, match="unknown study"):
        load_study("nope")


@pytest.mark.parametrize("profile", ["tiny", "paper"])
def test_univit_study_overrides_build_valid_image_tasks(profile):
    from pe_bench.harness.config import load_run_config, load_study
    from pe_bench.tasks.base import get_task

    study = load_study("univit")
    task = get_task("imagenet")(load_run_config("imagenet", profile, study.overrides[profile]))
    assert len(task.data.train_sides) >= 3 and task.data.tta_delta > 0
    assert task.data.image_size in task.data.train_sides  # the nominal size is one of the training sizes


def test_run_help_lists_every_shipped_study(capsys):
    from pe_bench.harness.cli import main
    from pe_bench.harness.config import studies

    with pytest.raises(SystemExit):
        main(["run", "--help"])
    help_text = re.sub(r"-\s+", "-", " ".join(capsys.readouterr().out.split()))  # argparse wraps at hyphens
    assert "unseen-paths" in studies()
    for name in studies():
        assert name in help_text, f"pe-bench run --help does not name the study {name}"
