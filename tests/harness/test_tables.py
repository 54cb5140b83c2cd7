"""The result matrix: mean ± std, best bold, next-best underlined, n/a, lower-is-better; seeds
held out of those asked for, cells of another configuration, incomplete cells, statistics."""

from __future__ import annotations

import csv
import math
import shutil
import subprocess

import pytest
import yaml
from scipy import stats

from pe_bench.harness.grid import store
from pe_bench.harness.reports import tables
from pe_bench.harness.reports.tables import matrix, render, write_tables


@pytest.fixture(autouse=True)
def _no_task_imports(monkeypatch):
    """The tiny footnote imports every task module; it is checked once, in its own test."""
    monkeypatch.setattr(tables, "_tiny_footnote", lambda tasks: "tiny profile: small stand-ins.")


def rec(task, method, seed, score, status="ok", higher=True, label="Acc. (%)"):
    return store.CellRecord(
        task=task, method=method, seed=seed, profile="tiny", status=status, metric="acc",
        metric_label=label, higher_is_better=higher, score=score,
    )  # fmt: skip


def config(task, method, **sections):
    """A resolved cell config as the runner writes it; ``sections`` replace keys per section."""
    tree = {
        "task": task,
        "profile": "tiny",
        "model": {"dim": 64, "depth": 4, "num_heads": 4},
        "optim": {"lr": 0.002, "epochs": 2, "betas": [0.9, 0.999]},
        "trainer": {"precision": "auto", "num_workers": 0, "threads": 1},
        "data": {"image_size": 24, "train_size": 3000},
        "methods": {"pape": {"m": 8}},
        "method": method,
        "encoding": method.split("[")[0],
        "options": {},
    }
    for section, changes in sections.items():
        tree[section] = {**tree[section], **changes} if isinstance(tree[section], dict) else changes
    return tree


def stored(out, task, method, seed, score, status="ok", higher=True, label="Acc. (%)", cfg=None, **sections):
    """A cell on disk: result.json, and config.yaml for a finished one (``cfg=False``: none)."""
    directory = store.cell_dir(out, task, method, seed)
    store.write_record(directory, rec(task, method, seed, score, status, higher, label))
    if status == store.STATUS_OK and cfg is not False:
        (directory / "config.yaml").write_text(yaml.safe_dump(cfg or config(task, method, **sections)))
    return directory


def read_csv(out):
    with (out / "table.csv").open() as handle:
        return {(row["task"], row["method"]): row for row in csv.DictReader(handle)}


def test_mean_std_bold_and_underline():
    records = [
        rec("imagenet", "pape", 0, 90.0), rec("imagenet", "pape", 1, 92.0),
        rec("imagenet", "rope", 0, 85.0), rec("imagenet", "rope", 1, 87.0),
        rec("imagenet", "nopos", 0, 12.0), rec("imagenet", "nopos", 1, 14.0),
    ]  # fmt: skip
    text = render(records)
    assert "**91.00 ± 1.41**" in text
    assert "<u>86.00 ± 1.41</u>" in text
    assert "13.00 ± 1.41" in text and "**13.00" not in text and "<u>13.00" not in text
    latex = render(records, "latex")
    assert r"\textbf{91.00 $\pm$ 1.41}" in latex and r"\underline{86.00 $\pm$ 1.41}" in latex and "toprule" in latex


def test_lower_is_better_columns_rank_ascending_and_stay_out_of_the_average():
    records = [
        rec("wsj", "pape", 0, 20.0, higher=False, label="WER (%)"),
        rec("wsj", "rope", 0, 30.0, higher=False, label="WER (%)"),
        rec("wsj", "nopos", 0, 60.0, higher=False, label="WER (%)"),
        rec("imagenet", "pape", 0, 80.0), rec("imagenet", "rope", 0, 90.0), rec("imagenet", "nopos", 0, 10.0),
    ]  # fmt: skip
    text = render(records)
    assert "**20.00**" in text and "<u>30.00</u>" in text
    means, _, _ = matrix(records)
    assert means.loc["rope", "Average"] == 90.0  # only higher-is-better columns are averaged
    assert "wsj WER (%) ↓" in text


