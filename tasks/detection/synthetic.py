"""The generated scenes of the tiny ``coco``: shapes whose class is where they lie relative to
a marker, on crops of scikit-image's photographs, written in the COCO 2017 layout.

Every image holds one marker (a white "plus" with a dark rim) inside one cell of the
backbone's patch grid (``cell`` pixels, the tiny profile's patch size), anywhere, and 2-4
objects: disks, squares and triangles of several sizes and colours. An object's class is the
quadrant it lies in as seen from the marker (above-left, above-right, below-left,
below-right); its box keeps out of the marker's row and column of cells, so every patch the
object touches sees the marker's patch at an offset whose two signs are the class. The shape
is a nuisance, not the class.

Why position matters: a position-free backbone sees the same set of patches whichever
quadrant an object is in, so it can find the objects but not name them. The tiny profile makes
the neck and the class branch pointwise (``model.neck_kernel`` and ``model.class_kernel`` 1),
so the detector cannot relate positions on its own either: 3x3 convolutions there see the
marker when it is near and read the image border from their zero padding, and with them nopos
scored 38 mAP against rope's 52 (an object's 8-pixel cell alone predicts its class 69% of the
time in a bounded image). With the pointwise path nopos names classes at chance. The box
branch keeps its 3x3 convolutions: localising is not what is tested. An encoding that knows
absolute positions (sincos, abspos) may still use that prior; one that sees only distances
(ALiBi, PaPE-RI) cannot tell the quadrants apart.

Generator 3 placed the marker and the objects at any pixel (objects 2 px clear of the
marker's centre row and column), so an object and the marker often shared a patch row and
the class hung on where each lay inside its patch: rope learnt it on one seed of three (31.5,
19.5, 18.0 mAP), sincos reached 38.7. Aligning the marker with the patch grid (generator 4)
makes the relation one between patches, as in the tiny ``imagenet``. Alternatives ("the
marker's row crosses the object"; "the colour of the nearest of four markers") were not learnt
by any encoding within a CPU budget (the latter: seed 0 nopos 14.1, rope 16.7 mAP after 12
epochs).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from pe_bench.harness.data import cache_root, package_version

from .._shared.data_checks import share_seen

CLASSES = ("above-left", "above-right", "below-left", "below-right")
#: Photographs bundled with scikit-image (no download): the backgrounds.
PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "camera", "coins", "immunohistochemistry", "brick", "grass")
#: Bump when the generator changes: the cache key includes it.
GENERATOR_VERSION = 4
#: Fixed seeds per split: every method and seed trains and tests on the same images.
SPLIT_SEEDS = {"train2017": 7000, "val2017": 7001}


@lru_cache(maxsize=1)
def _photos() -> tuple[np.ndarray, ...]:
    from skimage import data

    images = []
    for name in PHOTOS:
        image = getattr(data, name)().astype(np.float32) / 255.0
        if image.ndim == 2:
            image = np.repeat(image[..., None], 3, axis=-1)
        images.append(image[..., :3])
    return tuple(images)


def _background(rng: np.random.Generator, size: int) -> np.ndarray:
    """A random crop of a random photograph, resized to size x size, contrast halved so that
    the objects stand out but the background still has natural texture."""
    import torch
    import torch.nn.functional as F

    photo = _photos()[rng.integers(len(PHOTOS))]
    h, w = photo.shape[:2]
    side = int(rng.integers(min(h, w) // 4, min(h, w) + 1))
    top, left = rng.integers(0, h - side + 1), rng.integers(0, w - side + 1)
    crop = torch.from_numpy(np.ascontiguousarray(photo[top : top + side, left : left + side])).permute(2, 0, 1)
    resized = F.interpolate(crop[None], size=(size, size), mode="area")[0].permute(1, 2, 0).numpy()
    return 0.25 + 0.5 * resized


def _shape_mask(kind: int, w: int, h: int) -> np.ndarray:
    """(h, w) bool mask of a disk (0), square (1) or upward triangle (2) filling its box."""
    yy, xx = np.mgrid[0:h, 0:w] + 0.5
    u, v = xx / w, yy / h  # in [0, 1]
    if kind == 0:
        return (u - 0.5) ** 2 + (v - 0.5) ** 2 <= 0.25
    if kind == 1:
        return np.ones((h, w), dtype=bool)
    return np.abs(u - 0.5) <= 0.5 * v


def _paint(image: np.ndarray, mask: np.ndarray, top: int, left: int, colour: np.ndarray) -> None:
    """Fill ``mask`` with ``colour`` inside a 1-pixel rim of the complementary colour, so that
    an object is visible on any background and its box is exactly the painted pixels."""
    padded = np.pad(mask, 1)
    interior = mask & padded[:-2, 1:-1] & padded[2:, 1:-1] & padded[1:-1, :-2] & padded[1:-1, 2:]
    region = image[top : top + mask.shape[0], left : left + mask.shape[1]]
    region[mask & ~interior] = 1.0 - colour
    region[interior] = colour


@dataclass(frozen=True)
class SceneSpec:
    """What every generated scene of one dataset shares."""

    size: int  # image side, pixels
    objects: tuple[int, int]  # objects per image, inclusive range
    sides: tuple[int, int]  # box side, pixels, inclusive range
    cell: int  # the grid the marker sits inside one cell of: the backbone's patch size


@dataclass(frozen=True)
class Scene:
    image: np.ndarray  # (size, size, 3) float in [0, 1]
    boxes: list[tuple[int, int, int, int]]  # (x, y, w, h), pixels
    labels: list[int]  # indices into CLASSES
    marker: tuple[int, int]  # (row, col) of the marker's cell


def split_marker_cells(cells: int, held_out: float, seed: int = 4242) -> tuple[frozenset[int], frozenset[int]]:
    """(seen, unseen): the ``cells`` x ``cells`` marker cells (index row * cells + col) split so
    that a ``held_out`` fraction (at least one, and at least one left seen) is unseen. Fixed by
    ``seed`` alone: every method and seed holds out the same cells."""
    order = np.random.default_rng(seed).permutation(cells * cells)
    cut = min(max(1, round(held_out * cells * cells)), cells * cells - 1)
    return frozenset(int(c) for c in order[cut:]), frozenset(int(c) for c in order[:cut])


def relation_scene(rng: np.random.Generator, spec: SceneSpec, markers: frozenset[int] | None = None) -> Scene:
    """One image, its boxes and class indices, and the cell of the marker they relate to.

    The marker sits inside one cell of the ``cell``-pixel grid (the backbone's patch grid), and
    every object lies wholly in the cells strictly above or below the marker's row of cells
    and strictly left or right of its column: every patch an object touches then sees the
    marker's patch at an offset whose signs are the object's class. ``markers``: the cells the
    marker may sit in (None: any); restricted by rejection, so without it the draws are those
    of every stored record's scenes.
    """
    size, objects, sides, cell = spec.size, spec.objects, spec.sides, spec.cell
    if size % cell or size // cell < 3 or cell < 5:
        raise ValueError(f"the image side ({size}) must be a multiple of the cell ({cell} >= 5 px), 3 cells or more")
    image = _background(rng, size)
    cells = size // cell
    while True:
        col, row = (int(rng.integers(cells)) for _ in range(2))
        if markers is None or row * cells + col in markers:
            break
    # The largest even side below the cell (6 px in an 8-px cell): at least a pixel of margin on
    # each side, and the 3-px bars sit half a pixel off the square's centre.
    marker = (cell - 1) // 2 * 2
    half = marker // 2
    plus = np.zeros((marker, marker), dtype=bool)
    plus[half - 1 : half + 2, :] = True
    plus[:, half - 1 : half + 2] = True
    top, left = row * cell + (cell - marker) // 2, col * cell + (cell - marker) // 2
    _paint(image, plus, top, left, np.array([1.0, 1.0, 1.0]))
    band_x, band_y = (col * cell, (col + 1) * cell), (row * cell, (row + 1) * cell)  # the marker's column, row
    taken: list[tuple[int, int, int, int]] = []
    boxes: list[tuple[int, int, int, int]] = []
    labels: list[int] = []
    wanted = int(rng.integers(objects[0], objects[1] + 1))
    for _ in range(60 * wanted):
        if len(boxes) == wanted:
            break
        w, h = (int(rng.integers(sides[0], sides[1] + 1)) for _ in range(2))
        x, y = int(rng.integers(0, size - w + 1)), int(rng.integers(0, size - h + 1))
        right, below = x >= band_x[1], y >= band_y[1]
        if not (right or x + w <= band_x[0]) or not (below or y + h <= band_y[0]):
            continue  # reaches into the marker's row or column of cells: ambiguous at patch level
        if any(x < b[2] + 1 and b[0] < x + w + 1 and y < b[3] + 1 and b[1] < y + h + 1 for b in taken):
            continue  # overlaps (or touches) another object
        colour = rng.uniform(0.0, 1.0, 3)
        colour[rng.integers(3)] = rng.choice([0.05, 0.95])  # one saturated channel: visible on any background
        _paint(image, _shape_mask(int(rng.integers(3)), w, h), y, x, colour)
        taken.append((x, y, x + w, y + h))
        boxes.append((x, y, w, h))
        labels.append(2 * int(below) + int(right))
    return Scene(image, boxes, labels, (row, col))


def quantised(image: np.ndarray) -> np.ndarray:
    """The image as the PNG stores it: uint8."""
    return np.rint(np.clip(image, 0, 1) * 255).astype(np.uint8)


def object_placements(scene: Scene, cell: int) -> list[tuple[int, int]]:
    """Per object, (marker cell, cell of the box's centre), indices row * cells + col: the
    placement its class depends on, what a split's overlap with another is measured by."""
    cells = scene.image.shape[0] // cell
    marker = scene.marker[0] * cells + scene.marker[1]
    return [(marker, (y + h // 2) // cell * cells + (x + w // 2) // cell) for x, y, w, h in scene.boxes]


def write_coco_split(
    root: Path, split: str, count: int, spec: SceneSpec, markers: frozenset[int] | None = None
) -> list[tuple[int, int]]:
    """``count`` scenes as ``root/<split>/*.png`` and ``root/annotations/instances_<split>.json``;
    returns every object's placement (:func:`object_placements`)."""
    from PIL import Image

    (root / split).mkdir(parents=True, exist_ok=True)
    (root / "annotations").mkdir(exist_ok=True)
    images, annotations, placements = [], [], []
    for index, scene in enumerate(split_scenes(split, count, spec, markers)):
        placements += object_placements(scene, spec.cell)
        name = f"{index:012d}.png"
        Image.fromarray(quantised(scene.image)).save(root / split / name)
        images.append({"id": index + 1, "file_name": name, "width": spec.size, "height": spec.size})
        for (x, y, w, h), label in zip(scene.boxes, scene.labels, strict=True):
            annotations.append(
                {"id": len(annotations) + 1, "image_id": index + 1, "category_id": label + 1,
                 "bbox": [x, y, w, h], "area": w * h, "iscrowd": 0}
            )  # fmt: skip
    categories = [{"id": i + 1, "name": name, "supercategory": "shape"} for i, name in enumerate(CLASSES)]
    payload = {"images": images, "annotations": annotations, "categories": categories}
    (root / "annotations" / f"instances_{split}.json").write_text(json.dumps(payload))
    return placements


def split_scenes(split: str, count: int, spec: SceneSpec, markers: frozenset[int] | None = None) -> Iterator[Scene]:
    """The first ``count`` scenes of ``split``, one at a time: what write_coco_split writes and
    what a diagnostic regenerates (with the marker cells the files do not hold)."""
    rng = np.random.default_rng(SPLIT_SEEDS[split])
    for _ in range(count):
        yield relation_scene(rng, spec, markers)


#: written beside a held-out dataset's annotations: the hold-out and its measured overlap
HELD_OUT_FILE = "held_out.json"


def tiny_coco(train: int, test: int, spec: SceneSpec, cache: Path | None = None, held_out: float = 0.0) -> Path:
    """The generated dataset in the COCO 2017 layout (train2017/, val2017/, annotations/),
    written once per setting under the cache (atomically, so concurrent runs may share it).
    ``held_out``: a fraction of the marker cells that only the test split (val2017) uses; the
    share of test objects whose placement training shows is then written to ``HELD_OUT_FILE``."""
    settings = (GENERATOR_VERSION, train, test, spec.size, spec.objects, spec.sides, spec.cell)
    settings += (held_out,) if held_out else ()  # the default keeps its cache key
    # the backgrounds are scikit-image's photographs: scenes cached under another version are
    # other scenes, while the cell's data fingerprint names the version running now
    settings += (package_version("scikit-image"), PHOTOS)
    key = hashlib.sha1(repr(settings).encode()).hexdigest()[:12]
    root = (cache or cache_root()) / f"coco-tiny-{key}"
    if (root / "annotations" / "instances_val2017.json").is_file():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{root.name}.", dir=root.parent))
    try:
        seen, unseen = split_marker_cells(spec.size // spec.cell, held_out) if held_out else (None, None)
        trained = write_coco_split(staging, "train2017", train, spec, seen)
        tested = write_coco_split(staging, "val2017", test, spec, unseen)
        if held_out:
            overlap = {"held_out_marker_cells": held_out, "test_objects_seen_in_training": share_seen(trained, tested)}
            (staging / HELD_OUT_FILE).write_text(json.dumps(overlap))
        try:
            staging.rename(root)
        except OSError:  # another process finished first: keep its copy
            if not (root / "annotations" / "instances_val2017.json").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return root
