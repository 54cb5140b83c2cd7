"""One process per cell: CellLock, and grids of several processes on one results folder."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import pytest
from tiny_grid import SMALL, cli_command, run_args

from pe_bench.harness.config import parse_overrides
from pe_bench.harness.grid import store
from pe_bench.harness.grid.methods import parse_methods
from pe_bench.harness.grid.runner import GridRequest, run_grid


def write_lock(cell, **owner) -> None:
    lock = store.CellLock(cell)
    lock.path.parent.mkdir(parents=True, exist_ok=True)
    fields = {"pid": 0, "host": store.HOST, "started": "then", "token": "theirs", "process_start": None}
    lock.path.write_text(json.dumps(fields | owner))


def test_lock_is_exclusive_and_released(tmp_path):
    cell = tmp_path / "runs" / "imagenet" / "rope" / "seed0"
    first, second = store.CellLock(cell), store.CellLock(cell)
    assert first.acquire()
    assert first.path == cell.with_name(".seed0.lock") and first.path.is_file()
    assert not second.acquire()
    assert second.owner.pid == os.getpid() and second.owner.host == store.HOST
    with pytest.raises(store.CellBusyError, match=f"pid {os.getpid()} on host"):
        second.__enter__()
    first.release()
    assert not first.path.exists()
    with second:
        assert second.held and not second.lost
    assert not second.path.exists()


def test_lock_of_a_process_that_is_gone_is_broken_with_a_message(tmp_path):
    finished = subprocess.Popen(["true"])
    finished.wait()
    cell = tmp_path / "seed0"
    write_lock(cell, pid=finished.pid)
    messages = []
    lock = store.CellLock(cell, say=messages.append)
    assert lock.acquire()
    assert len(messages) == 1 and "breaking the stale lock" in messages[0]
    assert f"process {finished.pid} is gone" in messages[0]
    lock.release()


def test_reused_pid_does_not_keep_a_lock_alive(tmp_path):
    """A restarted container reuses pids: the lock records its owner's start time too."""
    cell = tmp_path / "seed0"
    write_lock(cell, pid=os.getpid(), process_start="1")  # this pid, but another process
    lock = store.CellLock(cell, say=lambda message: None)
    assert lock.acquire()
    lock.release()


def test_lock_of_another_host_is_stale_only_without_heartbeat(tmp_path):
    cell = tmp_path / "seed0"
    write_lock(cell, pid=1, host="elsewhere")
    assert not store.CellLock(cell).acquire()  # its owner's pid means nothing here: heartbeat decides
    path = cell.with_name(".seed0.lock")
    two_minutes_ago = time.time() - 120
    os.utime(path, (two_minutes_ago, two_minutes_ago))
    assert not store.CellLock(cell).acquire()  # default: stale after 10 minutes
    messages = []
    lock = store.CellLock(cell, stale_after=60, say=messages.append)
    assert lock.acquire() and "no heartbeat for 2 min" in messages[0]
    lock.release()


def test_owner_touches_its_lock_while_holding_it(tmp_path):
    lock = store.CellLock(tmp_path / "seed0", heartbeat=0.05)
    with lock:
        long_ago = time.time() - 3600
        os.utime(lock.path, (long_ago, long_ago))
        time.sleep(0.5)
        assert time.time() - lock.path.stat().st_mtime < 60
    assert not lock.path.exists()


@pytest.mark.slow
def test_grid_passes_over_a_cell_locked_elsewhere_then_takes_it_over(tmp_path):
    """The owner's staging folder is left alone while it lives; when the owner ends without a
    result, the waiting grid breaks its lock and trains the cell itself."""
    owner = subprocess.Popen(["sleep", "4"])
    cell = store.cell_dir(tmp_path, "imagenet", "nopos", 0)
    write_lock(cell, pid=owner.pid)
    their_staging = cell.with_name(f".seed0.partial-{owner.pid}")
    their_staging.mkdir()
    messages = []

    def say(message):
        messages.append(message)
        if "running in another process" in message:
            assert their_staging.is_dir()

    overrides = parse_overrides([item for item in SMALL if item != "--set"])
    request = GridRequest(["imagenet"], parse_methods("nopos"), out=tmp_path, overrides=overrides, poll_seconds=0.2)
    try:
        records = run_grid(request, say=say)
    finally:
        owner.wait()
    assert f"running in another process (pid {owner.pid} on host {store.HOST}" in messages[0]
    assert any(f"process {owner.pid} is gone" in m for m in messages)
    assert [r.status for r in records] == ["ok"] and records[0].trained_by["pid"] == os.getpid()
    assert not their_staging.exists() and not cell.with_name(".seed0.lock").exists()


