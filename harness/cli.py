"""``pe-bench``: the command line.

pe-bench run --tasks all --methods pape,rope,cape [--profile tiny|paper] [--seeds 0,1,2]
             [--out DIR] [--data-root DIR] [--set [TASK:]optim.epochs=5 ...] [-c FILE] [--dry-run]
             [--jobs N|auto] [--executor local|ray|slurm]
pe-bench table [--out DIR [--out DIR ...]] [--tasks T,...] [--ci 95] [--no-significance] [--spread-limit 3]
               [--paper pape:table1]
pe-bench list tasks|methods
pe-bench bench [--model tiny|vit-s|vit-b] [--methods ...] [--threads N] [--sweep 256,1024,4096]
               [--compile] [--throughput] [--pape-precision]
pe-bench principles [--methods ...]
pe-bench check NAME
pe-bench check-data --tasks T --data-root DIR [--profile paper] [--workers N]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import time
from dataclasses import replace
from pathlib import Path


def _seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seeds expects integers like 0,1,2, got {text!r}") from None
    # Seeds name cell folders and seed RNGs that reject negative values (numpy, fold = seed % 3).
    negative = [s for s in seeds if s < 0]
    if negative:
        raise argparse.ArgumentTypeError(f"--seeds expects non-negative integers like 0,1,2, got {text!r}")
    return seeds


def _confidence(text: str) -> float:
    """``--ci 95`` (percent) -> 0.95."""
    try:
        level = float(text.rstrip("%"))
    except ValueError:
        level = float("nan")
    if not 0 < level < 100:
        raise argparse.ArgumentTypeError(f"--ci expects a confidence level in percent, like 95, got {text!r}")
    if level <= 1:  # a fraction given where percent is read: a 0.95 % interval, narrower than any std
        raise argparse.ArgumentTypeError(
            f"--ci {text} would be a {level:g} % interval: the level is in percent, e.g. --ci {level * 100:g}"
        )
    return level / 100


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pe-bench")
    except PackageNotFoundError:  # running from a checkout that is not installed
        from pe_bench import __version__

        return __version__


def _ints(text: str) -> list[int]:
    return [int(s) for s in text.split(",") if s.strip()]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pe-bench", description=__doc__.split("\n\n")[0].strip())
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="train and evaluate a grid of tasks x methods x seeds")
    run.add_argument("--tasks", help="comma-separated tasks or a group (all, pape-table1, ...)")
    run.add_argument("--methods", help="comma-separated encodings, NAME[key=value,...] or all")
    from .config import studies  # the shipped grids, listed from configs/studies

    run.add_argument("--study", help=f"a ready-made grid instead of --tasks/--methods: {', '.join(studies())}")
    run.add_argument(
        "--profile",
        default="tiny",
        help="tiny (default): small generated or packaged stand-in data, no download, minutes on a CPU; "
        "paper: the papers' models and hyperparameters on the real datasets under --data-root. "
        "`pe-bench list tasks` shows each task's profiles",
    )
    run.add_argument(
        "--seeds",
        type=_seeds,
        default=[0],
        metavar="S[,S...]",
        help="comma-separated seeds, e.g. 0,1,2 (default: 0); one cell per seed, tables show mean ± std",
    )
    run.add_argument("--out", type=Path, default=None, help="results folder (default: results, results/studies/NAME)")
    run.add_argument("--data-root", type=Path, default=None, help="folder holding the real datasets")
    run.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="[TASK:]KEY=VALUE",
        help="override a config key for every task (optim.lr=1e-3) or for one task (imagenet:optim.lr=1e-3); "
        "repeatable",
    )
    run.add_argument(
        "-c",
        "--config",
        action="append",
        default=[],
        type=Path,
        metavar="FILE",
        help="YAML file of overrides per task, 'all' for every task, e.g. "
        "{all: {optim: {epochs: 5}}, imagenet: {optim: {lr: 1.0e-3}}}; repeatable. "
        "A task's own overrides beat 'all'; --set beats the files",
    )
    run.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bars (default: on a terminal); without them a line per epoch is printed",
    )
    run.add_argument(
        "--dry-run",
        action="store_true",
        help="print what each cell would do (train, reuse, retry, n/a, conflict) and train nothing",
    )
    run.add_argument(
        "--jobs", type=_jobs, default=1, metavar="N|auto",
        help="cells at once on this machine, each in its own process (auto: one per CPU core; default 1)",
    )  # fmt: skip
    run.add_argument(
        "--executor",
        choices=["local", "ray", "slurm"],
        default="local",
        help="local (this machine; see --jobs), ray (a Ray cluster) or slurm (a job array via submitit)",
    )
    run.add_argument("--address", default=None, help="Ray cluster address (default: start or join a local one)")
    run.add_argument(
        "--gpu-share",
        type=float,
        default=1.0,
        metavar="F",
        help="fraction of a GPU one cell takes (0.25: four cells per GPU)",
    )
    run.add_argument("--slurm-partition", default=None, help="sbatch partition of the job array")

    table = sub.add_parser("table", help="render the result matrix from stored runs")
    table.add_argument(
        "--out",
        type=Path,
        action="append",
        default=None,
        help="results folder (default: results); repeat to merge several folders into one matrix, "
        "printed but not written (a cell stored in two of them is an error)",
    )
    table.add_argument("--paper", default=None, help="also compare with a published table, e.g. pape:table1")
    table.add_argument("--ci", type=_confidence, default=None, metavar="LEVEL", help="show ± a t-interval, e.g. 95")
    table.add_argument(
        "--significance",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="bold every cell not significantly different from the best (paired t-test; default on)",
    )
    table.add_argument("--alpha", type=float, default=0.05, help="significance level of the paired test")
    table.add_argument(
        "--tasks",
        type=lambda text: [t.strip() for t in text.split(",") if t.strip()],
        default=None,
        help="only these tasks' columns (comma-separated); printed, not written",
    )
    table.add_argument(
        "--spread-limit",
        type=float,
        default=3.0,
        metavar="STD",
        help="mark ‡ every cell whose seeds' std exceeds STD, in the metric's units (default 3; inf: never)",
    )

    papers = sub.add_parser("papers", help="list the papers' published tables, or print one")
    papers.add_argument("ref", nargs="?", default=None, help="e.g. pape:table5")

    report = sub.add_parser("report", help="write one Markdown page: matrix, principles, efficiency, figures")
    report.add_argument("--out", type=Path, default=Path("results"))
    report.add_argument("--paper", default="pape:table1")

    lister = sub.add_parser("list", help="list tasks (with groups and profiles) or methods")
    lister.add_argument("what", choices=["tasks", "methods"])
    lister.add_argument("-v", "--verbose", action="store_true", help="also each encoding's options and defaults")

    bench = sub.add_parser("bench", help="forward time, memory and positional parameters vs nopos")
    bench.add_argument("--model", default="tiny", choices=["tiny", "vit-s", "vit-b"])
    bench.add_argument(
        "--methods",
        default=None,
        help="default: PaPE Table 4's encodings, PaPE for m 2..64 (with --pape-precision: nopos, pape, pape-ri)",
    )
    bench.add_argument("--batch", type=_ints, default=[1, 32], help="inference batch sizes (time per image)")
    bench.add_argument("--train-batch", type=int, default=32, help="training-step batch; 0 leaves it out")
    bench.add_argument("--repeats", type=int, default=10, help="timed samples per figure (median and IQR)")
    bench.add_argument("--threads", type=int, default=None, help="torch CPU threads while timing (default: torch's)")
    bench.add_argument("--image-size", type=int, default=None)
    bench.add_argument("--device", default="cuda" if _cuda() else "cpu")
    bench.add_argument("--sweep", type=_ints, default=None, help="token counts for the attention-layer sweep")
    bench.add_argument(
        "--sweep-methods", default=None, help="--sweep's encodings (default: by device, see sweep.SWEEP_METHODS)"
    )
    bench.add_argument("--out", type=Path, default=None, help="also write bench.md/bench.csv here")
    bench.add_argument("--task", default=None, help="only the task's own benchmark (e.g. tokenizer throughput)")
    bench.add_argument("--compile", action="store_true", help="torch.compile every model")
    bench.add_argument(
        "--attention-kernel",
        default="auto",
        choices=["auto", "flex", "dense"],
        help="the bias encodings' kernel: auto (on CUDA FlexAttention where a dense bias would exceed 2^23"
        " elements, else and on CPU SDPA + dense bias), flex or dense",
    )
    for flag, what in (  # adapters/_fused.py's FusedFunctions
        ("--rotation-kernel", "RoPE, RoPE-Mixed and STRING's rotation of q and k"),
        ("--cope-kernel", "CoPE's N x N bias (gates, counts, interpolation)"),
        ("--widening-kernel", "the concatenation of PaPE's and PaPE-RI's widened q and k"),
    ):
        bench.add_argument(
            flag, default="auto", choices=["auto", "fused", "eager"],
            help=f"{what}: auto (one compiled function on CUDA, eager passes on CPU), fused or eager",
        )  # fmt: skip
    bench.add_argument(
        "--throughput", action=argparse.BooleanOptionalAction, default=None, help="img/s table (default: on CUDA)"
    )
    bench.add_argument("--throughput-batch", type=_ints, default=[1, 128], help="batches of the img/s table")
    bench.add_argument(
        "--pape-precision", action="store_true", help="only PaPE's bf16 softmax and gradient error vs float64"
    )
    bench.add_argument(
        "--profile-step", default=None, metavar="METHODS", help="only: each method's training step in torch.profiler"
    )
    bench.add_argument(
        "--targets",
        type=Path,
        nargs="*",
        default=None,
        metavar="RUN",
        help="only: issue 16's GPU targets judged from GPU runs' folders (default: ./benchmarks/gpu-*), each"
        " on the newest run that measured it",
    )
    bench.add_argument(
        "--flex-probe",
        type=int,
        default=None,
        metavar="TOKENS",
        help="only: one layer's FlexAttention call at TOKENS (square) against SDPA, Flex without a score_mod and"
        " a hand-written ALiBi one, strided and contiguous (--methods: the bias encodings, default alibi)",
    )
    bench.add_argument(
        "--forward", action=argparse.BooleanOptionalAction, default=True, help="the Table-4 forward table (default on)"
    )
    bench.add_argument("--grid", action="store_true", help="only the wall time of a tiny grid: 1 vs N jobs vs Ray")
    bench.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="--grid: N of --jobs N (default: cores)")
    bench.add_argument("--grid-tasks", default="imagenet,ucf101", help="--grid: the grid's tasks")
    bench.add_argument("--grid-methods", default="nopos,rope,pape", help="--grid: the grid's methods")
    bench.add_argument("--grid-epochs", type=int, default=3, help="--grid: epochs of every cell")
    bench.add_argument("--no-ray", dest="ray", action="store_false", help="--grid: leave the Ray executor out")

    extrapolate = sub.add_parser("extrapolate", help="evaluate stored checkpoints at other resolutions")
    extrapolate.add_argument("--task", default="imagenet")
    extrapolate.add_argument("--methods", default=None, help="method labels (default: every finished cell)")
    extrapolate.add_argument("--resolutions", default=None, help="e.g. 24,48,96 or 48x96 (default: 1x-4x)")
    extrapolate.add_argument("--out", type=Path, default=Path("results"))
    extrapolate.add_argument("--data-root", type=Path, default=None)

    analyze = sub.add_parser("analyze", help="PaPE per-head position/semantics z-scores (PaPE Figure 3)")
    analyze.add_argument("--task", default="imagenet")
    analyze.add_argument("--method", default="pape")
    analyze.add_argument("--seed", type=int, default=0)
    analyze.add_argument("--tau", type=float, default=0.8, help="top-attended threshold τ")
    analyze.add_argument("--images", type=int, default=256, help="test images to average over")
    analyze.add_argument("--out", type=Path, default=Path("results"))
    analyze.add_argument("--data-root", type=Path, default=None)

    confusion = sub.add_parser(
        "confusion", help="test-split confusion matrices of finished classification cells (which wrong class)"
    )
    confusion.add_argument("--task", required=True)
    confusion.add_argument("--method", required=True, help="one method label, e.g. abspos or 'pape[m=8]'")
    confusion.add_argument("--seeds", type=_seeds, default=[0], help="comma-separated seeds, summed (default 0)")
    confusion.add_argument("--out", type=Path, default=Path("results"), help="results folder holding the cells")
    confusion.add_argument("--data-root", type=Path, default=None)

    principles = sub.add_parser("principles", help="declared versus measured principles of every encoding")
    principles.add_argument("--methods", default=None)

    check = sub.add_parser("check", help="run the conformance suite on one encoding")
    check.add_argument("name")

    again = sub.add_parser(
        "reproduce", help="train stored cells' first epochs again and compare them with their metrics.csv, bit for bit"
    )
    again.add_argument("paths", nargs="+", type=Path, metavar="PATH", help="cell folders or results folders")
    again.add_argument("--epochs", type=int, default=1, help="epochs to train and compare per cell (default 1)")
    again.add_argument("--tasks", default=None, help="only these tasks (comma-separated)")
    again.add_argument("--methods", default=None, help="only these method labels (comma-separated)")
    again.add_argument("--seeds", default=None, help="only these seeds (comma-separated)")
    again.add_argument("--data-root", type=Path, default=None, help="folder holding the real datasets")
    again.add_argument("--progress", action=argparse.BooleanOptionalAction, default=False, help="progress bars")

    data = sub.add_parser("check-data", help="scan whole datasets: every file decodes, shapes and class lists agree")
    data.add_argument("--tasks", required=True, help="comma-separated tasks or a group")
    data.add_argument("--data-root", type=Path, default=None, help="folder holding the real datasets")
    data.add_argument("--profile", default="paper", help="paper (default: the real datasets)")
    data.add_argument("--set", action="append", default=[], metavar="[TASK:]KEY=VALUE", help="override a config key")
    data.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes opening files")
    return parser


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def cmd_run(args: argparse.Namespace) -> int:
    from pe_bench.harness.grid.loggers import require_trackers
    from pe_bench.harness.grid.methods import parse_methods
    from pe_bench.harness.grid.runner import GridRequest, run_grid
    from pe_bench.harness.grid.store import STATUS_DIVERGED, STATUS_FAILED
    from pe_bench.harness.reports.tables import write_tables
    from pe_bench.tasks import get_task, resolve_tasks

    from .config import ALL_TASKS, deep_merge, load_study, override_scope, task_overrides

    scoped = task_overrides(args.set, args.config)
    overrides = scoped.pop(ALL_TASKS, {})
    if args.study:
        study = load_study(args.study)
        args.tasks = args.tasks or ",".join(study.tasks)
        args.methods = args.methods or ",".join(study.methods)
        overrides = deep_merge(study.overrides.get(args.profile, {}), overrides)
        print(f"study {args.study}: {study.description}")
    if args.out is None:  # a study's cells differ from the plain grid's: keep them apart
        args.out = Path("results") / "studies" / args.study if args.study else Path("results")
    if not args.tasks or not args.methods:
        print("error: give --tasks and --methods, or --study NAME", file=sys.stderr)
        return 2
    methods = parse_methods(args.methods)
    if not methods:
        print(f"error: --methods {args.methods!r} selects no method; give e.g. --methods rope,pape or all",
              file=sys.stderr)  # fmt: skip
        return 2
    if not args.seeds:
        print("error: --seeds selects no seed; give e.g. --seeds 0 or --seeds 0,1,2", file=sys.stderr)
        return 2
    args.seeds = list(dict.fromkeys(args.seeds))  # a repeated seed is one cell
    tasks = resolve_tasks(args.tasks)
    if not tasks:
        print("error: no implemented task selected", file=sys.stderr)
        return 2
    _check_override_scopes(scoped, {override_scope(pair) for pair in args.set}, tasks)
    progress = sys.stdout.isatty() if args.progress is None else args.progress
    request = GridRequest(
        tasks, methods, args.profile, args.seeds, args.out, args.data_root, overrides, progress,
        task_overrides={task: tree for task, tree in scoped.items() if task in tasks},
    )  # fmt: skip
    request.pin_profiles()  # the task YAMLs as they read now hold for every cell of this grid
    for name in tasks:  # fail fast: configs valid, trackers installed, data present before any training
        config = request.run_config(name)
        require_trackers(config.trainer.logger)
        get_task(name)(config, args.data_root).check_data()
    # Before the dry run too: the executor sets the CPU threads its cells run (and are stored) with.
    request.executor = _executor(args)
    if args.dry_run:
        from pe_bench.harness.grid.plan import CONFLICT, format_plan, plan_grid

        planned = plan_grid(request)
        print(format_plan(request, planned))
        return 2 if any(cell.action == CONFLICT for cell in planned) else 0
    records = run_grid(request)
    print()
    print(write_tables(args.out))
    print(f"\n(tables written to {args.out}/table.md, table.tex, table.csv)")
    failed = [r for r in records if r.status in (STATUS_FAILED, STATUS_DIVERGED)]
    if failed:
        print(f"{len(failed)} cell(s) failed or diverged; their reasons are in result.json", file=sys.stderr)
        return 1
    return 0


def _jobs(text: str) -> int:
    from pe_bench.harness.grid.executor import auto_jobs

    if text == "auto":
        return auto_jobs()
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"--jobs takes a positive number or auto, got {text!r}")
    return int(text)


def _executor(args: argparse.Namespace):
    """None (cells one after the other in this process) or the executor the flags ask for."""
    from pe_bench.harness.grid import executor

    if args.executor == "ray":
        return executor.RayExecutor(args.address, gpu_share=args.gpu_share)
    if args.executor == "slurm":
        return executor.SlurmExecutor(executor.SlurmSettings(partition=args.slurm_partition))
    if args.jobs > 1:
        gpus = list(range(torch_cuda_devices()))
        return executor.ParallelExecutor(args.jobs, gpus=gpus or None, gpu_share=args.gpu_share)
    return None


def torch_cuda_devices() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _check_override_scopes(scoped: dict, from_command_line: set[str], tasks: list[str]) -> None:
    """Every scope names a task; one typed on the command line also names a task of this grid
    (a file may hold overrides for tasks of other grids)."""
    from pe_bench.tasks import get_task

    for scope in scoped:
        try:
            get_task(scope)
        except KeyError as err:  # names the known tasks and a close match
            raise ValueError(f"overrides for {scope!r} (use a task name or 'all'): {err.args[0]}") from None
        if scope in from_command_line and scope not in tasks:
            raise ValueError(f"--set {scope}:...: {scope} is not a task of this grid ({', '.join(tasks)})")


def cmd_table(args: argparse.Namespace) -> int:
    from pe_bench.harness.grid.store import load_records
    from pe_bench.harness.reports import tables

    folders = args.out or [Path("results")]
    for folder in folders:
        if not load_records(folder):  # a mistyped --out must not print an empty table as if all is well
            where = "holds no readable results" if (folder / "runs").is_dir() else "has no results (no runs/ folder)"
            print(f"error: {folder} {where}; check --out, or run `pe-bench run --out {folder} ...` first",
                  file=sys.stderr)  # fmt: skip
            return 2
    if not 0 < args.alpha < 1:
        raise ValueError(f"--alpha must lie between 0 and 1, got {args.alpha}")
    if len(folders) > 1 or args.tasks:
        return _print_merged_tables(folders, args)
    out = folders[0]
    results = tables.load_results(out)  # every config.yaml read once, for the matrix and the tasks' tables
    print(tables.write_tables(out, args.ci, args.significance, args.alpha, args.spread_limit, results))
    written = ["table.md", "table.tex", "table.csv"]
    for text in tables.write_extra_tables(out, results):
        print(f"\n{text}")
    if args.paper:
        from pe_bench.harness.reports.papers import comparison_stem, write_comparison

        print()
        print(write_comparison(out, args.paper))
        written += [f"{comparison_stem(args.paper)}.md", f"{comparison_stem(args.paper)}.csv"]
    print(f"\n(written to {out}/: {', '.join(written)})")
    return 0


def _print_merged_tables(folders: list[Path], args: argparse.Namespace) -> int:
    """One matrix from the records of several folders, or of some tasks only. Nothing is
    written: a table file in a results folder would then describe other cells than it holds."""
    from pe_bench.harness.reports import tables

    try:
        results = tables.load_results(folders)
        if args.tasks:
            results = tables.select_tasks(results, args.tasks)
    except (tables.DuplicateCellError, KeyError) as err:
        print(f"error: {err.args[0]}", file=sys.stderr)
        return 2
    print(tables.render(results, "markdown", args.ci, args.significance, args.alpha, args.spread_limit))
    for frame in tables.extra_tables(results).values():
        print(f"\n{tables.render_extra_table(frame)}")
    if args.paper:
        from pe_bench.harness.reports.papers import compare_markdown

        print(f"\nOurs next to `{args.paper}`.\n\n{compare_markdown(results, args.paper)}")
    what = str(folders[0])
    if len(folders) > 1:
        what = f"merged from {len(folders)} folders: {', '.join(map(str, folders))}"
    if args.tasks:
        what += f"; tasks {', '.join(args.tasks)}"
    print(f"\n({what}; printed, not written)")
    return 0


def cmd_papers(args: argparse.Namespace) -> int:
    from pe_bench.harness.reports.papers import list_tables, render_paper_table

    print(render_paper_table(args.ref) if args.ref else list_tables().to_markdown(index=False))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from pe_bench.harness.reports.report import write_report

    print(f"report written to {write_report(args.out, args.paper)}")
    return 0


def _option_lines(cls) -> list[str]:
    """``key: type = default  description`` for every option of an encoding (``list -v``)."""
    lines = []
    for key, field in cls.Options.model_fields.items():
        annotation = field.annotation
        kind = annotation.__name__ if isinstance(annotation, type) else str(annotation).replace("typing.", "")
        default = "required" if field.is_required() else repr(field.default)
        about = f"  {field.description}" if field.description else ""
        lines.append(f"      {key}: {kind} = {default}{about}")
    return lines


def _report_broken_plugins(registry) -> None:
    for name, why in registry.broken_plugins.items():
        print(f"plug-ins that failed to load: {registry.kind} {name!r}: {why}", file=sys.stderr)


def cmd_list(args: argparse.Namespace) -> int:
    if args.what == "methods":
        from pe_bench.adapters import ENCODINGS

        for name in ENCODINGS.names():
            cls = ENCODINGS.get(name)
            claims = ", ".join(sorted(p.value for p in cls.principles)) or "-"
            where = []
            if cls.pos_dims is not None:
                where.append(f"P in {{{', '.join(map(str, sorted(cls.pos_dims)))}}}")
            if cls.requires_grid:
                where.append("grids only")
            scope = f"   [{'; '.join(where)}]" if where else ""
            print(f"{name:18s} {claims}{scope}   from {ENCODINGS.origin(name)}")
            if args.verbose:
                print("\n".join(_option_lines(cls)) or "      (no options)")
        _report_broken_plugins(ENCODINGS)
        return 0
    from pe_bench.tasks import TASKS, get_task, groups, implemented, planned

    for name in implemented():
        task = get_task(name)
        profiles = ", ".join(task.profiles)
        print(f"{name:14s} profiles: {profiles:12s} metric: {task.metric_label:10s} from {TASKS.origin(name)}")
    for name in planned():
        print(f"{name:14s} (not implemented yet)")
    print("\ngroups (configs/groups.yaml):")
    for group, members in groups().items():
        print(f"  {group:12s} {', '.join(members)}")
    _report_broken_plugins(TASKS)
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from pe_bench.adapters.cope import FUSED_COPE
    from pe_bench.adapters.pape import FUSED_WIDENING
    from pe_bench.adapters.rope import FUSED_ROTATION

    kernels = (
        ("rotation", FUSED_ROTATION, args.rotation_kernel),
        ("CoPE", FUSED_COPE, args.cope_kernel),
        ("widening", FUSED_WIDENING, args.widening_kernel),
    )
    with contextlib.ExitStack() as chosen:
        for name, function, choice in kernels:
            if choice != "auto":
                print(f"{name} kernel: {choice}", flush=True)
            chosen.enter_context(function.chosen(choice))
        return _bench(args)


def _bench(args: argparse.Namespace) -> int:
    from pe_bench.harness.reports.bench import TABLE4_METHODS, TIMM_ROW, BenchSpec, forward_table, header
    from pe_bench.harness.reports.sweep import SWEEP_METHODS, sweep_markdown, sweep_table

    if args.targets is not None:  # reads finished runs: no device, nothing measured
        return _targets(args.targets)
    _check_device(args.device)
    if args.task:
        from pe_bench.tasks import get_task

        figures = get_task(args.task).benchmark(args.device, compile=args.compile)
        print(figures or f"task {args.task!r} has no benchmark of its own")
        return 0
    if args.grid:
        return _grid_bench(args)
    _check_attention_kernel(args)
    _check_sweep_tokens(args.sweep)
    if args.profile_step:
        return _profile_steps(args)
    if args.flex_probe:
        return _flex_probe(args)
    if args.pape_precision:
        from pe_bench.harness.reports.pape_precision import pape_precision_table

        # --methods picks the rows (e.g. "nopos,pape[space=position]"); default nopos, pape, pape-ri
        methods = {} if args.methods is None else {"methods": _bench_methods(args.methods)}
        precision = pape_precision_table(**methods)
        title = (
            "## PaPE against float64 (bf16 autocast, CPU): softmax total variation (mean, max) and relative"
            " error of the gradients reaching the encoding (grad) and the qkv weight (content grad), the 16-bit"
            " backward modelled on a FlashAttention-style kernel's roundings, not measured on a GPU"
        )
        print(title, precision.to_markdown(floatfmt=".2g"), sep="\n")
        return 0
    methods = TABLE4_METHODS if args.methods is None else _bench_methods(args.methods)
    batches = tuple(args.batch)
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be at least 1, got {args.threads}")
    spec = BenchSpec(
        args.model, methods, batches, args.train_batch, args.repeats, args.image_size, args.device, args.threads
    )
    spec.compile, spec.attention_kernel = args.compile, args.attention_kernel
    threads = args.threads or _torch_threads()
    lines = [f"# pe-bench bench: {args.model}, {args.repeats} repeats, torch threads: {threads}", header(), ""]
    forward = None
    if args.forward:
        forward = forward_table(BenchSpec(**{**spec.__dict__, "methods": tuple(m for m in methods if m != TIMM_ROW)}))
        lines += [
            "## Median ms with its IQR (inference per image; one training step), each relative to nopos in the"
            f" same run; GFLOPs per image; peak inference memory at batch {batches[0]}; computing operators"
            " (kernels, views left out) of a forward (ops_fwd) and of a training forward + backward (ops_train)"
            " at batch 1, and the training pass's waits of the host for a GPU (host_syncs_train)",
            forward.to_markdown(),
            "",
        ]
    print("\n".join(lines), flush=True)
    if args.throughput if args.throughput is not None else args.device.startswith("cuda"):
        lines += _throughput_block(args, spec)
    sweep = None
    if args.sweep and not _was_interrupted(lines):  # a deadline stops the command, not one table
        device_kind = "cuda" if args.device.startswith("cuda") else "cpu"
        sweep_methods = [m.strip() for m in _split_methods(args.sweep_methods or SWEEP_METHODS[device_kind])]

        def say(row: dict) -> None:  # each point as it ends: a run cut off keeps what it finished
            print("sweep:", json.dumps(row), flush=True)

        sweep = sweep_table(sweep_methods, args.sweep, device=args.device, on_row=say, kernel=args.attention_kernel)
        precision = "bf16 autocast, allocator peak" if device_kind == "cuda" else "fp32, 1 thread, peak RSS"
        block = [
            f"## One attention layer (dim 768, 12 heads; {precision}): peak memory (MiB) / time (ms) per forward",
            sweep_markdown(sweep) if len(sweep) else "(no point measured)",
            *_not_measured(sweep),
        ]
        print("\n".join(block))
        lines += block
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench.md").write_text("\n".join(lines) + "\n")
        if forward is not None:
            forward.to_csv(args.out / "bench.csv")
        if sweep is not None:
            sweep.to_csv(args.out / "bench_sweep.csv", index=False)
    if _was_interrupted(lines):
        return 130  # the tables above are complete up to where a deadline stopped them
    return 0


#: how a bench table stopped by a deadline names what it did not reach (``_not_measured``)
NOT_MEASURED = "interrupted before it measured:"


def _was_interrupted(lines: list[str]) -> bool:
    return any(line.startswith(NOT_MEASURED) for line in lines)


def _not_measured(table) -> list[str]:
    """The line that names what an interrupted table did not reach (none if it finished)."""
    missing = table.attrs.get("interrupted")
    return [f"{NOT_MEASURED} {', '.join(missing)}"] if missing else []


def _grid_bench(args: argparse.Namespace) -> int:
    from pe_bench.harness.reports.grid_bench import GridBenchSpec, grid_bench

    if args.jobs < 2:
        raise ValueError(f"bench --grid compares 1 job with --jobs N: N must be at least 2, got {args.jobs}")
    spec = GridBenchSpec(
        args.grid_tasks, args.grid_methods, "0", (f"optim.epochs={args.grid_epochs}",), args.jobs, args.ray
    )
    table = grid_bench(spec, say=lambda line: print(line, flush=True))
    title = (
        f"## Wall time of one tiny grid ({spec.tasks} x {spec.methods}, {args.grid_epochs} epochs) per executor,"
        f" {os.cpu_count()} cores; speed-up over --jobs 1 in the same invocation"
    )
    print(title, table.to_markdown(floatfmt=".3g"), sep="\n")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "bench_grid.md").write_text(f"{title}\n{table.to_markdown(floatfmt='.3g')}\n")
        table.to_csv(args.out / "bench_grid.csv")
    return 0


def _profile_steps(args: argparse.Namespace) -> int:
    from pe_bench.harness.reports.bench import BenchSpec, failure_cell, profile_step, release_cuda_memory

    spec = BenchSpec(args.model, (), (), 0, args.repeats, args.image_size, args.device, args.threads)
    # --compile profiles the compiled step: issue 16's rope stayed 1.20x nopos compiled (H200,
    # 11-27) with its rotation fused, a gap only a profile of the compiled kernels can place
    spec.compile, spec.attention_kernel = args.compile, args.attention_kernel
    batch = max(args.throughput_batch)
    form = "compiled" if args.compile else "eager"
    for method in _bench_methods(args.profile_step):
        title = f"## {method}: {form} training step at batch {batch} ({args.model}, {args.device})"
        title += ", operators by self time"
        try:
            table = profile_step(method, spec, batch)
        except Exception as error:  # OOM at the batch, a kernel error: the other methods still profile
            release_cuda_memory()
            table = f"not profiled: {failure_cell(error)}"
        print(title, table, sep="\n", flush=True)
    return 0


def _targets(folders: list[Path]) -> int:
    from pe_bench.harness.reports.targets import default_folders, load_runs, targets_markdown

    folders = folders or default_folders()
    if not folders:
        raise ValueError(
            "bench --targets: no GPU run folders given and none under ./benchmarks/gpu-*; name the folders"
            " (each with run.json and the rows a GPU run printed: throughput_rows.jsonl or eager.txt)"
        )
    runs = load_runs(folders)
    runs_counted = f"{len(runs)} run" + ("" if len(runs) == 1 else "s")
    print(f"## Issue 16's targets on the newest GPU run of each encoding ({runs_counted})")
    print(targets_markdown(runs))
    return 0


def _flex_probe(args: argparse.Namespace) -> int:
    import torch

    from pe_bench.harness.reports.flex_probe import flex_probe_table

    methods = list(_bench_methods(args.methods or "alibi"))
    table = flex_probe_table(methods, args.flex_probe, args.device, repeats=args.repeats)
    title = (
        f"## One attention layer's FlexAttention call at {args.flex_probe:,} tokens ({args.device}, torch"
        f" {torch.__version__}): median ms of {args.repeats} calls after a first (compiling) one"
    )
    print(title, table.to_markdown(index=False, floatfmt=".3g"), sep="\n")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        table.to_csv(args.out / "flex_probe.csv", index=False)
    return 0


def _check_device(device: str) -> None:
    """--device names a device this machine has: a misspelt one, or cuda without a GPU, is a
    one-line error before any model is built (it was torch's traceback from deep inside)."""
    import torch

    try:
        kind = torch.device(device).type
    except RuntimeError:
        raise ValueError(f"bench --device {device!r}: not a device; use cpu, cuda or cuda:N") from None
    if kind == "cuda" and not torch.cuda.is_available():
        built = f"built with CUDA {torch.version.cuda}" if torch.version.cuda else "built without CUDA"
        raise ValueError(
            f"bench --device {device}: this machine has no usable CUDA device (torch {torch.__version__}, {built});"
            " use --device cpu, or run on a machine with an NVIDIA GPU and driver"
        )
    if kind == "cuda" and (index := torch.device(device).index) is not None and index >= torch.cuda.device_count():
        raise ValueError(f"bench --device {device}: this machine has {torch.cuda.device_count()} CUDA device(s)")


def _check_sweep_tokens(tokens: list[int] | None) -> None:
    """The sweep's layer runs on a square grid: a count that is no square would be measured at
    side^2 tokens under the count asked for (1000 ran 961), so it is refused, naming squares."""
    odd = [n for n in tokens or () if n < 1 or math.isqrt(n) ** 2 != n]
    if odd:
        near = lambda n: f"{math.isqrt(max(n, 1)) ** 2} or {(math.isqrt(max(n, 1)) + 1) ** 2}"  # noqa: E731
        raise ValueError(
            "bench --sweep: token counts must be squares (the layer's grid is side x side): "
            + ", ".join(f"{n} (e.g. {near(n)})" for n in odd)
        )


def _check_attention_kernel(args: argparse.Namespace) -> None:
    """--attention-kernel flex runs on the CPU eagerly and forward only: refuse a CPU run that
    times training or compiles."""
    if args.attention_kernel != "flex" or args.device.startswith("cuda"):
        return
    forward_only = args.pape_precision or args.flex_probe  # their own measurements, no training step
    training = bool(args.profile_step) or (not forward_only and (args.train_batch > 0 or bool(args.throughput)))
    if training:
        raise ValueError(
            "bench --attention-kernel flex on the CPU: FlexAttention has no backward there, so no training step"
            " can be timed; add --train-batch 0 (and leave out --throughput and --profile-step), or use --device cuda"
        )
    if args.compile:
        # Measured with torch 2.14 (stop 56): Inductor's CPU Flex template takes no score_mod that
        # reads a tensor computed inside the compiled graph ("NoValidChoicesError ... Cannot Append
        # Choice: Pointwise"), and every bias encoding's does (coordinates, alpha, gates).
        raise ValueError(
            "bench --compile --attention-kernel flex on the CPU: Inductor's CPU FlexAttention cannot compile the"
            " bias encodings' score_mods; leave out --compile (eager Flex on the CPU), use --attention-kernel"
            " dense, or --device cuda"
        )


def _bench_methods(text: str) -> tuple[str, ...]:
    """--methods of bench, in the order given: encodings, and ``timm`` (the throughput table's
    reference model, which is no encoding)."""
    from pe_bench.harness.grid.methods import split_top_level
    from pe_bench.harness.reports.bench import TIMM_ROW

    methods: list[str] = []
    for part in (p.strip() for p in split_top_level(text) if p.strip()):
        methods += [TIMM_ROW] if part == TIMM_ROW else _split_methods(part)
    return tuple(dict.fromkeys(methods))


def _throughput_block(args: argparse.Namespace, spec) -> list[str]:
    from pe_bench.harness.reports.bench import TIMM_MODELS, TIMM_ROW
    from pe_bench.harness.reports.throughput import THROUGHPUT_METHODS, throughput_table

    default = THROUGHPUT_METHODS + ((TIMM_ROW,) if args.model in TIMM_MODELS else ())
    methods = default if args.methods is None else spec.methods

    def say(row: dict) -> None:  # each row as it is measured: a run cut off keeps what it finished
        print("row:", json.dumps(row), flush=True)

    table = throughput_table(replace(spec, methods=methods, batches=tuple(args.throughput_batch)), on_row=say)
    title = (
        "## img/s; nopos / this (_vs_nopos: the median over pairs of one nopos call and one of this"
        " method's, _iqr their spread) and that over the FLOP-model bound (_vs_bound)"
    )
    steadiness = [
        f"nopos over the whole run, {column}: median {run['median']} img/s, 10th-90th percentile"
        f" {run['p10']}-{run['p90']} ({run['calls']} timed calls)"
        for column, run in table.attrs.get("nopos_over_the_run", {}).items()
    ]
    block = [title, table.to_markdown(), "", *steadiness, *_not_measured(table), ""]
    print("\n".join(block), flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        table.to_csv(args.out / "bench_throughput.csv")
    return block


def _split_methods(text: str) -> list[str]:
    from pe_bench.harness.grid.methods import parse_methods

    return [m.label for m in parse_methods(text)]


def cmd_extrapolate(args: argparse.Namespace) -> int:
    from pe_bench.harness.grid.runner import quiet_lightning
    from pe_bench.harness.reports import extrapolate as ex

    quiet_lightning()
    methods = None if args.methods is None else _split_methods(args.methods)
    cells, _ = ex.evaluable_cells(args.out, args.task, methods)
    task, _, _ = ex.load_cell(cells[0].directory, args.data_root)
    size, patch = task.data.image_size, task.config.model.patch_size
    if args.resolutions:
        resolutions = ex.parse_resolutions(args.resolutions)
    else:
        resolutions = ex.default_resolutions(size, patch, task.config.profile)
    frame = ex.evaluate_grid(args.out, args.task, resolutions, methods, args.data_root)
    print(ex.write_extrapolation(args.out, args.task, frame, f"{size}²"))
    print(f"(written to {args.out}/extrapolation/{args.task}/)")
    return 0


def cmd_analyze(args: argparse.Namespace) -> int:
    import pandas as pd
    import torch

    from pe_bench.harness.grid.store import cell_dir
    from pe_bench.harness.reports.analysis import head_name, pape_head_scores, plot_heatmap
    from pe_bench.harness.reports.extrapolate import load_cell

    directory = cell_dir(args.out, args.task, args.method, args.seed)
    if not (directory / "best.ckpt").is_file():
        raise FileNotFoundError(f"no finished cell with a checkpoint at {directory}; run `pe-bench run` first")
    task, model, _ = load_cell(directory, args.data_root)
    data = task.datamodule(seed=0)
    data.setup("test")
    images = []
    for batch, _ in data.test_dataloader():
        images.append(batch)
        if sum(len(b) for b in images) >= args.images:
            break
    scores = pape_head_scores(model, torch.cat(images)[: args.images], args.tau)
    target = args.out / "analysis" / args.task / directory.parent.name / directory.name
    target.mkdir(parents=True, exist_ok=True)
    frame = pd.DataFrame(scores, index=[f"L{i + 1}" for i in range(len(scores))])
    frame.columns = [f"H{h + 1}" for h in range(scores.shape[1])]
    frame.to_csv(target / "zscores.csv")
    plot_heatmap(scores, target / "heatmap", f"{args.task} · {args.method}: z per head (τ = {args.tau})")
    print(frame.to_markdown(floatfmt=".3f"))
    print(f"most positional head: {head_name(scores, 'max')}, most semantic: {head_name(scores, 'min')}")
    print(f"(written to {target}/)")
    return 0


def cmd_confusion(args: argparse.Namespace) -> int:
    from pe_bench.harness.grid.runner import quiet_lightning
    from pe_bench.harness.grid.store import cell_dir, method_dirname
    from pe_bench.harness.reports.confusion import cell_confusion, write_confusion

    quiet_lightning()
    (method,) = _split_methods(args.method)
    cells = [cell_confusion(cell_dir(args.out, args.task, method, seed), args.data_root) for seed in args.seeds]
    target = args.out / "confusion" / args.task / method_dirname(method)
    print(f"{args.task} · {method}, seeds {','.join(map(str, args.seeds))}, test split, summed over seeds")
    print(write_confusion(cells, target))
    print(f"(per seed in {target}/)")
    return 0


def cmd_principles(args: argparse.Namespace) -> int:
    from pe_bench.harness.grid.methods import parse_methods

    from .conformance import principles_table

    specs = None if args.methods is None else parse_methods(args.methods)
    methods = None if specs is None else [(spec.label, spec.name, dict(spec.options)) for spec in specs]
    table = principles_table(methods)
    print(table.to_markdown())
    broken = [name for name, row in table.iterrows() if any(str(cell).startswith("error") for cell in row)]
    if broken:  # a build or measurement raised: the row says which exception; `pe-bench check NAME` shows it
        print(f"error: could not measure {', '.join(map(str, broken))}; run `pe-bench check NAME`", file=sys.stderr)
        return 1
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from pe_bench.harness.grid.methods import parse_method

    from .conformance import check

    spec = parse_method(args.name)
    report = check(spec.name, dict(spec.options))
    print(report.format())
    return 0 if report.passed else 1


def cmd_check_data(args: argparse.Namespace) -> int:
    from pe_bench.tasks import get_task, resolve_tasks

    from .config import ALL_TASKS, deep_merge, load_run_config, task_overrides

    scoped, names, failed = task_overrides(args.set), resolve_tasks(args.tasks), []
    for name in names:
        overrides = deep_merge(scoped.get(ALL_TASKS, {}), scoped.get(name, {}))
        task = get_task(name)(load_run_config(name, args.profile, overrides), args.data_root)
        start = time.perf_counter()
        try:
            report = task.check_data(full=True, workers=max(1, args.workers))
        except (FileNotFoundError, ValueError) as err:  # a missing dataset, lists that disagree
            print(f"{name}: FAILED\n  " + str(err).replace("\n", "\n  "))
            failed.append(name)
            continue
        print(f"{report.format()}\n  ({time.perf_counter() - start:.1f}s)")
        if not report.ok:
            failed.append(name)
    problems = f"; problems: {', '.join(failed)}" if failed else ""
    print(f"\n{len(names) - len(failed)} of {len(names)} datasets ok{problems}")
    return 1 if failed else 0


def cmd_reproduce(args: argparse.Namespace) -> int:
    from pe_bench.harness.grid.reproduce import reproduce, stored_cells

    if args.epochs < 1:
        raise ValueError(f"--epochs must be at least 1, got {args.epochs}")
    wanted = {
        level: None if text is None else {part.strip() for part in text.split(",") if part.strip()}
        for level, text in (("task", args.tasks), ("method", args.methods), ("seed", args.seeds))
    }

    def selected(cell: Path) -> bool:  # RESULTS/runs/TASK/METHOD/seedN
        names = {"task": cell.parent.parent.name, "method": cell.parent.name, "seed": cell.name.removeprefix("seed")}
        return all(allowed is None or names[level] in allowed for level, allowed in wanted.items())

    cells = [cell for cell in stored_cells(args.paths) if selected(cell)]
    if not cells:
        raise ValueError("no stored cell matches: check the paths and the --tasks/--methods/--seeds filters")
    print(f"training the first {args.epochs} epoch(s) of {len(cells)} stored cell(s) again on this machine:")
    results = reproduce(cells, args.epochs, args.data_root, args.progress)
    same = sum(r.identical for r in results)
    differ = sum(bool(r.differences) for r in results)
    skipped = sum(bool(r.skipped) for r in results)
    print(f"\n{same} identical, {differ} differ, {skipped} skipped (of {len(results)})")
    return 1 if differ or same == 0 else 0


COMMANDS = {
    "run": cmd_run,
    "table": cmd_table,
    "papers": cmd_papers,
    "report": cmd_report,
    "list": cmd_list,
    "bench": cmd_bench,
    "extrapolate": cmd_extrapolate,
    "analyze": cmd_analyze,
    "principles": cmd_principles,
    "confusion": cmd_confusion,
    "check": cmd_check,
    "check-data": cmd_check_data,
    "reproduce": cmd_reproduce,
}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from pe_bench.adapters import UnknownEncodingError

    from .config import ConfigError
    from .grid.executor import ExecutorUnavailable

    try:
        return COMMANDS[args.command](args)
    except (UnknownEncodingError, ConfigError, ExecutorUnavailable, FileNotFoundError, KeyError, ValueError) as err:
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted: finished cells are kept; re-run the same command to complete the rest", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