def test_not_applicable_failed_and_diverged_cells_say_which():
    records = [
        rec("imagenet", "pape", 0, 80.0), rec("imagenet", "pape", 1, 81.0),
        rec("imagenet", "lookhere", 0, None, status="n/a"), rec("imagenet", "lookhere", 1, None, status="n/a"),
        rec("imagenet", "rope", 0, None, status="failed"), rec("imagenet", "rope", 1, None, status="failed"),
        rec("imagenet", "alibi", 0, None, status="diverged"), rec("imagenet", "alibi", 1, None, status="diverged"),
    ]  # fmt: skip
    text = render(records)
    assert "| n/a " in text
    assert "failed (0/2)" in text and "diverged (0/2)" in text
    means, _, _ = matrix(records)
    assert means["Average"].isna()["lookhere"]


def test_cells_printed_alike_are_emphasised_alike():
    """90.035 prints 90.03 (its binary value lies below the .xx5), while pandas' round gives
    90.04: both cells read 90.03 and must both be bold (one was bold, one underlined)."""
    records = [rec("imagenet", "a", 0, 90.035), rec("imagenet", "b", 0, 90.03), rec("imagenet", "c", 0, 80.0)]
    assert f"{90.035:.2f}" == "90.03"
    text = render(records, significance=False)
    assert text.count("**90.03**") == 4 and "<u>80.00</u>" in text  # the column and the Average


def test_tables_written_from_stored_cells_only(tmp_path):
    stored(tmp_path, "imagenet", "pape", 0, 70.0)
    stored(tmp_path, "imagenet", "rope", 0, 60.0)
    markdown = write_tables(tmp_path)
    assert "**70.00**" in markdown and "tiny profile" in markdown
    for name in ("table.md", "table.tex", "table.csv"):
        assert (tmp_path / name).stat().st_size > 0
    header = (tmp_path / "table.csv").read_text().splitlines()[0]
    assert header.split(",") == tables.SUMMARY_COLUMNS == [
        "task", "method", "metric", "higher_is_better", "mean", "std", "n", "asked", "failed", "diverged",
        "status", "config_ok", "wide_spread", "ci_low", "ci_high", "p_vs_best", "cut_short",
    ]  # fmt: skip
    assert read_csv(tmp_path)[("imagenet", "pape")]["mean"] == "70.0"


def test_a_cell_with_missing_seeds_shows_them_and_is_never_ranked_above_complete_ones(tmp_path):
    for seed, (pape, rope) in enumerate([(90.0, 85.0), (92.0, 87.0), (91.0, 86.0)]):
        stored(tmp_path, "imagenet", "pape", seed, pape)
        stored(tmp_path, "imagenet", "rope", seed, rope)
    stored(tmp_path, "imagenet", "sincos", 0, 99.6)  # the best number, from one seed of three
    stored(tmp_path, "imagenet", "sincos", 1, None, status="diverged")
    stored(tmp_path, "imagenet", "sincos", 2, None, status="diverged")
    markdown = write_tables(tmp_path)
    assert "| 99.60 (1/3) " in markdown and "**99.60" not in markdown and "<u>99.60" not in markdown
    assert "**91.00 ± 1.00**" in markdown and "<u>86.00 ± 1.00</u>" in markdown
    assert "imagenet/sincos 2 diverged" in markdown
    assert "a cell with missing seeds (held/asked) or another configuration (†) is never marked" in markdown
    assert "3 seed(s) asked for in every task (0, 1, 2)" in markdown
    latex = (tmp_path / "table.tex").read_text()
    assert "99.60 (1/3)" in latex and r"\textbf{99.60" not in latex and r"\underline{99.60" not in latex
    row = read_csv(tmp_path)[("imagenet", "sincos")]
    assert (row["n"], row["asked"], row["failed"], row["diverged"], row["status"]) == ("1", "3", "0", "2", "partial")


