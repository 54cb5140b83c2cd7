"""The hold-out studies build, and the README's "Unseen placements" tables are the shipped study
records (results/reference-studies): per encoding, mean ± std over seeds 0-2 of the best
validation score (seen configurations) and the test score (unseen ones), each cell measured to
have no test configuration in its training set."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
import torch

from pe_bench.harness.config import load_run_config, load_study
from pe_bench.tasks.base import get_task

ROOT = Path(__file__).resolve().parents[2]
STUDIES = ROOT / "results" / "reference-studies"

#: (records folder, task, what each cell records of its overlap, the table's header[, seeds])
TABLES = [
    ("unseen-placements-stop66", "imagenet", "test_placements_seen_in_training",
     "| Position encoding | validation, seen placements | test, unseen placements | seen − unseen |"),
    ("unseen-paths-stop67", "dvsgesture", "test_paths_seen_in_training",
     "| Position encoding | validation, seen paths | test, unseen paths | seen − unseen |"),
    ("unseen-paths-ucf101-stop68", "ucf101", "test_paths_seen_in_training",
     "| Position encoding | validation, seen paths (5×5) | test, unseen paths (5×5) | seen − unseen |"),
    ("unseen-paths-ucf101-80epochs-stop69", "ucf101", "test_paths_seen_in_training",
     "| Position encoding | validation, seen paths (5×5, 80 epochs) | test, unseen paths (5×5, 80 epochs) "
     "| seen − unseen |"),
    ("unseen-paths-ucf101-diagnostics-stop69", "ucf101", "test_paths_seen_in_training",
     "| Position encoding (stop 69) | validation, seen paths (5×5) | test, unseen paths (5×5) | seen − unseen |"),
    ("unseen-paths-ucf101-paired-init-stop70", "ucf101", "test_paths_seen_in_training",
     "| Position encoding (stop 70, `model.paired_init`, seeds 0-5) | validation, seen paths (5×5) "
     "| test, unseen paths (5×5) | seen − unseen |", range(6)),
    ("unseen-marker-cells-stop67", "coco", "test_objects_seen_in_training",
     "| Position encoding | validation, seen marker cells | test, unseen marker cells | seen − unseen |"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("study", "task", "option", "relative", "absolute"),
    [
        ("unseen-placements", "imagenet", "held_out_pairs", "rope", "abspos"),
        ("unseen-paths", "dvsgesture", "held_out_paths", "rope", "sincos"),
        ("unseen-paths-ucf101", "ucf101", "held_out_paths", "rope", "sincos"),
        ("unseen-marker-cells", "coco", "held_out_marker_cells", "rope", "abspos"),
    ],
)
def test_each_study_holds_a_quarter_out_on_the_tiny_profile(study, task, option, relative, absolute) -> None:
    study_spec = load_study(study)
    assert study_spec.tasks == [task] and {relative, absolute} <= set(study_spec.methods)
    configured = get_task(task)(load_run_config(task, "tiny", study_spec.overrides["tiny"]))
    assert getattr(configured.data, option) == 0.25


def _mean_std(values: list[float]) -> str:
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


def _table_rows(header: str) -> list[tuple[str, str, str, str]]:
    """(method, validation, test, gap) of each row of the one README table headed ``header``;
    a method in backticks is given without them."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert readme.count(header) == 1, f"the README has {readme.count(header)} tables headed {header}"
    rows = readme[readme.index(header) :].split("\n\n")[0].splitlines()[2:]
    cells = [tuple(cell.strip() for cell in row.strip("|").split("|")) for row in rows]
    return [(method.strip("`"), val, test, gap) for method, val, test, gap in cells]


