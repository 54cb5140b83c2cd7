"""Event-camera classification with Spiking Patches + ViT: ``dvsgesture`` (PaPE Table 1).

``paper`` reads DvsGesture's public release (:mod:`.events_aedat`), augments with NDA and
EventDrop (:mod:`pe_bench.tasks._shared.event_augment`) and tokenizes every sample on the fly; ``tiny`` uses
streams from the event-camera emulator (:mod:`.events_emulator`), tokenized once.
"""

from __future__ import annotations

import time
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field
from torch import nn
from torch.utils.data import Dataset, get_worker_info

from pe_bench.adapters import EncodingFactory, Geometry
from pe_bench.harness.config import RunConfig, Strict
from pe_bench.tasks._shared.event_augment import EventAugmentation
from pe_bench.tasks._shared.spiking_patches import EventTokens, SpikingPatches
from pe_bench.tasks._shared.spiking_patches_data import SpikingPatchesDataModule

from .._shared.data_checks import DataReport, refuse_moving_augmentations, scan_files, share_seen
from .._shared.motion import MOTIONS, MotionPath, check_held_out_paths, split_paths
from ..base import PatchTask
from .aedat import check_dvsgesture_classes, check_recording, cut, dvsgesture_root, dvsgesture_samples, read_aedat31
from .emulator import EMULATED_STEPS, Stream, motion_event_streams
from .vit import EVENT_GEOMETRY, EventViT, collate_tokens

# Mirror image of each DvsGesture class (0-based): left/right hand waves and circles swap.
DVSGESTURE_FLIP = (0, 2, 1, 6, 5, 4, 3, 7, 8, 9, 10)


class EventDataConfig(Strict):
    source: Literal["emulated", "dvsgesture"]
    num_classes: int
    width: int
    height: int
    threshold: int = 256  # sigma: events per token
    refractory_us: int = 100_000  # T
    buckets: int = 10  # log-spaced age buckets per polarity
    time_scale: float = 1 / 50_000  # token time (us) -> position units
    max_tokens: int = 0  # cap per sample (evenly spaced subset); 0 = no cap
    nda: bool = False
    event_drop: bool = False
    # dvsgesture only
    dataset_dir: str = "dvsgesture"
    val_users: list[int] = [21, 22, 23]
    # emulated only
    train_size: int = 0
    val_size: int = 0
    test_size: int = 0
    contrast: float = 0.25
    # A fraction of every motion class's flash paths (the cells that flash, in order) that
    # training and validation never show; the test split holds only those (motion.split_paths).
    # With 0 (the default) every test stream's path is also a training stream's (373 of the 384
    # paths of the 6x6 grid are in the tiny training set), so a lookup of paths scores as the
    # motion does.
    held_out_paths: float = Field(0.0, ge=0.0, lt=1.0)


class EventTokenDataset(Dataset):
    """Streams -> tokens. Without augmentation every sample is tokenized once and kept."""

    def __init__(
        self,
        load: Any,
        labels: list[int],
        tokenizer: SpikingPatches,
        max_tokens: int,
        augmentation: EventAugmentation | None = None,
        seed: int = 0,
    ) -> None:
        self.load, self.labels, self.tokenizer = load, labels, tokenizer
        self.max_tokens, self.augmentation, self.seed = max_tokens, augmentation, seed
        self.cache: dict[int, EventTokens] = {}
        self.epoch_draws = 0

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[EventTokens, int]:
        label = self.labels[i]
        if self.augmentation is None:
            if i not in self.cache:
                self.cache[i] = self._cap(self.tokenizer(*self.load(i)), None)
            return self.cache[i], label
        worker = get_worker_info()
        self.epoch_draws += 1
        rng = np.random.default_rng((self.seed, i, self.epoch_draws, worker.id if worker else 0))
        events = self.load(i)
        augmented, new_label = self.augmentation(events, label, rng)
        tokens = self.tokenizer(*augmented)
        if len(tokens) == 0:  # augmentation left too few events: use the sample as it is
            tokens, new_label = self.tokenizer(*events), label
        return self._cap(tokens, rng), new_label

    def _cap(self, tokens: EventTokens, rng: np.random.Generator | None) -> EventTokens:
        n = len(tokens)
        if not self.max_tokens or n <= self.max_tokens:
            return tokens
        if rng is None:
            keep = np.linspace(0, n - 1, self.max_tokens).round().astype(np.int64)
        else:
            keep = np.sort(rng.choice(n, self.max_tokens, replace=False))
        return EventTokens(tokens.x[keep], tokens.y[keep], tokens.t[keep], tokens.features[keep])


