"""Lightning modules shared by tasks: classification with the papers' training protocol.

AdamW (Adam for some tasks) with a OneCycle schedule (linear warm-up, cosine decay), label
smoothing, optional batch-level MixUp/CutMix, no weight decay on biases, norms and
positional tables (the usual ViT practice).
"""

from __future__ import annotations

from collections.abc import Callable

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics.classification import MulticlassAccuracy

from .config import OptimConfig


class DivergedError(RuntimeError):
    """Training produced a non-finite loss."""


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        is_table = "encoding" in name and param.ndim > 2  # e.g. abspos grids
        (no_decay if param.ndim < 2 or is_table else decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def configure_optimizer(module: L.LightningModule, optim: OptimConfig) -> dict:
    groups = parameter_groups(module.model, optim.weight_decay)
    opt_cls = torch.optim.AdamW if optim.optimizer == "adamw" else torch.optim.Adam
    optimizer = opt_cls(groups, lr=optim.lr, betas=optim.betas)
    # OneCycle needs a warm-up phase of more than one step and a decay phase after it; very
    # short runs (tests, smoke runs) are padded to 3 scheduled steps (a run may stop earlier).
    total = max(int(module.trainer.estimated_stepping_batches), 3)
    warmup = min(max(optim.warmup_epochs / max(optim.epochs, 1), 1.5 / total), 0.5)
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=optim.lr, total_steps=total, pct_start=warmup, anneal_strategy="cos"
    )
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


class ClassificationModule(L.LightningModule):
    def __init__(
        self,
        model: nn.Module,
        num_classes: int,
        optim: OptimConfig,
        batch_transform: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]] | None = None,
        test_time_augmentation: Callable[[nn.Module, Tensor], Tensor] | None = None,
    ) -> None:
        super().__init__()
        self.model = model
        self.optim = optim
        self.batch_transform = batch_transform  # e.g. MixUp/CutMix, random resolution per batch
        # Test logits from (model, images), e.g. averaged over resized copies. Validation stays
        # plain, so the checkpoint is chosen as without it and the test can report both.
        self.test_time_augmentation = test_time_augmentation
        self.val_acc = MulticlassAccuracy(num_classes, average="micro")
        self.test_acc = MulticlassAccuracy(num_classes, average="micro")
        self.test_acc_plain = MulticlassAccuracy(num_classes, average="micro")

    def forward(self, images: Tensor) -> Tensor:
        return self.model(images)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        images, labels = batch
        if self.batch_transform is not None:
            images, labels = self.batch_transform(images, labels)
        logits = self(images)
        loss = F.cross_entropy(logits.float(), labels, label_smoothing=self.optim.label_smoothing)
        if not torch.isfinite(loss):
            raise DivergedError(f"non-finite training loss ({loss.item()}) at step {self.global_step}")
        self.log("train/loss", loss, prog_bar=True, on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        images, labels = batch
        self.val_acc(self(images), labels)
        self.log("val/acc", self.val_acc, prog_bar=True, on_epoch=True)

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        images, labels = batch
        if self.test_time_augmentation is None:
            self.test_acc(self(images), labels)
        else:
            self.test_acc(self.test_time_augmentation(self.model, images), labels)
            self.test_acc_plain(self(images), labels)
        self.log("test/acc", self.test_acc, on_epoch=True)

    def extra_results(self) -> dict[str, float]:
        """With test-time augmentation, the accuracy without it (%), from the same checkpoint."""
        if self.test_time_augmentation is None:
            return {}
        return {"test_acc_without_tta": 100.0 * float(self.test_acc_plain.compute())}

    def configure_optimizers(self) -> dict:
        return configure_optimizer(self, self.optim)