def _assert_row_is_the_records(row: tuple[str, str, str, str], records: list[dict], recorded: str) -> None:
    """A table row is its records' mean ± std of validation and test, the test per seed, and the gap;
    every record finished with no test configuration seen in training."""
    method, val, test, gap = row
    assert all(r["status"] == "ok" and r["extra"][recorded] == 0.0 for r in records), method
    vals, tests = [r["best_val"] for r in records], [r["score"] for r in records]
    per_seed = " / ".join(f"{score:.1f}" for score in tests)
    assert (val, test) == (_mean_std(vals), f"{_mean_std(tests)} ({per_seed})"), method
    assert gap == f"{round(statistics.mean(vals) - statistics.mean(tests), 2) + 0.0:.2f}", method  # no -0.00


def _records(folder: str, method: str, seeds=range(3), task: str = "ucf101") -> list[dict]:
    runs = STUDIES / folder / "runs" / task / method
    return [json.loads((runs / f"seed{seed}" / "result.json").read_text()) for seed in seeds]


def _same_scores(these: list[dict], those: list[dict]) -> bool:
    """Whether two lists of records hold the same scores, best validations and best epochs."""
    keys = ("score", "best_val", "best_epoch")
    return [[r[k] for k in keys] for r in these] == [[r[k] for k in keys] for r in those]


def _flat_readme() -> str:
    """The README with every run of whitespace one space (quoted phrases may wrap)."""
    return " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())


@pytest.mark.parametrize("table", TABLES, ids=[t[0] for t in TABLES])
def test_readme_unseen_table_is_the_shipped_records(table: tuple) -> None:
    folder, task, recorded, header, seeds = (*table, range(3))[:5]
    rows = _table_rows(header)
    runs = STUDIES / folder / "runs" / task
    assert sorted(row[0] for row in rows) == sorted(p.name for p in runs.iterdir())
    for row in rows:
        _assert_row_is_the_records(row, _records(folder, row[0], seeds, task), recorded)


def test_ucf101_80_epoch_cells_trained_80_epochs() -> None:
    """The table says 80 epochs: every cell of that folder planned and ran them."""
    for method in ("pape", "cape"):
        assert all(
            r["epochs_planned"] == 80 == r["epochs_run"]
            for r in _records("unseen-paths-ucf101-80epochs-stop69", method)
        )


@pytest.mark.parametrize("method", ["abspos", "rope-mixed"])
def test_ucf101_rerun_reproduces_stop_68(method: str) -> None:
    """The README: stop 69's re-run of stop 68's cells gave the same test scores to the last digit."""
    assert _same_scores(
        _records("unseen-paths-ucf101-stop68", method), _records("unseen-paths-ucf101-diagnostics-stop69", method)
    )


def test_abspos_confusion_counts_are_the_shipped_matrices() -> None:
    """The README's counts of abspos's wrong answers on unseen paths are the shipped confusion
    matrices summed over seeds 0-2, and each matrix's accuracy is its cell's recorded score."""
    import pandas as pd

    folder = STUDIES / "unseen-paths-ucf101-diagnostics-stop69"
    matrices = [pd.read_csv(folder / "confusion/ucf101/abspos" / f"seed{s}.csv", index_col=0) for s in range(3)]
    for matrix, record in zip(matrices, _records(folder.name, "abspos"), strict=True):
        assert 100.0 * matrix.to_numpy().trace() / matrix.to_numpy().sum() == pytest.approx(record["score"], abs=1e-3)
    total = sum(matrices)
    orbits = ["orbit-cw", "orbit-ccw"]
    lines = [name for name in total.index if name not in orbits]
    assert (total.loc[lines, orbits].to_numpy().sum(), total.loc[lines].to_numpy().sum()) == (837, 900)
    own = total.loc[orbits, orbits].to_numpy().trace()
    other = total.loc["orbit-cw", "orbit-ccw"] + total.loc["orbit-ccw", "orbit-cw"]
    assert (own, other, total.loc[orbits, lines].to_numpy().sum()) == (40, 125, 135)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "837 of the 900" in readme and "40 get their own class, 125 the other sense, 135 a straight one" in readme


