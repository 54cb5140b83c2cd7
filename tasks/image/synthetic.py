"""Generated position-sensitive images for the tiny image profile (no download).

Each image is a grid of patches on a noisy background. Two marker patches, an anchor A
and a target B, sit in two random cells (plus a few distractor cells); the label is the
direction from A to B, quantised into ``num_classes`` equal angular sectors. Every patch
is a clean copy of one of a few templates plus noise, aligned to the patch grid, so a
model without positions sees the same bag of patches for every label: ``nopos`` is at
chance by construction, and the gap to it measures what the position encoding adds.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset, Sampler


def _templates(patch: int, channels: int, rng: np.random.Generator) -> np.ndarray:
    """Three distinct, fixed patch templates: anchor, target, distractor."""
    yy, xx = np.mgrid[0:patch, 0:patch] / max(patch - 1, 1)
    plus = ((np.abs(yy - 0.5) < 0.2) | (np.abs(xx - 0.5) < 0.2)).astype(np.float32)
    cross = ((np.abs(yy - xx) < 0.2) | (np.abs(yy + xx - 1) < 0.2)).astype(np.float32)
    ring = (np.abs(np.hypot(yy - 0.5, xx - 0.5) - 0.35) < 0.15).astype(np.float32)
    colours = rng.uniform(0.5, 1.0, size=(3, channels)).astype(np.float32)
    return np.stack([shape[None] * colours[i][:, None, None] for i, shape in enumerate((plus, cross, ring))])


def relation_images(
    count: int,
    num_classes: int,
    grid: tuple[int, int] = (8, 8),
    patch: int = 4,
    channels: int = 3,
    distractors: int = 2,
    noise: float = 0.15,
    seed: int | list[int] = 0,
    pairs: frozenset[tuple[int, int]] | None = None,
) -> tuple[Tensor, Tensor]:
    """(count, C, H*patch, W*patch) float images and (count,) int64 labels, deterministic.
    ``pairs``: the (anchor cell, target cell) placements allowed (None: every one off a sector
    boundary); see :func:`split_pairs`."""
    images, labels, _ = relation_images_with_pairs(
        count, num_classes, grid, patch, channels, distractors, noise, seed, pairs
    )
    return images, labels


def relation_images_with_pairs(
    count: int,
    num_classes: int,
    grid: tuple[int, int],
    patch: int,
    channels: int,
    distractors: int,
    noise: float,
    seed: int | list[int],
    pairs: frozenset[tuple[int, int]] | None = None,
) -> tuple[Tensor, Tensor, list[tuple[int, int]]]:
    """:func:`relation_images` and the (anchor, target) cells of each image, the placement
    its label depends on (what a split's overlap with another is measured by)."""
    rng = np.random.default_rng(seed)
    templates = _templates(patch, channels, np.random.default_rng(1234))
    rows, cols = grid
    cells = rows * cols
    images = rng.normal(0.0, noise, size=(count, channels, rows * patch, cols * patch)).astype(np.float32)
    labels = np.empty(count, dtype=np.int64)
    placements = []
    for i in range(count):
        while True:
            a, b, *rest = rng.choice(cells, size=2 + distractors, replace=False)
            label = pair_label(int(a), int(b), cols, num_classes)
            # Reject pairs on a sector boundary (label None, ambiguous) and pairs outside the
            # split's placements: rejection keeps the draws of the unrestricted images unchanged.
            if label is not None and (pairs is None or (int(a), int(b)) in pairs):
                break
        labels[i] = label
        placements.append((int(a), int(b)))
        for cell, kind in [(a, 0), (b, 1)] + [(c, 2) for c in rest]:
            y, x = divmod(int(cell), cols)
            images[i, :, y * patch : (y + 1) * patch, x * patch : (x + 1) * patch] += templates[kind]
    return torch.from_numpy(images), torch.from_numpy(labels), placements


def pair_label(anchor: int, target: int, cols: int, num_classes: int) -> int | None:
    """The direction sector from the anchor cell to the target cell, None for a pair within
    2 % of a sector's width of a boundary (its label would be ambiguous)."""
    (ay, ax), (by, bx) = divmod(anchor, cols), divmod(target, cols)
    # Image rows grow downwards; flip y so that sector 0 starts at "east", counter-clockwise.
    angle = math.atan2(ay - by, bx - ax) % (2 * math.pi)
    frac = angle / (2 * math.pi / num_classes)
    if min(frac - math.floor(frac), math.ceil(frac) - frac) <= 0.02:
        return None
    return int(frac) % num_classes


def labelled_placements(grid: tuple[int, int], num_classes: int) -> Iterator[tuple[tuple[int, int], int]]:
    """Every (anchor, target) placement of ``grid`` off a sector boundary, with its label."""
    cells = grid[0] * grid[1]
    for a in range(cells):
        for b in range(cells):
            label = pair_label(a, b, grid[1], num_classes) if a != b else None
            if label is not None:
                yield (a, b), label


def split_pairs(
    grid: tuple[int, int], num_classes: int, held_out: float, seed: int = 4242
) -> tuple[frozenset[tuple[int, int]], frozenset[tuple[int, int]]]:
    """(seen, unseen): the labelled (anchor, target) placements of ``grid`` split so that a
    ``held_out`` fraction of every class's placements is unseen (at least one per class, and
    at least one left seen). Fixed by ``seed`` alone: every method and seed holds out the same."""
    rows, cols = grid
    by_class: dict[int, list[tuple[int, int]]] = {}
    for placement, label in labelled_placements(grid, num_classes):
        by_class.setdefault(label, []).append(placement)
    if len(by_class) < num_classes or min(map(len, by_class.values())) < 2:
        raise ValueError(
            f"a {rows}x{cols} grid has fewer than 2 placements in some of its {num_classes} direction sectors, "
            "so none can be held out: use a larger data.image_size or fewer data.num_classes"
        )
    rng = np.random.default_rng(seed)
    seen, unseen = set(), set()
    for label in sorted(by_class):
        placements = by_class[label]
        order = rng.permutation(len(placements))
        cut = min(max(1, round(held_out * len(placements))), len(placements) - 1)
        unseen.update(placements[i] for i in order[:cut])
        seen.update(placements[i] for i in order[cut:])
    return frozenset(seen), frozenset(unseen)


def placements_not_seen(
    grid: tuple[int, int], train_grid: tuple[int, int], seen: frozenset[tuple[int, int]], num_classes: int
) -> frozenset[tuple[int, int]]:
    """The labelled placements of ``grid`` (another resolution's patch grid) that are not among
    the ``seen`` placements of ``train_grid``: a cell is the same position in both when its row
    and column are (patch positions count from the top-left corner in every resolution). On the
    training grid itself this is the held-out set."""
    cols = grid[1]
    train_rows, train_cols = train_grid

    def on_train_grid(cell: int) -> int | None:
        y, x = divmod(cell, cols)
        return y * train_cols + x if y < train_rows and x < train_cols else None

    allowed = set()
    for (a, b), _ in labelled_placements(grid, num_classes):
        ta, tb = on_train_grid(a), on_train_grid(b)
        if ta is None or tb is None or (ta, tb) not in seen:
            allowed.add((a, b))
    return frozenset(allowed)


class FreshRelationImages(Dataset):
    """Relation images generated on demand, image ``i`` from its own seed: an unbounded training
    set, so that with :class:`EpochBlocks` no image is seen twice. A fixed training set lets a
    late seed fit its images by their placements instead of the relation (README, Stable
    seeds: SaPE² on imagenet); here it cannot. ``len`` is one epoch's worth; any index >= 0 is
    an image."""

    #: seed namespace of the fresh images (the fixed splits use the integer seeds 1000-1002).
    SEED = 7000

    def __init__(self, per_epoch: int, num_classes: int, grid: tuple[int, int], patch: int, channels: int,
                 distractors: int, noise: float, pairs: frozenset[tuple[int, int]] | None = None) -> None:  # fmt: skip
        self.per_epoch, self.pairs = per_epoch, pairs
        self.args = (num_classes, grid, patch, channels, distractors, noise)

    def __len__(self) -> int:
        return self.per_epoch

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        images, labels = relation_images(1, *self.args, seed=[self.SEED, int(i)], pairs=self.pairs)
        return images[0], labels[0]


class EpochBlocks(Sampler[int]):
    """Epoch e reads indices e*n ... (e+1)*n - 1 of a :class:`FreshRelationImages`, shuffled by the
    cell's seed: every epoch new images, the same ones for every method and seed. Lightning calls
    ``set_epoch`` on a loader's sampler before each training epoch."""

    def __init__(self, per_epoch: int, seed: int) -> None:
        self.per_epoch, self.seed, self.epoch = per_epoch, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.per_epoch

    def __iter__(self):
        # One generator per (seed, epoch): an epoch's order does not depend on the ones before.
        generator = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        order = torch.randperm(self.per_epoch, generator=generator)
        return iter((self.epoch * self.per_epoch + order).tolist())