TRAINED = re.compile(r"\] imagenet · (\S+) · seed 0: Acc\. \(%\) [\d.]+ \(\d+s\)$", re.MULTILINE)


@pytest.mark.slow
def test_two_processes_on_one_folder_divide_the_cells(tmp_path):
    methods = ["nopos", "rope", "sincos", "abspos"]
    command = cli_command(*run_args(tmp_path, ",".join(methods)))
    processes = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(2)]  # fmt: skip
    outputs = [p.communicate(timeout=600) for p in processes]
    trained_by = {}
    for process, (out, err) in zip(processes, outputs, strict=True):
        assert process.returncode == 0, err
        assert "Error" not in err and "Traceback" not in err, err
        assert all(f"| {m} " in out for m in methods), out  # the complete table, in both
        for method in TRAINED.findall(out):
            assert method not in trained_by, f"{method} trained twice:\n{outputs}"
            trained_by[method] = process.pid
    assert sorted(trained_by) == sorted(methods), outputs
    for method, pid in trained_by.items():
        assert store.read_record(store.cell_dir(tmp_path, "imagenet", method, 0)).trained_by["pid"] == pid
    assert not list((tmp_path / "runs").glob("*/*/.seed*"))  # no lock or staging folder left


@pytest.mark.slow
def test_ctrl_c_keeps_nothing_of_the_interrupted_cell_and_exits_130(tmp_path):
    args = run_args(tmp_path, "nopos", "--set", "optim.epochs=300")
    # A suite started in the background (nohup, `&`) hands its children SIGINT ignored, and
    # Python then keeps ignoring it, as it should: give the child the default disposition.
    process = subprocess.Popen(
        cli_command(*args),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    folder = store.cell_dir(tmp_path, "imagenet", "nopos", 0).parent
    try:
        deadline = time.time() + 300
        while not list(folder.glob(".seed0.partial-*/best.ckpt")):  # inside Lightning's fit
            assert process.poll() is None and time.time() < deadline, process.communicate()
            time.sleep(0.2)
        # Ctrl-C, pressed again if the first one is not answered within 20 s (on a loaded CI
        # machine one SIGINT was lost once, and 300 epochs outlived the wait).
        for _ in range(5):
            process.send_signal(signal.SIGINT)
            try:
                out, err = process.communicate(timeout=20)
                break
            except subprocess.TimeoutExpired:
                continue
        else:
            out, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 130, (out, err)
    assert "interrupted: finished cells are kept" in err and "Traceback" not in err
    assert sorted(p.name for p in folder.iterdir()) == []  # no staging folder, no lock, no cell


def _finished_elsewhere(cell, request, epochs: int) -> None:
    """What another ``pe-bench run`` with ``optim.epochs=epochs`` leaves in ``cell``."""
    import yaml

    from pe_bench.harness.grid.runner import requested_run_config, resolved_config

    config = requested_run_config(request, "imagenet")
    config = config.model_copy(update={"optim": config.optim.model_copy(update={"epochs": epochs})})
    staging = store.staging_dir(cell)
    (staging / store.CONFIG).write_text(yaml.safe_dump(resolved_config(config, parse_methods("nopos")[0], {})))
    store.write_record(staging, store.CellRecord("imagenet", "nopos", 0, "tiny", store.STATUS_OK, score=33.0,
                                                 trained_by={"pid": 1, "host": "elsewhere"}))  # fmt: skip
    store.promote(staging, cell)


def test_a_cell_another_run_finished_with_other_settings_is_not_reported_as_this_runs(tmp_path):
    """Two runs with other settings start on one folder before either stored the cell: the
    grid-start check sees nothing, and the cell the other finishes was taken as this run's
    (audit, stop 71). Now it stops with the difference, whether the cell was finished before
    this run reached it or while it waited for the other's lock."""
    overrides = parse_overrides([item for item in SMALL if item != "--set"])  # optim.epochs=1
    request = GridRequest(["imagenet"], parse_methods("nopos"), out=tmp_path, overrides=overrides, poll_seconds=0.2)
    cell = store.cell_dir(tmp_path, "imagenet", "nopos", 0)
    from pe_bench.harness.grid.runner import claim_and_run

    _finished_elsewhere(cell, request, epochs=2)
    with pytest.raises(
        ValueError, match=r"trained by pid 1 on host elsewhere with another configuration .*optim\.epochs: 2"
    ):
        claim_and_run(request, ("imagenet", parse_methods("nopos")[0], 0), "cell", print)

    store.shutil.rmtree(cell)
    write_lock(cell, pid=os.getpid())  # a live owner: this run waits for it
    messages = []

    def say(message):
        messages.append(message)
        if "running in another process" in message:  # the other run finishes now, then lets go
            _finished_elsewhere(cell, request, epochs=2)
            cell.with_name(".seed0.lock").unlink()

    with pytest.raises(ValueError, match=r"with another configuration .*optim\.epochs: 2 stored, 1 requested"):
        run_grid(request, say=say)
    assert not any("done by" in m for m in messages)


def test_a_lock_of_another_pid_namespace_on_this_host_is_judged_by_its_heartbeat(tmp_path):
    """Containers on one host network share the hostname, not the pids: such a lock's pid 1 is
    not this namespace's pid 1 (audit, stop 71: broken while its owner ran). It is stale only
    when its heartbeat stops; a lock file of this namespace, or of pe-bench before stop 71
    (no pid_space), is still judged by its pid."""
    cell = store.cell_dir(tmp_path, "imagenet", "nopos", 0)
    write_lock(cell, pid=2**22 + 7, pid_space="another-boot/pid:[4026530000]")  # no such pid here
    lock = store.CellLock(cell, stale_after=60)
    assert not lock.acquire() and lock.owner.pid == 2**22 + 7  # fresh heartbeat: alive
    old = time.time() - 120
    os.utime(lock.path, (old, old))
    assert lock.acquire()  # its heartbeat stopped: stale
    lock.release()
    for space in (store.PROCESS_SPACE, None):
        fields = {"pid_space": space} if space is not None else {}
        write_lock(cell, pid=2**22 + 7, **fields)
        lock = store.CellLock(cell, stale_after=60)
        assert lock.acquire()  # this namespace's pid is gone: stale at once
        lock.release()


def test_every_staging_attempt_has_a_folder_of_its_own_and_leftovers_go(tmp_path):
    """Two attempts of one pid (two containers' pid 1) once shared `.seed0.partial-1`; a cell a
    crashed promotion left aside as `.seed0.replaced-*` was never removed."""
    cell = store.cell_dir(tmp_path, "imagenet", "nopos", 0)
    first = store.staging_dir(cell)
    (first / "metrics.csv").write_text("theirs")
    aside = cell.with_name(".seed0.replaced-1-deadbeef")
    aside.mkdir()
    second = store.staging_dir(cell)
    assert second != first and second.name.startswith(f".seed0.partial-{os.getpid()}-")
    assert not first.exists() and not aside.exists() and not list(second.iterdir())


def test_a_lock_broken_between_the_check_and_the_promotion_discards_the_result(tmp_path, monkeypatch):
    """The new owner's staging_dir removes this attempt's folder right after its lost-check:
    the promotion found nothing and the grid stopped with a FileNotFoundError traceback."""
    from pe_bench.harness.grid import runner

    cell = store.cell_dir(tmp_path, "imagenet", "nopos", 0)
    record = store.CellRecord("imagenet", "nopos", 0, "tiny", store.STATUS_OK, score=1.0)

    def train_then_lose(staging, *args, **kwargs):
        store.write_record(staging, record)
        store.staging_dir(cell)  # another owner starts its attempt now: ours is removed
        return record

    monkeypatch.setattr(runner, "_train_into", train_then_lose)
    overrides = parse_overrides([item for item in SMALL if item != "--set"])
    request = GridRequest(["imagenet"], parse_methods("nopos"), out=tmp_path, overrides=overrides)
    with pytest.raises(store.CellBusyError, match="was broken while this process trained it; result discarded"):
        runner.run_cell(request, "imagenet", parse_methods("nopos")[0], 0, None)
    assert not (cell / store.RECORD).exists()