def test_a_stored_nan_score_is_no_finished_seed(tmp_path):
    """A record that holds a NaN score (older versions stored one) counts as a diverged seed:
    pandas' mean would skip it while the cell read complete, ranked and bold."""
    for seed, (pape, rope) in enumerate([(90.0, 80.0), (91.0, 81.0), (math.nan, 79.0)]):
        stored(tmp_path, "imagenet", "pape", seed, pape)
        stored(tmp_path, "imagenet", "rope", seed, rope)
    markdown = write_tables(tmp_path, ci=0.95)
    assert "| 90.50 ± 6.35 (2/3) " in markdown and "Missing seeds: imagenet/pape 1 diverged." in markdown
    assert "nan" not in markdown.lower()
    row = read_csv(tmp_path)[("imagenet", "pape")]
    assert (row["n"], row["diverged"], row["status"]) == ("2", "1", "partial")


def test_seeds_asked_for_are_those_of_any_method_of_the_task(tmp_path):
    for seed in (0, 1, 2):
        stored(tmp_path, "imagenet", "pape", seed, 90.0 + seed)
    stored(tmp_path, "imagenet", "rope", 0, 80.0)  # seeds 1 and 2 never ran
    stored(tmp_path, "coco", "rope", 5, 30.0)  # another task asks for its own seeds
    stored(tmp_path, "coco", "pape", 5, 31.0)
    markdown = write_tables(tmp_path)
    assert "80.00 (1/3)" in markdown and "imagenet/rope 2 not run or left out" in markdown
    assert "imagenet 3 (0, 1, 2); coco 1 (5)" in markdown or "coco 1 (5); imagenet 3 (0, 1, 2)" in markdown
    assert "**31.00**" in markdown
    assert tables.asked_seeds(tables.load_results(tmp_path)) == {"coco": [5], "imagenet": [0, 1, 2]}


def test_a_cell_of_another_configuration_is_marked_and_named(tmp_path):
    for method, score in (("pape", 80.0), ("rope", 75.0), ("sincos", 70.0)):
        stored(tmp_path, "imagenet", method, 0, score)
    stored(tmp_path, "imagenet", "alibi", 0, 85.0, model={"depth": 2})
    # Another tracker and the method's own options: the same setting.
    trainer = {"precision": "auto", "num_workers": 0, "threads": 1, "logger": ["csv", "wandb"]}
    stored(tmp_path, "imagenet", "nopos", 0, 10.0, trainer=trainer, options={"x": 1})
    stored(tmp_path, "wsj", "rope", 0, 20.0, higher=False, label="WER (%)", optim={"epochs": 9})  # its own task
    stored(tmp_path, "wsj", "pape", 0, 25.0, higher=False, label="WER (%)", optim={"epochs": 9})
    markdown = write_tables(tmp_path)
    assert "| 85.00 † " in markdown and "**85.00" not in markdown
    assert "**80.00**" in markdown and "<u>75.00</u>" in markdown
    assert "imagenet/alibi/seed0: model.depth=2 (others: 4)" in markdown
    assert "nopos" not in markdown.split("†", 2)[-1] and "wsj/" not in markdown  # only alibi differs
    assert "**20.00**" in markdown
    rows = read_csv(tmp_path)
    assert rows[("imagenet", "alibi")]["config_ok"] == "False" and rows[("imagenet", "nopos")]["config_ok"] == "True"
    assert r"85.00 $^\dagger$" in (tmp_path / "table.tex").read_text()