#: side of an emulated stream's grid cell in pixels (patches match it in the tiny profile)
EMULATED_CELL = 8


@lru_cache(maxsize=4)
def _emulated(
    count: int, num_classes: int, width: int, contrast: float, seed: int, paths: frozenset[MotionPath] | None
) -> tuple[list[Stream], list[int], list[MotionPath]]:
    streams, labels, drawn = motion_event_streams(
        count, num_classes, grid=width // EMULATED_CELL, cell=EMULATED_CELL, threshold=contrast, seed=seed, paths=paths
    )
    return streams, labels.tolist(), drawn


def held_out_split(data: EventDataConfig) -> tuple[frozenset, frozenset] | tuple[None, None]:
    """(seen, unseen) flash paths of ``data.held_out_paths`` (None, None without it)."""
    if not data.held_out_paths:
        return None, None
    return split_paths(data.num_classes, data.width // EMULATED_CELL, EMULATED_STEPS, data.held_out_paths)


@lru_cache(maxsize=2)
def _recording(path: Path) -> Stream:
    return read_aedat31(path)


class EventDataModule(SpikingPatchesDataModule):
    collate_fn = staticmethod(collate_tokens)
    data: EventDataConfig

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        d = self.data
        augmentation = None
        if d.nda or d.event_drop:
            flip = DVSGESTURE_FLIP if d.source == "dvsgesture" else None
            augmentation = EventAugmentation(d.width, d.height, d.nda, d.event_drop, flip)
        if d.source == "emulated":
            sizes = {"train": d.train_size, "val": d.val_size, "test": d.test_size}
            seen, unseen = held_out_split(d)
            paths = {}
            for offset, (name, count) in enumerate(sizes.items()):
                # Fixed data seeds per split: every method and seed sees the same streams.
                allowed = unseen if name == "test" else seen
                streams, labels, paths[name] = _emulated(
                    count, d.num_classes, d.width, d.contrast, 3000 + offset, allowed
                )
                aug = augmentation if name == "train" else None
                self.splits[name] = EventTokenDataset(
                    streams.__getitem__, labels, self.tokenizer(), d.max_tokens, aug, self.seed
                )
            self.test_paths_seen = share_seen(paths["train"], paths["test"])
            return
        release = dvsgesture_root(Path(self.data_root or ".") / d.dataset_dir)
        train = dvsgesture_samples(release, "train", d.num_classes)
        parts = {
            "train": [s for s in train if s[4] not in d.val_users],
            "val": [s for s in train if s[4] in d.val_users],
            "test": dvsgesture_samples(release, "test", d.num_classes),
        }
        for name, samples in parts.items():

            def load(i: int, samples: list = samples) -> Stream:
                path, _, start, end, _ = samples[i]
                return cut(_recording(path), start, end)

            aug = augmentation if name == "train" else None
            labels = [s[1] for s in samples]
            self.splits[name] = EventTokenDataset(load, labels, self.tokenizer(), d.max_tokens, aug, self.seed)

    def extra_results(self) -> dict[str, float]:
        """With ``data.held_out_paths``, the share of test streams whose flash path training
        showed (measured on the splits, 0 when the hold-out works)."""
        if self.data.source != "emulated" or not self.data.held_out_paths:
            return {}
        self.setup()
        return {"test_paths_seen_in_training": self.test_paths_seen}


def tokenizer_throughput(events: int = 2_000_000, repeats: int = 3, seed: int = 0) -> dict[str, float]:
    """Events/s of Spiking Patches on a DvsGesture-like stream (128 x 128, 6 s, sigma 256,
    T = 100 ms, patch 16), best of ``repeats``: token positions only, and with features.

    Rates per CPU second (process time of this single-threaded code) and per wall second:
    on a shared machine the wall rate also measures the neighbours, the CPU rate does not.
    """
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 128, events).astype(np.uint16)
    y = rng.integers(0, 128, events).astype(np.uint16)
    t = np.sort(rng.integers(0, 6_000_000, events)).astype(np.int64)
    p = rng.integers(0, 2, events).astype(bool)
    tokenizer = SpikingPatches(128, 128, 16, threshold=256, refractory_us=100_000, buckets=10)
    tokens = tokenizer(x, y, t, p)  # warm-up
    best = {"spikes_cpu": np.inf, "spikes_wall": np.inf, "full_cpu": np.inf, "full_wall": np.inf}
    for _ in range(repeats):
        for stage, run in (("spikes", lambda: tokenizer.spikes(x, y, t)), ("full", lambda: tokenizer(x, y, t, p))):
            cpu, wall = time.process_time(), time.perf_counter()
            run()
            best[f"{stage}_cpu"] = min(best[f"{stage}_cpu"], time.process_time() - cpu)
            best[f"{stage}_wall"] = min(best[f"{stage}_wall"], time.perf_counter() - wall)
    rates = {f"{key}_per_s": events / max(seconds, 1e-9) for key, seconds in best.items()}
    return {"events": events, "tokens": len(tokens), **rates}


