"""One rule for "was this cell trained the same way?", shared by the grid runner and the tables."""

from __future__ import annotations

from pe_bench.harness.config import load_run_config
from pe_bench.harness.config_diff import ABSENT, config_differences, field_default
from pe_bench.harness.grid.methods import parse_method
from pe_bench.harness.grid.runner import cell_setup, option_differences, resolved_config, stored_config_differences
from pe_bench.harness.reports import tables


def _cell(task: str = "coco", **optim) -> dict:
    config = load_run_config(task, "tiny", {"optim": optim} if optim else None)
    return resolved_config(config, parse_method("rope"), {})


def test_field_defaults_come_from_the_tasks_own_schema():
    assert field_default("coco", "model.neck_kernel") == 3  # the detection model config's field
    assert field_default("imagenet", "model.neck_kernel") is ABSENT  # no such field for a ViT
    assert field_default("coco", "optim.table_lr_scale") == 1.0
    assert field_default("coco", "trainer.logger") == ["csv"]
    assert field_default("coco", "model.dim") is ABSENT  # required: it has no default
    assert field_default("coco", "data.image_size") is ABSENT  # free-form section


def test_a_field_missing_from_an_older_file_counts_unless_the_other_side_has_its_default():
    current = _cell()
    assert current["model"]["neck_kernel"] == 1  # the tiny profile sets the field away from its default
    older = _cell()
    del older["model"]["neck_kernel"]  # as written before the field existed: those cells ran with 3x3
    expected = [("model.neck_kernel", ABSENT, 1)]
    assert config_differences("coco", older, current) == expected
    del older["optim"]["label_smoothing"]  # at its default in the profile: no change
    assert config_differences("coco", older, current) == expected
    del older["optim"]["table_lr_scale"]  # the profile sets 30: cells from before the field ran at 1
    assert config_differences("coco", older, current) == [*expected, ("optim.table_lr_scale", ABSENT, 30.0)]


def test_runner_and_tables_agree_on_every_case():
    """The same pairs give the same differing keys in both places (each formats them its own way)."""
    base = _cell()
    cases = []
    unknown = _cell()
    unknown["model"]["retired_someday"] = 5  # neither a current field nor a known retired key
    cases.append(unknown)
    worker = _cell()
    worker["trainer"]["num_workers"] = 4
    cases.append(worker)
    logger = _cell()
    logger["trainer"]["logger"] = ["csv", "tensorboard"]
    cases.append(logger)
    retired = _cell()
    retired["optim"]["positional_lr_scale"] = 1.0
    cases.append(retired)
    missing = _cell()
    del missing["model"]["class_kernel"]
    cases.append(missing)
    for stored in cases:
        runner_keys = [line.split(":")[0] for line in stored_config_differences(stored, base)]
        table_keys = [
            line.split("=")[0]
            for line in tables.config_differences("coco", tables.result_config(stored), tables.result_config(base))
        ]
        assert runner_keys == table_keys
    found = [[line.split(":")[0] for line in stored_config_differences(c, base)] for c in cases]
    assert found == [["model.retired_someday"], ["trainer.num_workers"], [], [], ["model.class_kernel"]]


def test_a_default_the_code_changed_is_a_difference_where_both_files_hold_resolved_options():
    """Reuse: ``options`` as given are equal ({}), the resolved ones differ in a default; a file
    from before ``resolved_options`` existed cannot say and is not refused for it."""
    current = _cell()
    assert current["options"] == {} and current["resolved_options"]["base"] == 100.0
    older_code = {**current, "resolved_options": {**current["resolved_options"], "base": 10.0}}
    assert stored_config_differences(older_code, current) == ["resolved_options.base: 10.0 stored, 100.0 requested"]
    assert option_differences(older_code, current) == ["resolved_options.base: 10.0 stored, 100.0 requested"]
    before = {k: v for k, v in current.items() if k != "resolved_options"}
    assert stored_config_differences(before, current) == [] and option_differences(before, current) == []
    config, factory = cell_setup(current)  # a cell is rebuilt from its options as given
    assert factory.options == {} and config.task == "coco"
