"""What a trained tiny-``coco`` backbone does with the marker: a diagnostic for the README's claims.

The class of an object in the tiny scenes is its quadrant seen from the marker's patch, so a
backbone that names classes must bring, into every object token, which way the marker lies.
For a finished cell this measures, on the test scenes (the real loader path):

* per layer and head, the attention from each object's centre token to the marker's token,
  relative to uniform attention (1.0 = 1/N), averaged per class: a head that finds the
  marker by content shows values far above 1; one whose value depends on the class finds it
  in a direction;
* per layer and head, the mean attended distance in patches (the attention-weighted distance
  from query to key; ViT's "mean attention distance", Dosovitskiy et al. 2021, Fig. 7);
* per layer, how well a linear probe (multinomial logistic regression, trained on 70% of the
  objects, scored on the rest) reads the class from the object's centre token: chance is
  about 0.25; a backbone that has related the object to the marker approaches 1.

    python -m pe_bench.harness.reports.marker_probe RESULTS/runs/coco/pape/seed0 [...]
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from pe_bench.adapters import PositionLayout
from pe_bench.tasks.detection.synthetic import SceneSpec, split_scenes

from ..attention import Attention


@dataclass(frozen=True)
class ProbeResult:
    marker_attention: np.ndarray  # (layers, heads, classes): attention to the marker x N
    attended_distance: np.ndarray  # (layers, heads): patches
    probe_accuracy: np.ndarray  # (layers,): held-out accuracy of the class from the token
    objects: int


class _Recorder:
    """Forward hooks that keep each attention layer's probabilities and each block's output."""

    def __init__(self, model: nn.Module) -> None:
        self.attention: list[Tensor] = []
        self.tokens: list[Tensor] = []
        self.handles = [
            module.register_forward_hook(self._attention, with_kwargs=True)
            for module in model.modules()
            if isinstance(module, Attention)
        ]
        self.handles += [block.register_forward_hook(self._block) for block in model.encoder.blocks]

    def _attention(self, module: Attention, args: tuple, kwargs: dict, out: Tensor) -> None:
        x, layout = args[0], args[1]
        self.attention.append(module.logits(x, layout).softmax(-1))

    def _block(self, module: nn.Module, args: tuple, out: Tensor) -> None:
        self.tokens.append(out)

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()


def linear_probe_accuracy(features: Tensor, labels: Tensor, classes: int, train_fraction: float = 0.7) -> float:
    """Held-out accuracy of a multinomial logistic regression (L-BFGS, small L2): written here
    rather than taken from scikit-learn, which pe-bench does not otherwise depend on."""
    n_train = int(train_fraction * len(labels))
    mean, std = features[:n_train].mean(0), features[:n_train].std(0) + 1e-6
    x = (features - mean) / std
    linear = nn.Linear(x.shape[1], classes, dtype=x.dtype)
    optimiser = torch.optim.LBFGS(linear.parameters(), max_iter=500, line_search_fn="strong_wolfe")

    def closure() -> Tensor:
        optimiser.zero_grad()
        loss = nn.functional.cross_entropy(linear(x[:n_train]), labels[:n_train]) + 1e-3 * linear.weight.square().sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        optimiser.step(closure)
    with torch.no_grad():
        return (linear(x[n_train:]).argmax(-1) == labels[n_train:]).float().mean().item()


@torch.no_grad()
def probe(model: nn.Module, images: Tensor, scenes: list, cell: int, classes: int) -> ProbeResult:
    """The three measures for ``model`` (an ImageDetector) on ``images`` with their ``scenes``."""
    recorder = _Recorder(model)
    try:
        model.eval()(images)
    finally:
        recorder.close()
    rows, cols = images.shape[-2] // cell, images.shape[-1] // cell
    prefix = recorder.attention[0].shape[-1] - rows * cols  # register tokens, if any
    layers, heads = len(recorder.attention), recorder.attention[0].shape[1]
    attention = np.zeros((layers, heads, classes))
    per_class = np.zeros(classes)
    features: list[list[Tensor]] = [[] for _ in range(layers)]
    labels = []
    for i, scene in enumerate(scenes):
        marker = prefix + scene.marker[0] * cols + scene.marker[1]
        for (x, y, w, h), label in zip(scene.boxes, scene.labels, strict=True):
            centre = prefix + int((y + h / 2) // cell) * cols + int((x + w / 2) // cell)
            for layer in range(layers):
                attention[layer, :, label] += recorder.attention[layer][i, :, centre, marker].double().numpy()
                features[layer].append(recorder.tokens[layer][i, centre])
            per_class[label] += 1
            labels.append(label)
    tokens = rows * cols
    attention *= tokens / np.maximum(per_class, 1)
    grid = PositionLayout.grid(1, (rows, cols), 0).coords[0].double()
    distance = torch.cdist(grid, grid)  # (tokens, tokens), patches
    attended = np.array(
        [[(a[:, h, prefix:, prefix:].double() * distance).sum(-1).mean().item() for h in range(heads)]
         for a in recorder.attention]
    )  # fmt: skip
    target = torch.tensor(labels)
    accuracy = np.array([linear_probe_accuracy(torch.stack(f).double(), target, classes) for f in features])
    return ProbeResult(attention, attended, accuracy, len(labels))


def probe_cell(directory: Path, scenes: int = 200) -> ProbeResult:
    """Load a finished tiny-coco cell and probe it on the first ``scenes`` test scenes."""
    from .extrapolate import load_cell

    task, model, _ = load_cell(directory, None)
    data = task.data
    if data.source != "generated":
        raise ValueError(f"{directory}: the marker probe needs the tiny (generated) coco, not {data.source!r}")
    spec = SceneSpec(data.image_size, data.objects, data.object_sides, data.cell)
    regenerated = list(split_scenes("val2017", scenes, spec))
    module = task.datamodule(seed=0)
    module.setup("test")
    test = module.splits["test"]
    images = []
    for i, scene in enumerate(regenerated):
        image, target = test[i]
        xyxy = [[x, y, x + w, y + h] for x, y, w, h in scene.boxes]
        if not torch.equal(target["boxes"], torch.tensor(xyxy, dtype=torch.float32)):
            raise RuntimeError(f"test image {i} does not match its regenerated scene: was the generator changed?")
        images.append(image)
    return probe(model, torch.stack(images), regenerated, data.cell, data.num_classes)


def format_result(name: str, result: ProbeResult) -> str:
    layers, heads, classes = result.marker_attention.shape
    lines = [
        f"{name}: {result.objects} objects",
        "  attention to the marker x N (per head: the classes in order), mean attended distance (patches), "
        "linear probe accuracy",
    ]
    for layer in range(layers):
        marker = " | ".join(
            " ".join(f"{v:5.2f}" for v in result.marker_attention[layer, h]) for h in range(heads)
        )  # fmt: skip
        distance = " ".join(f"{d:4.2f}" for d in result.attended_distance[layer])
        lines.append(f"  layer {layer}: {marker} || {distance} || {result.probe_accuracy[layer]:.3f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("cells", nargs="+", type=Path, help="finished tiny coco cells (runs/coco/<method>/seed<N>)")
    parser.add_argument("--scenes", type=int, default=200, help="test scenes to average over")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    for cell in args.cells:
        print(format_result(str(cell), probe_cell(cell, args.scenes)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