def test_orbit_classes_cover_most_places_in_training() -> None:
    """The README's coverage: the (tubelet, cell) places the seen paths of each class visit on
    the study's 5x5 grid with 3 tubelets (the split every cell of the study uses)."""
    from pe_bench.tasks._shared.motion import MOTIONS, class_paths, split_paths

    seen, _ = split_paths(len(MOTIONS), 5, 3, 0.25)
    covered = {
        name: len({(t, cell) for path in class_paths(label, 5, 3) if path in seen for t, cell in enumerate(path)})
        for label, name in enumerate(MOTIONS)
    }
    assert covered == {"right": 33, "left": 33, "down": 33, "up": 33, "down-right": 21, "up-left": 21,
                       "orbit-cw": 70, "orbit-ccw": 69}  # fmt: skip
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "on 70 and 69 of the 75 (tubelet,\ncell) places (a straight class's on 33, a diagonal's on 21)" in readme


#: stop 70's six-seed table of RoPE-Mixed's frames: each row's records for seeds 0-2 and 3-5
FRAMES = "unseen-paths-ucf101-frames-stop70"
LATER_SEEDS = "unseen-paths-ucf101-seeds3to5-stop70"
AXIS_FRAMES = "rope-mixed[random_frame=false]"
AXIAL_ROPE_LAYER = "rope-mixed[random_frame=false,learn_frequencies=false,base=100]"
SIX_SEEDS = {
    "rope": FRAMES,
    AXIS_FRAMES: FRAMES,
    AXIAL_ROPE_LAYER: FRAMES,
    "rope-mixed": "unseen-paths-ucf101-stop68",
}
SIX_SEEDS_HEADER = (
    "| Position encoding (stop 70, seeds 0-5) | validation, seen paths (5×5) | test, unseen paths (5×5) "
    "| seen − unseen |"
)


def _six_seed_records(method: str) -> list[dict]:
    return _records(SIX_SEEDS[method], method) + _records(LATER_SEEDS, method, (3, 4, 5))


def test_readme_six_seed_frames_table_is_the_shipped_records() -> None:
    rows = _table_rows(SIX_SEEDS_HEADER)
    assert sorted(row[0] for row in rows) == sorted(SIX_SEEDS)
    assert sorted(p.name for p in (STUDIES / LATER_SEEDS / "runs" / "ucf101").iterdir()) == sorted(SIX_SEEDS)
    for row in rows:
        _assert_row_is_the_records(row, _six_seed_records(row[0]), "test_paths_seen_in_training")


def test_frames_rerun_reproduces_stop_68_rope() -> None:
    assert _same_scores(_records("unseen-paths-ucf101-stop68", "rope"), _records(FRAMES, "rope"))


def test_readme_frame_comparisons_are_the_records() -> None:
    """The README's paired and unpaired comparisons over seeds 0-5, recomputed from the records."""
    from scipy import stats

    scores = {method: [r["score"] for r in _six_seed_records(method)] for method in SIX_SEEDS}
    paired = [a - b for a, b in zip(scores[AXIS_FRAMES], scores["rope-mixed"], strict=True)]
    assert all(d > 0 for d in paired)
    frame_p = stats.ttest_rel(scores[AXIS_FRAMES], scores["rope-mixed"]).pvalue
    same_function_p = stats.ttest_ind(scores["rope"], scores[AXIAL_ROPE_LAYER], equal_var=False).pvalue
    rope_wins = sum(a > b for a, b in zip(scores["rope"], scores[AXIAL_ROPE_LAYER], strict=True))
    readme = _flat_readme()
    quoted = [
        f"{statistics.mean(paired):.2f} points on average, more on every seed "
        f"({' / '.join(f'{d:.2f}' for d in paired)}; paired t-test p = {frame_p:.3f})",
        f"Welch's t-test p = {same_function_p:.3f}",
        f"rope scores higher on {rope_wins} of the 6 seeds",
    ]  # fmt: skip
    for text in quoted:
        assert text in readme, text