def test_cells_whose_auto_settings_took_effect_otherwise_are_marked(tmp_path):
    """``trainer.precision: auto`` is bf16 on a GPU and fp32 on a CPU: the same configuration
    asked, another one run. Each cell's ``effective`` section says how it ran; a cell stored
    before the section existed says nothing and is not marked."""
    on_cpu = {"precision": "32-true", "compile": False, "world_size": 1}
    on_gpu = {"precision": "bf16-mixed", "compile": True, "world_size": 1}
    for method, score in (("pape", 80.0), ("rope", 75.0)):
        stored(tmp_path, "imagenet", method, 0, score, cfg=config("imagenet", method) | {"effective": on_cpu})
    stored(tmp_path, "imagenet", "alibi", 0, 85.0, cfg=config("imagenet", "alibi") | {"effective": on_gpu})
    stored(tmp_path, "imagenet", "nopos", 0, 10.0)  # written before config.yaml had the section
    markdown = write_tables(tmp_path)
    assert "| 85.00 † " in markdown and "**80.00**" in markdown
    assert (
        "imagenet/alibi/seed0: effective.compile=true (others: false), "
        "effective.precision=bf16-mixed (others: 32-true)" in markdown
    )
    assert "nopos" not in markdown.split("†", 2)[-1]


def test_cells_made_from_other_data_are_marked(tmp_path):
    """The tiny translation corpus comes from Babel's and num2words' tables: a fresh install
    with other versions writes other sentences under the same configuration. Each cell stores
    the versions its data and metric came from (``effective.data``); a column mixing them is
    marked, a cell stored before they were recorded is not."""
    made_with = {"precision": "32-true", "compile": False, "world_size": 1}
    for method, score, corpus in (("pape", 97.0, "tiny-en-de-aaaa"), ("rope", 96.0, "tiny-en-de-aaaa")):
        data = {"corpus": corpus, "sacrebleu": "2.6.0"}
        stored(tmp_path, "wmt14-en-de", method, 0, score, cfg=config("wmt14-en-de", method) | {
            "effective": made_with | {"data": data}})  # fmt: skip
    other = {"corpus": "tiny-en-de-bbbb", "sacrebleu": "2.6.0"}
    stored(tmp_path, "wmt14-en-de", "cape", 0, 92.0, cfg=config("wmt14-en-de", "cape") | {
        "effective": made_with | {"data": other}})  # fmt: skip
    stored(tmp_path, "wmt14-en-de", "nopos", 0, 10.0, cfg=config("wmt14-en-de", "nopos") | {"effective": made_with})
    markdown = write_tables(tmp_path)
    assert "| 92.00 † " in markdown and "**97.00**" in markdown
    assert "wmt14-en-de/cape/seed0: effective.data.corpus=tiny-en-de-bbbb (others: tiny-en-de-aaaa)" in markdown
    assert "nopos" not in markdown.split("†", 2)[-1]


def test_a_mix_of_auto_settings_is_marked_when_most_cells_predate_their_record(tmp_path):
    """Most cells stored before ``effective`` existed: the cells that hold it are still compared
    with each other (until stop 61 each cell was compared with one older cell only, which holds
    no ``effective`` key, so bf16 compiled GPU seeds beside fp32 CPU seeds went unmarked)."""
    on_cpu = {"precision": "32-true", "compile": False, "world_size": 1}
    on_gpu = {"precision": "bf16-mixed", "compile": True, "world_size": 1}
    for method, score in (("nopos", 10.0), ("sincos", 60.0), ("cape", 50.0), ("alibi", 40.0)):
        stored(tmp_path, "imagenet", method, 0, score)  # no effective section
    for method, score in (("pape", 80.0), ("rope", 75.0)):
        stored(tmp_path, "imagenet", method, 0, score, cfg=config("imagenet", method) | {"effective": on_cpu})
    stored(tmp_path, "imagenet", "lookhere", 0, 99.0, cfg=config("imagenet", "lookhere") | {"effective": on_gpu})
    markdown = write_tables(tmp_path)
    assert "| 99.00 † " in markdown and "**80.00**" in markdown
    assert (
        "imagenet/lookhere/seed0: effective.compile=true (others: false), "
        "effective.precision=bf16-mixed (others: 32-true)" in markdown
    )
    notes = markdown.split("†", 2)[-1]
    assert "pape" not in notes and "nopos" not in notes