class DvsGesture(PatchTask):
    DataModule = EventDataModule
    name = "dvsgesture"
    DataConfig = EventDataConfig
    data: EventDataConfig
    tiny_standin = "emulated event streams of a flashing disk in apparent motion (direction, rotation sense; 8 classes)"

    def __init__(self, config: RunConfig, data_root: Path | None = None) -> None:
        super().__init__(config, data_root)
        d, where = self.data, f"{config.task}/{config.profile}"
        grid = d.width // EMULATED_CELL
        check_held_out_paths(d.held_out_paths, d.source == "emulated", d.num_classes, grid, EMULATED_STEPS, where)
        if d.held_out_paths:  # NDA rolls, rotates and shears streams (EventDrop only removes events)
            refuse_moving_augmentations("data.held_out_paths", {"data.nda": d.nda}, where)

    def class_names(self) -> list[str] | None:
        """The generated motions' names (the real dataset's are not read here)."""
        return list(MOTIONS[: self.data.num_classes]) if self.data.source == "emulated" else None

    def geometry(self) -> Geometry:
        return EVENT_GEOMETRY

    def build_model(self, make_encoding: EncodingFactory) -> nn.Module:
        d, patch = self.data, self.config.model.patch_size
        shape = (2, d.buckets, patch, patch)
        return EventViT(make_encoding, self.geometry(), self.config.model, shape, d.time_scale, d.num_classes)

    def check_data(self, full: bool = False, workers: int = 1) -> DataReport:
        d, report = self.data, DataReport(self.name)
        if d.source != "dvsgesture":
            report.notes.append("emulated data: nothing on disk to check")
            return report
        release = dvsgesture_root(Path(self.data_root or ".") / d.dataset_dir)
        splits = check_dvsgesture_classes(release, d.num_classes)
        sizes = ", ".join(f"{len(samples)} {split}" for split, samples in splits.items())
        report.notes.append(f"{d.num_classes} classes in both splits; gestures: {sizes}")
        if full:
            windows: dict[Path, list[tuple[int, int]]] = {}
            for path, _, start, end, _ in (s for samples in splits.values() for s in samples):
                windows.setdefault(path, []).append((start, end))
            items = [(path, spans, d.width, d.height) for path, spans in windows.items()]
            report.checked, report.broken = len(items), scan_files(items, check_recording, workers)
        return report

    @classmethod
    def benchmark(cls, device: str = "cpu", compile: bool = False) -> str:
        r = tokenizer_throughput()
        return (
            "### Spiking Patches tokenizer (one CPU core, numpy)\n\n"
            f"Stream: {r['events']:,} uniform events on 128x128 over 6 s; sigma 256, T 100 ms, patch 16, "
            f"10 buckets -> {r['tokens']:,} tokens.\n\n"
            "| Stage | Events per CPU second | Events per wall second |\n|:--|--:|--:|\n"
            + "".join(
                f"| {label} | {r[f'{key}_cpu_per_s'] / 1e6:.1f} M | {r[f'{key}_wall_per_s'] / 1e6:.1f} M |\n"
                for label, key in (("token positions and times", "spikes"), ("tokens with features", "full"))
            )
        )