def test_axial_rope_layer_trains_as_rope_on_the_study_model() -> None:
    """The README: with rope's weights, the study's ucf101 model with the rope-equivalent RoPE-Mixed
    layer gives rope's logits to 1.5e-5 and one training batch's loss and gradients to 1e-6."""
    from pe_bench.adapters.registry import EncodingFactory

    config = load_run_config("ucf101", "tiny", load_study("unseen-paths-ucf101").overrides["tiny"])
    task = get_task("ucf101")(config)
    torch.manual_seed(0)
    rope = task.build_model(EncodingFactory("rope"))
    layer = task.build_model(
        EncodingFactory("rope-mixed", {"random_frame": False, "learn_frequencies": False, "base": 100.0})
    )
    missing, unexpected = layer.load_state_dict(rope.state_dict(), strict=False)
    assert not unexpected and all(key.endswith("encoding.frequencies") for key in missing) and missing
    data = task.datamodule(0)
    data.setup("fit")
    clips, labels = next(iter(data.train_dataloader()))
    with torch.no_grad():
        logits = rope.eval()(clips)
        assert (layer.eval()(clips) - logits).abs().max() < 1.5e-5 < 1e-3 * logits.abs().max()
    losses = []
    for model in (rope.train(), layer.train()):
        loss = torch.nn.functional.cross_entropy(model(clips), labels)
        loss.backward()
        losses.append(loss.item())
    assert abs(losses[0] - losses[1]) < 1e-6
    grads = dict(layer.named_parameters())
    assert max((p.grad - grads[k].grad).abs().max().item() for k, p in rope.named_parameters()) < 1e-6


def test_rope_mixed_confusion_counts_are_the_shipped_matrices() -> None:
    """The README's rope-mixed misses per seed and the unseen paths per class on the 5x5 grid."""
    import pandas as pd

    from pe_bench.tasks._shared.motion import MOTIONS, class_paths, split_paths

    folder = STUDIES / "unseen-paths-ucf101-diagnostics-stop69"
    matrices = [pd.read_csv(folder / "confusion/ucf101/rope-mixed" / f"seed{s}.csv", index_col=0) for s in range(3)]
    for matrix, record in zip(matrices, _records(folder.name, "rope-mixed"), strict=True):
        assert 100.0 * matrix.to_numpy().trace() / matrix.to_numpy().sum() == pytest.approx(record["score"], abs=1e-3)
    assert (matrices[1].loc["down", "down-right"], matrices[1].loc["up", "orbit-ccw"]) == (36, 25)
    assert matrices[2].loc["down", "left"] == 38
    assert all(matrix.loc[name].sum() == 50 for matrix in matrices for name in MOTIONS)
    _, unseen = split_paths(len(MOTIONS), 5, 3, 0.25)
    per_class = [sum(path in unseen for path in class_paths(label, 5, 3)) for label in range(len(MOTIONS))]
    assert per_class == [4, 4, 4, 4, 2, 2, 18, 18]
    readme = _flat_readme()
    assert (
        "seed 1 calls 36 of 50 down clips down-right and 25 of 50 up clips orbit-ccw, seed 2 calls 38 of 50" in readme
    )


PAIRED = "unseen-paths-ucf101-paired-init-stop70"


def test_paired_cells_were_trained_paired_and_rope_repeats_its_unpaired_cells() -> None:
    """Every cell of the paired folder asked for ``model.paired_init``; rope draws no initial
    values, so paired it trains exactly as unpaired: the same scores to the last digit."""
    import yaml

    runs = STUDIES / PAIRED / "runs" / "ucf101"
    for config in runs.glob("*/seed*/config.yaml"):
        assert yaml.safe_load(config.read_text())["model"]["paired_init"] is True, config
    assert _same_scores(_records(PAIRED, "rope", range(6)), _six_seed_records("rope"))


