"""The nuscenes task: profiles, configuration errors, the optional devkit, one short cell."""

from __future__ import annotations

import sys
import time
import types

import numpy as np
import pytest
from PIL import Image

from pe_bench.harness.config import ConfigError, load_run_config
from pe_bench.harness.data import DatasetMissingError
from pe_bench.harness.grid import store
from pe_bench.harness.grid.methods import parse_method
from pe_bench.harness.grid.runner import GridRequest, run_cell
from pe_bench.tasks import get_task, resolve_tasks
from pe_bench.tasks._shared.data_checks import scan_files
from pe_bench.tasks.nuscenes.devkit import check_sample_file
from pe_bench.tasks.nuscenes.task import NuScenesModelConfig


@pytest.mark.parametrize("profile", ["tiny", "paper"])
def test_profiles_load(profile):
    config = load_run_config("nuscenes", profile)
    task = get_task("nuscenes")(config)
    assert isinstance(config.model, NuScenesModelConfig)
    assert config.model.depth == config.model.unitr.intra_depth + config.model.unitr.inter_depth
    assert task.geometry().pos_dim == 3 and not task.geometry().is_grid


def test_paper_profile_follows_pape_table_8():
    config = load_run_config("nuscenes", "paper")
    optim, data = config.optim, config.data
    assert (optim.optimizer, optim.lr, optim.weight_decay, optim.betas) == ("adam", 0.003, 0.03, (0.9, 0.99))
    assert (optim.epochs, optim.warmup_epochs, optim.batch_size) == (10, 1, 3)
    assert tuple(data["image_size"]) == (704, 256) and config.model.patch_size == 8


def test_nuscenes_is_no_longer_skipped_by_its_groups():
    skipped = []
    assert "nuscenes" in resolve_tasks("pape-table1", warn=skipped.append)
    assert not any("nuscenes" in message for message in skipped)


def test_inconsistent_configs_are_named():
    with pytest.raises(ConfigError, match=r"model\.depth=5 but model\.unitr has 1 intra-modal \+ 2 inter-modal"):
        get_task("nuscenes")(load_run_config("nuscenes", "tiny", {"model": {"depth": 5}}))
    with pytest.raises(ConfigError, match=r"image_size 100x48 is not a multiple of model\.patch_size=8"):
        get_task("nuscenes")(load_run_config("nuscenes", "tiny", {"data": {"image_size": [100, 48]}}))
    # The evaluation refuses a sample with more than the devkit's 500 predictions: said before training.
    with pytest.raises(ConfigError, match=r"max_detections=501, but .* at most 500 predictions per sample"):
        get_task("nuscenes")(load_run_config("nuscenes", "paper", {"model": {"head": {"max_detections": 501}}}))


def test_paper_data_without_the_devkit_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "nuscenes", None)  # import fails as if not installed
    task = get_task("nuscenes")(load_run_config("nuscenes", "paper"), tmp_path)
    with pytest.raises(ImportError, match="pip install --no-deps nuscenes-devkit"):
        task.check_data()


def test_paper_data_missing_names_the_folder(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "nuscenes", types.ModuleType("nuscenes"))
    task = get_task("nuscenes")(load_run_config("nuscenes", "paper"), tmp_path)
    with pytest.raises(DatasetMissingError, match=str(tmp_path / "nuscenes" / "v1.0-trainval")):
        task.check_data()


def test_generated_data_has_nothing_to_check():
    report = get_task("nuscenes")(load_run_config("nuscenes", "tiny")).check_data(full=True)
    assert report.ok and report.checked == 0 and "generated" in report.notes[0]


def test_sample_files_are_checked(tmp_path):
    good_bin, bad_bin, bad_jpg, good_jpg = (tmp_path / n for n in ("a.pcd.bin", "b.pcd.bin", "c.jpg", "d.jpg"))
    np.zeros((7, 5), dtype=np.float32).tofile(good_bin)
    np.zeros(7, dtype=np.float32).tofile(bad_bin)
    bad_jpg.write_bytes(b"not a jpeg")
    Image.new("RGB", (4, 4)).save(good_jpg)
    files = [str(p) for p in (good_bin, bad_bin, bad_jpg, good_jpg, tmp_path / "gone.jpg")]
    broken = dict(scan_files(files, check_sample_file))
    assert set(broken) == {str(bad_bin), str(bad_jpg), str(tmp_path / "gone.jpg")}
    assert "5-float points" in broken[str(bad_bin)] and broken[str(tmp_path / "gone.jpg")] == "missing"


SHORT = {
    "data": {"train_size": 8, "val_size": 4, "test_size": 4},
    "optim": {"epochs": 1, "batch_size": 4},
    "trainer": {"threads": 1},
}


def test_one_short_cell_end_to_end(tmp_path):
    request = GridRequest(tasks=["nuscenes"], methods=[], out=tmp_path, overrides=SHORT)
    start = time.perf_counter()
    record = run_cell(request, "nuscenes", parse_method("pape-ri"), seed=0)
    assert time.perf_counter() - start < 60
    assert record.status == store.STATUS_OK, record.reason
    assert 0.0 <= record.score <= 100.0 and record.metric == "map"
    assert set(record.extra) >= {"ap_red", "ap_green", "ap_blue", "nds", "ate", "ase", "aoe", "ave", "aae"}
    assert 0.0 <= record.extra["nds"] <= 80.0  # %; at most 80 with velocity and attributes not predicted
    assert record.extra["ave"] == record.extra["aae"] == 1.0 and record.extra["not_predicted"] == ["ave", "aae"]
    na = run_cell(request, "nuscenes", parse_method("lookhere"), seed=0)
    assert na.status == store.STATUS_NA and "3-D" in na.reason