def test_one_configuration_written_by_two_code_versions_is_counted_once(tmp_path):
    """Cells of one configuration whose files differ only in a typed field at its default (a
    field added between the two versions of the code) are one configuration: its 4 cells
    outnumber the 3 trained with another learning rate, which are the ones marked."""
    older = config("imagenet", "x")
    del older["optim"]["betas"]
    for method, score in (("pape", 80.0), ("rope", 75.0)):
        stored(tmp_path, "imagenet", method, 0, score, cfg=older | {"method": method})
    for method, score in (("sincos", 70.0), ("cape", 65.0)):
        stored(tmp_path, "imagenet", method, 0, score)
    for method, score in (("alibi", 90.0), ("lookhere", 91.0), ("nopos", 92.0)):
        stored(tmp_path, "imagenet", method, 0, score, optim={"lr": 0.004})
    markdown = write_tables(tmp_path)
    assert "**80.00**" in markdown and "| 92.00 † " in markdown
    assert "imagenet/alibi/seed0: optim.lr=0.004 (others: 0.002)" in markdown
    assert "no configuration is shared by most cells" not in markdown
    note = next(line for line in markdown.splitlines() if "another configuration than the rest" in line)
    assert "pape" not in note and "sincos" not in note


def test_config_differences_follow_the_runner_rules():
    mine = tables.result_config(config("imagenet", "pape", data={"train_size": 100}, trainer={"threads": 4}))
    reference = tables.result_config(config("imagenet", "rope"))
    assert "options" not in reference and "method" not in reference
    assert tables.config_differences("imagenet", mine, reference) == [
        "data.train_size=100 (others: 3000)", "trainer.threads=4 (others: 1)",
    ]  # fmt: skip
    older = config("imagenet", "pape")
    del older["optim"]["betas"], older["model"]["num_heads"], older["data"]["image_size"]
    # A typed field missing from one file is a field added since: no difference at its default
    # (betas), one where it has none (num_heads is required); free-form data always differs.
    assert tables.config_differences("imagenet", tables.result_config(older), reference) == [
        "data.image_size=absent (others: 24)", "model.num_heads=absent (others: 4)",
    ]  # fmt: skip


def test_cells_that_differ_only_in_a_tracker_share_the_task_configuration(tmp_path):
    """A tracker cannot change a result: it neither splits a task into two configurations
    (which, one cell each, would be a tie) nor marks a cell."""
    trainer = {"precision": "auto", "num_workers": 0, "threads": 1, "logger": ["csv", "wandb"]}
    stored(tmp_path, "imagenet", "pape", 0, 80.0)
    stored(tmp_path, "imagenet", "rope", 0, 75.0, trainer=trainer)
    markdown = write_tables(tmp_path)
    assert "no configuration is shared by most cells" not in markdown
    assert "another configuration than the rest" not in markdown


def test_cells_without_a_readable_config_are_left_out_and_listed(tmp_path):
    stored(tmp_path, "imagenet", "pape", 0, 80.0)
    stored(tmp_path, "imagenet", "pape", 1, 82.0)
    stored(tmp_path, "imagenet", "rope", 0, 95.0, cfg=False)
    broken = stored(tmp_path, "imagenet", "rope", 1, 96.0)
    (broken / "config.yaml").write_text("model: [unclosed\n")
    stored(tmp_path, "imagenet", "sincos", 0, 60.0)
    (stored(tmp_path, "imagenet", "sincos", 1, 61.0) / "config.yaml").write_text("- a list\n")
    markdown = write_tables(tmp_path)
    assert "95.00" not in markdown and "96.00" not in markdown and "| rope " not in markdown
    assert "imagenet/rope/seed0 (no config.yaml)" in markdown
    assert "imagenet/rope/seed1 (unreadable config.yaml: " in markdown
    assert "imagenet/sincos/seed1 (config.yaml is not a mapping)" in markdown and "60.00 (1/2)" in markdown
    assert ("imagenet", "rope") not in read_csv(tmp_path)
    with pytest.raises(tables.CellConfigError, match="no config.yaml"):
        tables.read_cell_config(tmp_path)