def test_readme_paired_comparisons_are_the_records() -> None:
    """The README's paired figures: rope against rope-mixed and against the rope-equivalent
    layer (the score's noise floor), the two runs' first and second epochs at seed 0, and the
    float32 frequencies that are all that tells that layer from rope."""
    from scipy import stats

    from pe_bench.adapters.base import geometric_frequencies
    from pe_bench.adapters.rope_mixed import mixed_frequencies

    runs = STUDIES / PAIRED / "runs" / "ucf101"
    scores = {m: [r["score"] for r in _records(PAIRED, m, range(6))] for m in ("rope", "rope-mixed", AXIAL_ROPE_LAYER)}
    readme = _flat_readme()
    for method, label in (("rope-mixed", "rope-mixed loses"), (AXIAL_ROPE_LAYER, "yet it loses")):
        losses = [a - b for a, b in zip(scores["rope"], scores[method], strict=True)]
        p = stats.ttest_rel(scores["rope"], scores[method]).pvalue
        quoted = f"{statistics.mean(losses):.2f}"
        per_seed = " / ".join(f"{d + 0.0:.2f}" for d in losses)
        assert f"{label} {quoted}" in readme and f"({per_seed}; " in readme and f"p = {p:.3f}" in readme, method
    losses = {
        m: [float(line.split(",")[1]) for line in (runs / m / "seed0" / "metrics.csv").read_text().splitlines()[1:3]]
        for m in ("rope", AXIAL_ROPE_LAYER)
    }
    assert losses["rope"][0] == losses[AXIAL_ROPE_LAYER][0] and losses["rope"][1] != losses[AXIAL_ROPE_LAYER][1]
    assert f"second is not ({losses[AXIAL_ROPE_LAYER][1]!r} against {losses['rope'][1]!r})" in readme
    assert f"rope's to the last digit ({losses['rope'][0]!r})" in readme
    mixed = mixed_frequencies(1, 3, 2, 100.0, rotate=False)[0, 0, :2]
    gap = (mixed - geometric_frequencies(2, 100.0)).abs().max().item()
    assert 7e-9 < gap < 8e-9 and "0.1 and 0.1 + 7.5e-9 at this task's 2 levels per axis" in readme


def test_readme_twelve_paired_seeds_are_the_records() -> None:
    import yaml
    from scipy import stats

    folder = "unseen-paths-ucf101-paired-init-seeds6to11-stop70"
    later = STUDIES / folder / "runs" / "ucf101"
    assert sorted(p.name for p in later.iterdir()) == ["rope", "rope-mixed"]

    def scores(method: str) -> list[float]:
        first, rest = _records(PAIRED, method, range(6)), _records(folder, method, range(6, 12))
        assert all(r["status"] == "ok" and r["extra"]["test_paths_seen_in_training"] == 0.0 for r in rest)
        assert all(yaml.safe_load((later / method / f"seed{s}" / "config.yaml").read_text())["model"]["paired_init"]
                   for s in range(6, 12))  # fmt: skip
        return [r["score"] for r in first + rest]

    rope, mixed = scores("rope"), scores("rope-mixed")
    losses = [a - b for a, b in zip(rope, mixed, strict=True)]
    p = stats.ttest_rel(rope, mixed).pvalue
    readme = _flat_readme()
    for method, values in (("rope", rope), ("rope-mixed", mixed)):
        assert f"{method} {' / '.join(f'{v:.1f}' for v in values[6:])}" in readme, method
    assert f"rope scores {_mean_std(rope)} and rope-mixed {_mean_std(mixed)}" in readme
    assert f"rope-mixed loses {statistics.mean(losses):.2f} (p = {p:.3f})" in readme
    assert (sum(d > 0 for d in losses), sum(d < 0 for d in losses)) == (8, 3)
