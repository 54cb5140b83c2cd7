"""The points tasks' typed model section: PTv3's stage structure is ``model.ptv3``."""

from __future__ import annotations

import pytest

from pe_bench.harness.config import ConfigError, ModelConfig, RunConfig, load_run_config, parse_overrides
from pe_bench.tasks import get_task
from pe_bench.tasks.points.ptv3 import PTv3Config
from pe_bench.tasks.points.task import PointsModelConfig

# The stage structures the profiles resolved to when they lived under data.backbone.
PROFILE_STAGES = {
    ("modelnet40", "tiny"): ([1, 1, 1], [32, 64, 128], [2, 4, 8], 3),
    ("modelnet40", "paper"): ([2, 2, 2, 6, 2], [32, 64, 128, 256, 512], [2, 4, 8, 16, 32], 5),
    ("scannet", "tiny"): ([1, 1, 1, 1], [32, 64, 96, 128], [2, 4, 6, 8], 3),
    ("scannet", "paper"): ([2, 2, 2, 6, 2], [32, 64, 128, 256, 512], [2, 4, 8, 16, 32], 5),
}
SCANNET_DECODERS = {
    "tiny": ([1, 1, 1], [48, 64, 96], [3, 4, 6]),
    "paper": ([2, 2, 2, 2], [64, 64, 128, 256], [4, 4, 8, 16]),
}


@pytest.mark.parametrize(("name", "profile"), sorted(PROFILE_STAGES))
def test_profiles_resolve_to_the_same_stage_structure(name, profile):
    config = load_run_config(name, profile)
    task = get_task(name)(config)
    ptv3 = config.model.ptv3
    assert isinstance(config.model, PointsModelConfig) and isinstance(ptv3, PTv3Config)
    assert (ptv3.enc_depths, ptv3.enc_channels, ptv3.enc_num_head, ptv3.stem_kernel) == PROFILE_STAGES[name, profile]
    if name == "scannet":
        assert (ptv3.dec_depths, ptv3.dec_channels, ptv3.dec_num_head) == SCANNET_DECODERS[profile]
    assert "backbone" not in config.data and not hasattr(task.data, "backbone")


def test_a_bad_ptv3_key_is_named_when_the_config_loads():
    with pytest.raises(ConfigError, match=r"scannet/tiny: model\.ptv3\.enc_depth: Extra inputs"):
        load_run_config("scannet", "tiny", parse_overrides(["model.ptv3.enc_depth=[1]"]))
    with pytest.raises(ConfigError, match=r"imagenet/tiny: model\.ptv3: Extra inputs"):
        load_run_config("imagenet", "tiny", parse_overrides(["model.ptv3.cpe=none"]))


def test_overrides_reach_the_backbone():
    config = load_run_config("scannet", "tiny", parse_overrides(["model.ptv3.cpe=none"]))
    assert config.model.ptv3.cpe == "none"
    assert config.model_dump(mode="json")["model"]["ptv3"]["cpe"] == "none"  # what config.yaml stores


def test_a_config_built_without_the_points_model_section_is_refused():
    plain = load_run_config("imagenet", "tiny").model
    config = RunConfig(task="modelnet40", profile="tiny", model=ModelConfig(**plain.model_dump()), optim={
        "lr": 0.1, "epochs": 1, "batch_size": 1,
    })  # fmt: skip
    with pytest.raises(ConfigError, match="needs a PointsModelConfig"):
        get_task("modelnet40")(config)