def test_confidence_interval_option(tmp_path):
    for seed, (pape, rope) in enumerate([(90.0, 80.0), (92.0, 83.0), (91.0, 81.0)]):
        stored(tmp_path, "imagenet", "pape", seed, pape)
        stored(tmp_path, "imagenet", "rope", seed, rope)
    half = stats.t.ppf(0.975, 2) * 1.0 / math.sqrt(3)
    markdown = write_tables(tmp_path, ci=0.95)
    assert f"**91.00 ± {half:.2f}**" in markdown and half == pytest.approx(2.48, abs=0.005)
    assert "Mean ± half-width of the 95% Student-t confidence interval over seeds" in markdown
    row = read_csv(tmp_path)[("imagenet", "pape")]
    assert float(row["ci_low"]) == pytest.approx(91.0 - half) and float(row["ci_high"]) == pytest.approx(91.0 + half)
    plain = write_tables(tmp_path)
    assert "**91.00 ± 1.00**" in plain and "Mean ± std over seeds" in plain


def test_cells_not_significantly_worse_than_the_best_are_bold_too(tmp_path):
    scores = {"pape": [90.0, 92.0, 91.0], "rope": [91.0, 89.0, 90.5], "nopos": [50.0, 52.5, 51.0]}
    for method, values in scores.items():
        for seed, value in enumerate(values):
            stored(tmp_path, "imagenet", method, seed, value)
    markdown = write_tables(tmp_path)
    assert "**91.00 ± 1.00**" in markdown and "**90.17 ± 1.04**" in markdown  # a noise winner is not alone
    assert "<u>51.17 ± 1.26</u>" in markdown
    assert "not significantly different from it (two-sided paired t-test" in markdown and "α = 0.05" in markdown
    rows = read_csv(tmp_path)
    assert rows[("imagenet", "pape")]["p_vs_best"] == ""
    expected = stats.ttest_rel(scores["rope"], scores["pape"]).pvalue
    assert float(rows[("imagenet", "rope")]["p_vs_best"]) == pytest.approx(expected) and expected > 0.05
    assert float(rows[("imagenet", "nopos")]["p_vs_best"]) < 0.05
    plain = write_tables(tmp_path, significance=False)
    assert "**91.00 ± 1.00**" in plain and "<u>90.17 ± 1.04</u>" in plain and "no significance test" in plain


def test_a_cell_whose_seeds_spread_past_the_limit_is_marked_with_its_seeds(tmp_path):
    """A cell where some seeds learned the task and some did not has a mean that ranks nothing,
    and the paired test cannot separate it from the best, so it is bold: the mark must say so."""
    scores = {"pape": [99.0, 100.0, 99.5], "sape2": [98.0, 26.0, 99.0], "rope": [96.0, 97.0, 100.0]}
    for method, values in scores.items():
        for seed, value in enumerate(values):
            stored(tmp_path, "imagenet", method, seed, value)
    markdown = write_tables(tmp_path)
    assert "**74.33 ± 41.86 ‡**" in markdown  # still bold: the mark does not change the ranking
    assert "± 2.08" in markdown and "± 2.08 ‡" not in markdown  # rope's std 2.08 is within 3
    assert "‡ seeds spread by more than 3 (std, in the metric's units)" in markdown
    assert "Per seed: imagenet/sape2 98.0 / 26.0 / 99.0." in markdown
    assert r"74.33 $\pm$ 41.86 $^\ddagger$" in (tmp_path / "table.tex").read_text()
    rows = read_csv(tmp_path)
    assert rows[("imagenet", "sape2")]["wide_spread"] == "True" and rows[("imagenet", "pape")]["wide_spread"] == "False"
    lenient = write_tables(tmp_path, spread_limit=math.inf)
    assert "‡" not in lenient and read_csv(tmp_path)[("imagenet", "sape2")]["wide_spread"] == "False"
    strict = write_tables(tmp_path, spread_limit=1.0)
    assert "± 2.08 ‡" in strict and "99.50 ± 0.50 ‡" not in strict
    single = render([rec("imagenet", "pape", 0, 50.0), rec("imagenet", "rope", 0, 10.0)], spread_limit=0.0)
    assert "‡" not in single  # one seed has no spread to mark


