"""dvsgesture: Spiking Patches, the emulator, AEDAT 3.1, augmentations, padding, end to end."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from pe_bench.adapters import EncodingFactory
from pe_bench.harness.cli import main
from pe_bench.harness.config import load_run_config
from pe_bench.harness.data import DatasetMissingError
from pe_bench.harness.grid import store
from pe_bench.tasks import get_task
from pe_bench.tasks._shared.event_augment import EventAugmentation
from pe_bench.tasks._shared.event_emulator import emulate_events
from pe_bench.tasks._shared.spiking_patches import SpikingPatches, reference_tokens
from pe_bench.tasks.events.aedat import dvsgesture_root, dvsgesture_samples, read_aedat31, write_aedat31
from pe_bench.tasks.events.emulator import motion_event_streams
from pe_bench.tasks.events.task import EventDataModule, EventTokenDataset
from pe_bench.tasks.events.vit import collate_tokens


def stream(t, x=None, y=None, p=None):
    t = np.asarray(t, dtype=np.int64)
    zeros = np.zeros(len(t), dtype=np.int64)
    return (
        zeros if x is None else np.asarray(x),
        zeros if y is None else np.asarray(y),
        t,
        zeros if p is None else np.asarray(p),
    )


def test_patch_spikes_every_sigma_events_at_the_last_event_time():
    tokenizer = SpikingPatches(8, 8, 8, threshold=4, refractory_us=0, buckets=3)
    tokens = tokenizer(*stream([0, 1, 2, 3, 4, 5, 6, 7, 8, 9]))
    assert tokens.t.tolist() == [3, 7]  # the 9th and 10th events wait for two more
    assert tokens.features.sum(axis=(1, 2, 3, 4)).tolist() == [4, 4]


def test_refractory_period_drops_events_closer_than_T_to_the_spike():
    tokenizer = SpikingPatches(8, 8, 8, threshold=2, refractory_us=100, buckets=3)
    # spike at 10; 50 and 109 fall in the refractory period; 110 (exactly T later) counts;
    # after the spike at 120, 200 is refractory again.
    tokens = tokenizer(*stream([0, 10, 50, 109, 110, 120, 200, 300, 310]))
    assert tokens.t.tolist() == [10, 120, 310]
    assert tokenizer(*stream([0, 10, 50])).t.tolist() == [10]


def test_token_positions_are_patch_column_row_and_times_are_ordered():
    tokenizer = SpikingPatches(32, 16, 8, threshold=2, refractory_us=0, buckets=2)
    # patch (col 3, row 1) spikes at t=5, patch (col 0, row 0) at t=7
    x, y, t = [25, 1, 30, 2], [9, 1, 15, 3], [1, 2, 5, 7]
    tokens = tokenizer(*stream(t, x, y))
    assert tokens.x.tolist() == [3, 0] and tokens.y.tolist() == [1, 0] and tokens.t.tolist() == [5, 7]


def test_features_count_events_per_polarity_age_bucket_and_pixel():
    tokenizer = SpikingPatches(4, 4, 4, threshold=3, refractory_us=0, buckets=3, time_base_us=1000)
    # ages before the spike at 5000: 5000 (bucket 2: >= 2 ms), 1500 (bucket 1), 0 (bucket 0)
    tokens = tokenizer(*stream([0, 3500, 5000], x=[1, 2, 3], y=[0, 1, 2], p=[1, 0, 1]))
    f = tokens.features[0]
    assert f.shape == (2, 3, 4, 4) and f.sum() == 3
    assert f[1, 2, 0, 1] == 1 and f[0, 1, 1, 2] == 1 and f[1, 0, 2, 3] == 1


@pytest.mark.parametrize("seed", range(4))
def test_vectorised_tokenizer_equals_the_per_event_loop(seed):
    rng = np.random.default_rng(seed)
    n = 2000
    x, y = rng.integers(0, 24, n).astype(np.uint16), rng.integers(0, 17, n).astype(np.uint16)
    t, p = np.sort(rng.integers(0, 50_000, n)), rng.integers(0, 2, n).astype(bool)
    tokenizer = SpikingPatches(24, 17, 8, int(rng.integers(1, 30)), int(rng.integers(0, 3000)), 4, 100)
    fast, slow = tokenizer(x, y, t, p), reference_tokens(tokenizer, x, y, t, p)
    assert len(fast) == len(slow) > 0
    for name in ("x", "y", "t", "features"):
        np.testing.assert_array_equal(getattr(fast, name), getattr(slow, name), err_msg=name)


def test_tokenizer_rejects_unsorted_streams_and_handles_empty_ones():
    tokenizer = SpikingPatches(8, 8, 8, threshold=2)
    with pytest.raises(ValueError, match="sorted"):
        tokenizer(*stream([5, 1, 2]))
    empty = tokenizer(*stream([]))
    assert len(empty) == 0 and empty.features.shape == (0, 2, 10, 8, 8)


def test_emulator_emits_one_event_per_contrast_step_with_interpolated_times():
    frames = np.full((2, 1, 2), 0.1)
    frames[1, 0, 0] = 0.1 * np.exp(0.55)  # +0.55 in log: two ON events at C = 0.25
    frames[1, 0, 1] = 0.1 * np.exp(-0.3)  # -0.3: one OFF event
    x, y, t, p = emulate_events(frames, np.array([0, 1100]), threshold=0.25, eps=0.0)
    assert sorted(zip(t.tolist(), x.tolist(), p.tolist(), strict=True)) == [
        (500, 0, True),
        (917, 1, False),
        (1000, 0, True),
    ]


def test_emulated_streams_are_balanced_sorted_and_deterministic():
    streams, labels, _ = motion_event_streams(16, 8, frames=12, seed=1)
    again, _, _ = motion_event_streams(16, 8, frames=12, seed=1)
    assert np.bincount(labels).tolist() == [2] * 8
    assert all(len(s[2]) > 100 and np.all(np.diff(s[2]) >= 0) for s in streams)
    np.testing.assert_array_equal(streams[3][2], again[3][2])


def _nearest_mean_accuracy(train, train_labels, test, test_labels):
    mean, std = train.mean(0), train.std(0) + 1e-6
    train, test = (train - mean) / std, (test - mean) / std
    centres = np.stack([train[train_labels == k].mean(0) for k in range(8)])
    predicted = np.argmin(((test[:, None] - centres[None]) ** 2).sum(-1), axis=1)
    return float((predicted == test_labels).mean())


def test_emulated_token_contents_do_not_reveal_the_class_but_positions_do():
    """What nopos sees (the bag of token features) is at chance; where and when is not."""
    tokenizer = SpikingPatches(48, 48, 8, threshold=32, refractory_us=20_000, buckets=8)

    def summaries(seed):
        streams, labels, _ = motion_event_streams(160, 8, seed=seed)
        bags, moves = [], []
        for events in streams:
            tokens = tokenizer(*events)
            f = np.log1p(tokens.features.reshape(len(tokens), -1))
            bags.append(np.concatenate([f.mean(0), f.max(0), [len(tokens)]]))
            t, x, y = tokens.t - tokens.t.mean(), tokens.x - tokens.x.mean(), tokens.y - tokens.y.mean()
            moves.append(
                [(t * x).sum(), (t * y).sum(), np.abs(np.diff(tokens.x)).sum(), np.abs(np.diff(tokens.y)).sum()]
            )
        return np.array(bags), np.array(moves), labels

    train_bags, train_moves, train_labels = summaries(1)
    test_bags, test_moves, test_labels = summaries(2)
    assert _nearest_mean_accuracy(train_bags, train_labels, test_bags, test_labels) < 0.25  # chance: 0.125
    assert _nearest_mean_accuracy(train_moves, train_labels, test_moves, test_labels) > 0.35


def write_release(root, recordings):
    """A DvsGesture release with ``recordings`` = {name: [(class, start, end), ...]}."""
    release = root / "dvsgesture" / "DvsGesture"
    release.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name, gestures in recordings.items():
        n = 3000
        t = np.sort(rng.integers(0, 4_000_000, n)) + (1 << 31)  # past the 31-bit overflow
        x, y = rng.integers(0, 128, n), rng.integers(0, 128, n)
        write_aedat31(release / f"{name}.aedat", x, y, t, rng.integers(0, 2, n).astype(bool), packet=1000)
        rows = [f"{c},{(1 << 31) + s},{(1 << 31) + e}" for c, s, e in gestures]
        (release / f"{name}_labels.csv").write_text("class,startTime_usec,endTime_usec\n" + "\n".join(rows) + "\n")
    for split, users in (("train", ("user01", "user21")), ("test", ("user24",))):
        names = [f"{n}.aedat" for n in recordings if n.split("_")[0] in users]
        (release / f"trials_to_{split}.txt").write_text("\n".join(names) + "\n")
    return release


def test_aedat31_roundtrip_skips_other_packets_and_invalid_events(tmp_path):
    rng = np.random.default_rng(1)
    n = 500
    x, y = rng.integers(0, 128, n).astype(np.uint16), rng.integers(0, 128, n).astype(np.uint16)
    t, p = np.sort(rng.integers(0, 3 << 31, n)).astype(np.int64), rng.integers(0, 2, n).astype(bool)
    path = tmp_path / "a.aedat"
    write_aedat31(path, x, y, t, p, packet=128)
    # Append a special-event packet (type 0) and a polarity packet holding one invalid event.
    extra = np.array([[0, 5]], dtype="<u4").tobytes()
    invalid = np.array([[(3 << 17) | (4 << 2), int(t[-1] % (1 << 31))]], dtype="<u4").tobytes()
    header = np.array([0, 1], dtype="<u2").tobytes() + np.array([8, 4, 0, 1, 1, 1], dtype="<u4").tobytes()
    bad = np.array([1, 1], dtype="<u2").tobytes() + np.array([8, 4, t[-1] >> 31, 1, 1, 0], dtype="<u4").tobytes()
    path.write_bytes(path.read_bytes() + header + extra + bad + invalid)
    rx, ry, rt, rp = read_aedat31(path)
    np.testing.assert_array_equal(rt, t)
    np.testing.assert_array_equal(rx, x)
    np.testing.assert_array_equal(ry, y)
    np.testing.assert_array_equal(rp, p)


def test_dvsgesture_release_gives_user_split_samples_with_rebased_times(tmp_path):
    release = write_release(
        tmp_path,
        {"user01_led": [(1, 0, 1_000_000), (3, 1_500_000, 3_000_000)], "user21_led": [(2, 0, 2_000_000)],
         "user24_natural": [(11, 500_000, 2_500_000)]},
    )  # fmt: skip
    assert [(s[1], s[4]) for s in dvsgesture_samples(release, "train")] == [(0, 1), (2, 1), (1, 21)]
    # 3000 events per recording: a low threshold so that the fixture yields tokens.
    config = load_run_config("dvsgesture", "paper", {"data": {"threshold": 4, "refractory_us": 1000}})
    module = EventDataModule(get_task("dvsgesture")(config).data, 16, 2, 0, 0, tmp_path)
    module.setup()
    assert [len(module.splits[s]) for s in ("train", "val", "test")] == [2, 1, 1]
    batch, labels = next(iter(module.val_dataloader()))
    assert labels.tolist() == [1] and batch.features.shape[2:] == (2, 10, 16, 16)
    assert batch.coords[..., 2].max() <= 2_000_000  # times relative to the gesture start
    batch, labels = next(iter(module.train_dataloader()))  # NDA + EventDrop path
    assert batch.valid.any(dim=1).all()


def test_missing_dvsgesture_names_the_path_and_the_layout(tmp_path):
    with pytest.raises(DatasetMissingError) as err:
        dvsgesture_root(tmp_path / "dvsgesture")
    message = str(err.value)
    assert str(tmp_path / "dvsgesture" / "DvsGesture" / "trials_to_train.txt") in message
    assert "_labels.csv" in message and "ibm.com" in message
    code = main(["run", "--tasks", "dvsgesture", "--methods", "rope", "--profile", "paper",
                 "--data-root", str(tmp_path), "--out", str(tmp_path / "out")])  # fmt: skip
    assert code != 0


def test_augmentations_keep_streams_sorted_and_on_the_sensor():
    streams, labels, _ = motion_event_streams(4, 8, frames=12, seed=2)
    augment = EventAugmentation(48, 48, nda=True, event_drop=True, flip_labels=list(range(8))[::-1])
    for i in range(20):
        (x, y, t, p), label = augment(streams[i % 4], int(labels[i % 4]), np.random.default_rng(i))
        assert np.all(np.diff(t) >= 0) and len(x) == len(y) == len(t) == len(p)
        assert x.min(initial=0) >= 0 and x.max(initial=0) < 48 and y.max(initial=0) < 48
        assert 0 <= label < 8


def test_padding_masks_variable_length_tokens_and_changes_nothing():
    config = load_run_config("dvsgesture", "tiny", {"model": {"dim": 32, "depth": 2, "head_init": "default"}})
    task = get_task("dvsgesture")(config)
    streams, labels, _ = motion_event_streams(3, 8, frames=12, seed=3)
    tokenizer = SpikingPatches(48, 48, 8, 32, 20_000, 8)
    data = EventTokenDataset(streams.__getitem__, labels.tolist(), tokenizer, max_tokens=0)
    items = [data[i] for i in range(3)]
    lengths = [len(tokens) for tokens, _ in items]
    assert len(set(lengths)) > 1
    batch, _ = collate_tokens(items)
    assert batch.valid.sum(1).tolist() == lengths and batch.features[~batch.valid].abs().sum() == 0
    for method in ("rope", "pape", "alibi"):
        torch.manual_seed(0)
        model = task.build_model(EncodingFactory(method, config.methods.get(method, {}))).eval()
        with torch.no_grad():
            together = model(batch)
            alone = torch.cat([model(collate_tokens([item])[0]) for item in items])
        torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-4, msg=method)


def test_tokenizer_benchmark_reports_events_per_second(monkeypatch):
    from pe_bench.tasks.events import task as events

    full = events.tokenizer_throughput
    monkeypatch.setattr(events, "tokenizer_throughput", lambda: full(events=300_000, repeats=1))
    report = get_task("dvsgesture").benchmark("cpu")
    assert "Events per CPU second" in report and "tokens with features" in report


def test_dvsgesture_tiny_cell_end_to_end(tmp_path):
    small = ["--set", "optim.epochs=1", "--set", "data.train_size=64", "--set", "data.val_size=16",
             "--set", "data.test_size=16", "--set", "model.dim=32", "--set", "model.depth=1",
             "--set", "data.nda=true", "--set", "data.event_drop=true"]  # fmt: skip
    assert main(["run", "--tasks", "dvsgesture", "--methods", "pape", "--out", str(tmp_path), *small]) == 0
    record = json.loads((store.cell_dir(tmp_path, "dvsgesture", "pape", 0) / "result.json").read_text())
    assert record["status"] == "ok" and 0 <= record["score"] <= 100
