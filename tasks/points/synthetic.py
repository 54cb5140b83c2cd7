"""Generated stand-ins for ModelNet40 (shape classes) and ScanNet (rooms), for the tiny profiles.

Shapes: triangle meshes of eight solids, sampled uniformly on the surface with face normals.
Rooms: a floor, walls and furniture whose classes share local geometry (flat horizontal
boards, boxes, legs) but sit at characteristic heights and sizes - a bed at 0.5 m, a table
top at 0.75 m, a cabinet top at 0.9 m, shelves up to 1.8 m - so that, as PaPE Section 5.2
suggests for ScanNet, absolute height carries the class.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SHAPES = ("sphere", "cube", "cylinder", "cone", "torus", "pyramid", "octahedron", "dumbbell")
ROOM_CLASSES = ("floor", "wall", "bed", "table", "chair", "cabinet", "bookshelf")


def _grid_mesh(f, nu: int, nv: int, wrap_u: bool, wrap_v: bool) -> tuple[np.ndarray, np.ndarray]:
    """Triangulate a parametric surface f(u, v) on [0, 1]^2."""
    u = np.linspace(0, 1, nu + (0 if wrap_u else 1), endpoint=not wrap_u)
    v = np.linspace(0, 1, nv + (0 if wrap_v else 1), endpoint=not wrap_v)
    uu, vv = np.meshgrid(u, v, indexing="ij")
    verts = f(uu.ravel(), vv.ravel())
    cu, cv = len(u), len(v)
    faces = []
    for i in range(nu if wrap_u else nu):
        for j in range(nv if wrap_v else nv):
            a, b = i * cv + j, ((i + 1) % cu) * cv + j
            c, d = i * cv + (j + 1) % cv, ((i + 1) % cu) * cv + (j + 1) % cv
            faces += [(a, b, d), (a, d, c)]
    return verts, np.array(faces)


def _join(*meshes: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    verts, faces, offset = [], [], 0
    for v, f in meshes:
        verts.append(v)
        faces.append(f + offset)
        offset += len(v)
    return np.concatenate(verts), np.concatenate(faces)


def _disk(radius: float, z: float, n: int = 24) -> tuple[np.ndarray, np.ndarray]:
    t = np.linspace(0, 2 * np.pi, n, endpoint=False)
    verts = np.concatenate([[[0, 0, z]], np.stack([radius * np.cos(t), radius * np.sin(t), np.full(n, z)], 1)])
    return verts, np.array([(0, 1 + i, 1 + (i + 1) % n) for i in range(n)])


def _sphere(r: float = 1.0, centre=(0.0, 0.0, 0.0)) -> tuple[np.ndarray, np.ndarray]:
    def f(u, v):
        th, ph = np.pi * (0.001 + 0.998 * u), 2 * np.pi * v
        return np.stack([np.sin(th) * np.cos(ph), np.sin(th) * np.sin(ph), np.cos(th)], 1) * r + centre

    return _grid_mesh(f, 16, 24, False, True)


def _cylinder(r: float, z0: float, z1: float) -> tuple[np.ndarray, np.ndarray]:
    side = _grid_mesh(
        lambda u, v: np.stack([r * np.cos(2 * np.pi * v), r * np.sin(2 * np.pi * v), z0 + (z1 - z0) * u], 1),
        4, 24, False, True,
    )  # fmt: skip
    return _join(side, _disk(r, z0), _disk(r, z1))


def _polyhedron(verts, faces) -> tuple[np.ndarray, np.ndarray]:
    return np.asarray(verts, dtype=float), np.asarray(faces)


def shape_mesh(name: str) -> tuple[np.ndarray, np.ndarray]:
    if name == "sphere":
        return _sphere()
    if name == "cube":
        v = [(x, y, z) for x in (-1, 1) for y in (-1, 1) for z in (-1, 1)]
        f = [(0, 1, 3), (0, 3, 2), (4, 6, 7), (4, 7, 5), (0, 4, 5), (0, 5, 1),
             (2, 3, 7), (2, 7, 6), (0, 2, 6), (0, 6, 4), (1, 5, 7), (1, 7, 3)]  # fmt: skip
        return _polyhedron(v, f)
    if name == "cylinder":
        return _cylinder(0.6, -1.0, 1.0)
    if name == "cone":
        side = _grid_mesh(
            lambda u, v: np.stack([(1 - u) * np.cos(2 * np.pi * v), (1 - u) * np.sin(2 * np.pi * v), 2 * u - 1], 1),
            6, 24, False, True,
        )  # fmt: skip
        return _join(side, _disk(1.0, -1.0))
    if name == "torus":

        def f(u, v):
            a, b = 2 * np.pi * u, 2 * np.pi * v
            ring = 1 + 0.35 * np.cos(b)
            return np.stack([ring * np.cos(a), ring * np.sin(a), 0.35 * np.sin(b)], 1)

        return _grid_mesh(f, 24, 12, True, True)
    if name == "pyramid":
        v = [(-1, -1, -1), (1, -1, -1), (1, 1, -1), (-1, 1, -1), (0, 0, 1)]
        return _polyhedron(v, [(0, 2, 1), (0, 3, 2), (0, 1, 4), (1, 2, 4), (2, 3, 4), (3, 0, 4)])
    if name == "octahedron":
        v = [(1, 0, 0), (-1, 0, 0), (0, 1, 0), (0, -1, 0), (0, 0, 1), (0, 0, -1)]
        f = [(0, 2, 4), (2, 1, 4), (1, 3, 4), (3, 0, 4), (2, 0, 5), (1, 2, 5), (3, 1, 5), (0, 3, 5)]
        return _polyhedron(v, f)
    if name == "dumbbell":
        bar = _cylinder(0.15, -0.6, 0.6)
        return _join(_sphere(0.45, (0, 0, -0.9)), _sphere(0.45, (0, 0, 0.9)), bar)
    raise ValueError(f"unknown shape {name!r}")


def sample_surface(verts: np.ndarray, faces: np.ndarray, n: int, rng: np.random.Generator):
    """n points uniform on the mesh surface and their (unsigned-consistent) face normals."""
    tri = verts[faces]  # (F, 3, 3)
    cross = np.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0])
    area = np.linalg.norm(cross, axis=1)
    face = rng.choice(len(faces), size=n, p=area / area.sum())
    r1, r2 = rng.random(n), rng.random(n)
    s = np.sqrt(r1)
    w = np.stack([1 - s, s * (1 - r2), s * r2], 1)
    points = (tri[face] * w[:, :, None]).sum(1)
    normals = cross[face] / np.maximum(area[face], 1e-12)[:, None]
    return points.astype(np.float32), normals.astype(np.float32)


@dataclass(frozen=True)
class ShapeDraw:
    """One generated shape and the draws that made it (what a split audit compares)."""

    label: int
    rotation: np.ndarray  # (3, 3) heading about z times the tilt, applied after the stretch
    viewpoint: np.ndarray  # (3,) the scanner's position, 4 units from the origin
    points: np.ndarray  # (num_points, 3) the partial scan: the points nearest the viewpoint
    normals: np.ndarray  # (num_points, 3) float32 unit normals


def shape_draws(count: int, num_points: int, num_classes: int, seed: int) -> list[ShapeDraw]:
    """``count`` shapes (balanced classes, shuffled), deterministic in ``seed``.

    Each shape gets a random anisotropic stretch, a small tilt and any rotation about the
    vertical axis before sampling, so instances of a class differ and headings are arbitrary;
    only the half of the surface facing a random viewpoint is kept (a partial scan).
    """
    if not 2 <= num_classes <= len(SHAPES):
        raise ValueError(f"the shape stand-in has 2 to {len(SHAPES)} classes, got {num_classes}")
    rng = np.random.default_rng(seed)
    meshes = [shape_mesh(name) for name in SHAPES[:num_classes]]
    labels = np.arange(count) % num_classes
    rng.shuffle(labels)
    draws = []
    for label in labels:
        verts, faces = meshes[label]
        stretch = rng.uniform(0.75, 1.3, 3)
        tilt = _rotation(rng.uniform(-0.2, 0.2), axis=0) @ _rotation(rng.uniform(-0.2, 0.2), axis=1)
        rotation = _rotation(rng.uniform(-np.pi, np.pi), axis=2) @ tilt  # any heading, test shapes too
        points, normals = sample_surface((verts * stretch) @ rotation.T, faces, 2 * num_points, rng)
        normals = normals / stretch  # normals transform with the inverse stretch
        normals = normals @ rotation.T
        normals /= np.linalg.norm(normals, axis=1, keepdims=True)
        # A partial view, as from one scanner position: keep the num_points nearest a random
        # far-away viewpoint, so a random side of the shape is missing (harder than complete shapes).
        view = rng.normal(size=3)
        view *= 4.0 / np.linalg.norm(view)
        keep = np.argsort(((points - view) ** 2).sum(1))[:num_points]
        draws.append(ShapeDraw(int(label), rotation, view, points[keep], normals[keep].astype(np.float32)))
    return draws


def shape_dataset(count: int, num_points: int, num_classes: int, seed: int):
    """:func:`shape_draws` as the task reads them: a list of (points (n, 3), normals (n, 3))
    and the (count,) labels."""
    draws = shape_draws(count, num_points, num_classes, seed)
    return [(d.points, d.normals) for d in draws], np.array([d.label for d in draws], dtype=np.int64)


def _rotation(angle: float, axis: int) -> np.ndarray:
    c, s = np.cos(angle), np.sin(angle)
    i, j = [a for a in range(3) if a != axis]
    r = np.eye(3)
    r[i, i], r[i, j], r[j, i], r[j, j] = c, -s, s, c
    return r


def _box_surface(lo, hi, density: float, rng: np.random.Generator, top_only: bool = False):
    """Points on the faces of an axis-aligned box (bottom face left out: it rests on something)."""
    lo, hi = np.asarray(lo, float), np.asarray(hi, float)
    size = hi - lo
    pts, nrm = [], []
    faces = [(2, 1)] if top_only else [(2, 1), (0, -1), (0, 1), (1, -1), (1, 1)]
    for axis, sign in faces:
        others = [a for a in range(3) if a != axis]
        area = size[others[0]] * size[others[1]]
        n = rng.poisson(density * area)
        p = lo + rng.random((n, 3)) * size
        p[:, axis] = hi[axis] if sign > 0 else lo[axis]
        normal = np.zeros((n, 3))
        normal[:, axis] = sign
        pts.append(p)
        nrm.append(normal)
    return np.concatenate(pts), np.concatenate(nrm)


def _legs(lo, hi, height: float, density: float, rng: np.random.Generator, thickness: float = 0.05):
    parts = [
        _box_surface((x, y, 0.0), (x + thickness, y + thickness, height), density, rng)
        for x in (lo[0], hi[0] - thickness)
        for y in (lo[1], hi[1] - thickness)
    ]
    return np.concatenate([p for p, _ in parts]), np.concatenate([n for _, n in parts])


def _furniture(kind: str, x: float, y: float, rng: np.random.Generator, density: float):
    """Surface points of one piece of furniture whose footprint starts at (x, y)."""
    jitter = rng.uniform(0.9, 1.1)
    if kind == "bed":
        w, d, h = 1.4 * jitter, 2.0 * jitter, 0.5 * jitter
        return _box_surface((x, y, 0), (x + w, y + d, h), density, rng)
    if kind == "table":
        w, d, h = 1.2 * jitter, 0.8 * jitter, 0.75 * jitter
        top = _box_surface((x, y, h - 0.04), (x + w, y + d, h), density, rng)
        legs = _legs((x, y), (x + w, y + d), h - 0.04, density, rng)
        return np.concatenate([top[0], legs[0]]), np.concatenate([top[1], legs[1]])
    if kind == "chair":
        w, h = 0.45 * jitter, 0.45 * jitter
        seat = _box_surface((x, y, h - 0.04), (x + w, y + w, h), density, rng)
        back = _box_surface((x, y + w - 0.05, h), (x + w, y + w, 0.9 * jitter), density, rng)
        legs = _legs((x, y), (x + w, y + w), h - 0.04, density, rng)
        return tuple(np.concatenate(parts) for parts in zip(seat, back, legs, strict=True))
    if kind == "cabinet":
        w, d, h = 0.8 * jitter, 0.5 * jitter, 0.9 * jitter
        return _box_surface((x, y, 0), (x + w, y + d, h), density, rng)
    if kind == "bookshelf":
        w, d, h = 0.9 * jitter, 0.35 * jitter, 1.8 * jitter
        frame = _box_surface((x, y, 0), (x + w, y + d, h), density, rng)
        boards = [
            _box_surface((x, y, z - 0.03), (x + w, y + d, z), density, rng, top_only=True) for z in (0.45, 0.9, 1.35)
        ]
        return tuple(np.concatenate(parts) for parts in zip(frame, *boards, strict=True))
    raise ValueError(kind)


def room(rng: np.random.Generator, density: float = 60.0):
    """One generated room: coord (n, 3) with the floor at z = 0, normal (n, 3), colour (n, 3) in
    [0, 255] (per object, not per class), segment (n,) index into ROOM_CLASSES."""
    size_x, size_y, wall_h = rng.uniform(3.5, 5.5), rng.uniform(3.5, 5.5), rng.uniform(1.6, 2.2)
    parts = [("floor", *_box_surface((0, 0, -0.02), (size_x, size_y, 0), density / 2, rng, top_only=True))]
    for axis, at, sign in ((0, 0.0, 1), (0, size_x, -1), (1, 0.0, 1), (1, size_y, -1)):
        lo = [0.0, 0.0, 0.0]
        hi = [size_x, size_y, wall_h]
        lo[axis], hi[axis] = at, at
        n = rng.poisson(density / 2 * (hi[1 - axis] - lo[1 - axis]) * wall_h)
        p = np.asarray(lo) + rng.random((n, 3)) * (np.asarray(hi) - np.asarray(lo))
        normal = np.zeros((n, 3))
        normal[:, axis] = sign
        parts.append(("wall", p, normal))
    kinds = ["bed", "table", "chair", "chair", "cabinet", "bookshelf"]
    kinds += list(rng.choice(["table", "chair", "cabinet", "bookshelf", "bed"], size=rng.integers(0, 3)))
    for kind in kinds:
        x, y = rng.uniform(0.1, size_x - 2.2), rng.uniform(0.1, size_y - 2.2)
        parts.append((kind, *_furniture(str(kind), x, y, rng, density)))
    coords, normals, colours, labels = [], [], [], []
    for kind, p, n in parts:
        coords.append(p)
        normals.append(n)
        base = rng.uniform(40, 215, 3)
        colours.append(np.clip(base + rng.normal(0, 12, (len(p), 3)), 0, 255))
        labels.append(np.full(len(p), ROOM_CLASSES.index(kind)))
    coord = np.concatenate(coords).astype(np.float32)
    coord[:, :2] -= coord[:, :2].mean(0)
    return {
        "coord": coord,
        "normal": np.concatenate(normals).astype(np.float32),
        "color": np.concatenate(colours).astype(np.float32),
        "segment": np.concatenate(labels).astype(np.int64),
    }


def room_dataset(count: int, seed: int, density: float = 60.0) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [room(rng, density) for _ in range(count)]