def test_select_tasks_keeps_those_columns_and_names_what_is_there(tmp_path):
    for seed in (0, 1):
        stored(tmp_path, "imagenet", "pape", seed, 90.0 + seed)
        stored(tmp_path, "cifar10", "pape", seed, 80.0 + seed)
    results = tables.load_results(tmp_path)
    only = tables.select_tasks(results, ["cifar10"])
    assert {r.task for r in only.records} == {"cifar10"} and {k[0] for k in only.configs} == {"cifar10"}
    assert "imagenet" not in render(only) and "80.50 ± 0.71" in render(only)
    with pytest.raises(KeyError) as error:
        tables.select_tasks(results, ["imagent"])
    assert error.value.args[0] == (
        "no stored cell of task 'imagent' (did you mean 'imagenet'?); the results hold: cifar10, imagenet"
    )


def test_latex_escapes_headers_and_names_with_one_header_row_a_caption_and_notes():
    records = [
        rec("imagenet", "pape[m=8]", 0, 80.0), rec("imagenet", "my_enc&#1", 0, 70.0),
        rec("wsj", "pape[m=8]", 0, 20.0, higher=False, label="WER (%)"),
        rec("wsj", "my_enc&#1", 0, 25.0, higher=False, label="WER (%)"),
    ]  # fmt: skip
    text = render(records, "latex")
    body = text[text.index(r"\toprule") : text.index(r"\midrule")]
    assert body.count(r"\\") == 1 and "task" not in body  # one header row
    assert r"imagenet Acc. (\%)" in body and r"wsj WER (\%) $\downarrow$" in body and "↓" not in text
    assert r"pape{[}m=8{]}" in text and r"my\_enc\&\#1" in text
    assert r"\caption{Result matrix, tiny profile. Mean $\pm$ std over seeds" in text
    assert "tiny profile: small stand-ins." in text.split(r"\end{tabular}")[1]
    assert r"\begin{table}" in text and r"\bottomrule" in text and text.rstrip().endswith(r"\end{table}")
    assert tables.latex.escape("50% of a_b ^ ~ {x} $ \\ ± τ †") == (
        r"50\% of a\_b \textasciicircum{} \textasciitilde{} \{x\} \$ \textbackslash{} $\pm$ $\tau$ $^\dagger$"
    )


@pytest.mark.skipif(shutil.which("pdflatex") is None, reason="pdflatex not installed")
def test_table_tex_compiles(tmp_path):
    for seed in (0, 1):
        stored(tmp_path, "imagenet", "pape[m=8]", seed, 80.0 + seed)
        stored(tmp_path, "imagenet", "rope_x&y", seed, 70.0 + 2 * seed, model={"depth": 2})
        stored(tmp_path, "wsj", "pape[m=8]", seed, 20.0 + seed, higher=False, label="WER (%)")
    stored(tmp_path, "wsj", "rope_x&y", 0, None, status="diverged")
    stored(tmp_path, "imagenet", "sincos", 0, 1.0, cfg=False)
    write_tables(tmp_path, ci=0.9)
    document = tmp_path / "document.tex"
    document.write_text(
        "\\documentclass{article}\n\\usepackage{booktabs}\n\\begin{document}\n\\input{table.tex}\n\\end{document}\n"
    )
    result = subprocess.run(
        ["pdflatex", "-interaction=nonstopmode", "-halt-on-error", document.name],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:]
    assert (tmp_path / "document.pdf").stat().st_size > 0
    assert "Missing character" not in (tmp_path / "document.log").read_text()


def test_tiny_footnote_names_the_stand_ins(monkeypatch):
    monkeypatch.undo()
    text = render([rec("imagenet", "pape", 0, 70.0), rec("imagenet", "rope", 0, 60.0)])
    assert "tiny profile: small stand-ins, not the real datasets - imagenet: " in text
