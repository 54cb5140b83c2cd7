"""ViTDet's simple feature pyramid (Li et al., 2022, "Exploring Plain Vision Transformer
Backbones for Object Detection", arXiv:2203.16527, Section 3 and Figure 2).

A plain ViT has one feature map, at the patch stride s. The pyramid is built from that last
map alone, without lateral connections: a 2x2 deconvolution for stride s/2, the map itself for
stride s, a 2x2 max-pool for stride 2s; each is then projected by a 1x1 and a 3x3 convolution,
each followed by a LayerNorm over channels. With ViT-B/16 that gives PaPE's strides 8, 16, 32.
"""

from __future__ import annotations

from torch import Tensor, nn

#: Level strides in units of the backbone stride (the patch size).
LEVEL_SCALES = (0.5, 1.0, 2.0)


class ChannelNorm(nn.LayerNorm):
    """LayerNorm over the channels of a (B, C, H, W) map, as ViTDet normalises its neck."""

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def _projection(in_dim: int, out_dim: int, kernel: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_dim, out_dim, 1, bias=False),
        ChannelNorm(out_dim),
        nn.Conv2d(out_dim, out_dim, kernel, padding=kernel // 2, bias=False),
        ChannelNorm(out_dim),
    )


class SimpleFeaturePyramid(nn.Module):
    """(B, dim, h, w) backbone map -> maps at strides (s/2, s, 2s) with ``out_dim`` channels;
    ``kernel`` is the second projection's (ViTDet: 3)."""

    def __init__(self, dim: int, out_dim: int, kernel: int = 3) -> None:
        super().__init__()
        self.resample = nn.ModuleList(
            [nn.ConvTranspose2d(dim, dim // 2, kernel_size=2, stride=2), nn.Identity(), nn.MaxPool2d(2, 2)]
        )
        self.project = nn.ModuleList(_projection(d, out_dim, kernel) for d in (dim // 2, dim, dim))

    def forward(self, x: Tensor) -> list[Tensor]:
        return [project(resample(x)) for resample, project in zip(self.resample, self.project, strict=True)]
