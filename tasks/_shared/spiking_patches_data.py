"""The data module of the event-stream tasks (dvsgesture, gen1): splits whose samples
Spiking Patches tokenizes, configured by the task's data config and the model's patch size."""

from __future__ import annotations

from pe_bench.harness.data import PatchDataModule

from .spiking_patches import SpikingPatches


class SpikingPatchesDataModule(PatchDataModule):
    """``data`` describes the sensor (``width``, ``height``) and the tokenizer (``threshold``,
    ``refractory_us``, ``buckets``); subclasses build the splits in ``setup``."""

    def tokenizer(self) -> SpikingPatches:
        d = self.data
        return SpikingPatches(d.width, d.height, self.patch, d.threshold, d.refractory_us, d.buckets)
