"""The training module every task builds on, and the classification module of the patch tasks.

:class:`TaskModule` owns what is the same for every task: AdamW (Adam for some tasks) with a
warm-up and cosine schedule (``learning_rate_schedule``), no weight decay on biases, norms and
positional tables (the usual ViT practice), the divergence guard, the ``train/loss`` log and
the ``extra_results`` hook. A task's module adds its loss (:meth:`TaskModule.training_loss`)
and its evaluation (validation/test steps, metrics logged as ``val/<metric>`` and
``test/<metric>``). :class:`ClassificationModule` is the one of the image, video and event
tasks: label smoothing, optional batch-level MixUp/CutMix, optional test-time augmentation.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics.classification import MulticlassAccuracy

from pe_bench.adapters.base import position_table_parameters, positional_parameters

from .config import OptimConfig


class DivergedError(RuntimeError):
    """Training produced a non-finite loss."""


def parameter_groups(model: nn.Module, weight_decay: float, lr: float, table_lr_scale: float = 1.0) -> list[dict]:
    """Trainable parameters in four groups, each with its own ``lr``:

    * decayed: weight matrices of the content path;
    * not decayed: biases and norms (fewer than 2 dimensions);
    * positional: every other parameter owned by a position encoding (slopes, projections,
      frequencies; :func:`~pe_bench.adapters.base.positional_parameters`), never decayed — as
      timm's ``no_weight_decay`` exempts position embeddings: decay would pull a
      relative-position table towards the "no position" solution the encoding exists to leave;
    * position tables: the position-indexed tables among those (abspos, relpos, SaPE², CoPE;
      :func:`~pe_bench.adapters.base.position_table_parameters`), never decayed and trained at
      ``lr * table_lr_scale``: Adam moves an entry by about lr per step, so a short schedule
      cannot grow a table otherwise. Projections keep ``lr``: a step already moves their effect
      by lr times the positions or features they multiply (a global scale of 30 cost PaPE
      40-50 points on the tiny dvsgesture).
    Empty groups are dropped. The ViT's class token (a (1, 1, D) parameter of the backbone)
    is decayed, where timm exempts it: for every encoding alike, as every record trained.
    """
    positional_ids = {id(param) for _, param in positional_parameters(model)}
    table_ids = {id(param) for param in position_table_parameters(model)}
    decay, no_decay, positional, tables = [], [], [], []
    for param in model.parameters():
        if not param.requires_grad:
            continue
        if id(param) in table_ids:
            tables.append(param)
        elif id(param) in positional_ids:
            positional.append(param)
        else:
            (no_decay if param.ndim < 2 else decay).append(param)
    groups = [
        {"params": decay, "weight_decay": weight_decay, "lr": lr},
        {"params": no_decay, "weight_decay": 0.0, "lr": lr},
        {"params": positional, "weight_decay": 0.0, "lr": lr},
        {"params": tables, "weight_decay": 0.0, "lr": lr * table_lr_scale},
    ]
    return [group for group in groups if group["params"]]


class TaskModule(L.LightningModule):
    """A task's Lightning module: ``model`` trained under ``optim``.

    Subclasses implement :meth:`training_loss` and their evaluation (``validation_step``,
    ``test_step`` and the metrics they log as ``val/<metric>``, ``test/<metric>``); they may
    override :meth:`batch_size_of` and :meth:`extra_results`.
    """

    def __init__(self, model: nn.Module, optim: OptimConfig) -> None:
        super().__init__()
        self.model = model
        self.optim = optim

    def training_loss(self, batch: Any) -> Tensor:
        """The scalar loss of one training batch."""
        raise NotImplementedError(f"{type(self).__name__} must implement training_loss(batch)")

    def batch_size_of(self, batch: Any) -> int | None:
        """Samples in ``batch``, its weight in the epoch mean of ``train/loss`` (None: Lightning
        infers it from the batch)."""
        return None

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        loss = self.training_loss(batch)
        if not torch.isfinite(loss):
            raise DivergedError(f"non-finite training loss ({loss.item()}) at step {self.global_step}")
        # sync_dist: under DDP the epoch's loss is the mean over every rank's batches (one
        # all-reduce per epoch), as one process would log it.
        self.log(
            "train/loss", loss, prog_bar=True, on_step=False, on_epoch=True, batch_size=self.batch_size_of(batch),
            sync_dist=True,
        )  # fmt: skip
        return loss

    def extra_results(self) -> dict[str, Any]:
        """Results beyond the task's one metric, from the last test run; the runner stores them
        in the cell record's ``extra`` (e.g. WER per duration bin)."""
        return {}

    def configure_optimizers(self) -> dict:
        """Optimiser and per-step OneCycle schedule, as Lightning takes them."""
        optim = self.optim
        groups = parameter_groups(self.model, optim.weight_decay, optim.lr, optim.table_lr_scale)
        opt_cls = torch.optim.AdamW if optim.optimizer == "adamw" else torch.optim.Adam
        optimizer = opt_cls(groups, lr=optim.lr, betas=optim.betas)
        schedule = learning_rate_schedule(optimizer, optim, int(self.trainer.estimated_stepping_batches))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def learning_rate_schedule(
    optimizer: torch.optim.Optimizer, optim: OptimConfig, steps: int
) -> torch.optim.lr_scheduler.LRScheduler:
    """``optim.schedule`` over ``steps`` optimiser steps, stepped once per step; every group
    keeps its own peak lr (the position tables' ``table_lr_scale``).

    * onecycle: torch's OneCycleLR as every shipped record trained: cosine-shaped warm-up
      from lr/25 and decay to lr/25e4, and (``cycle_momentum``, torch's default) beta1 moved
      0.95 -> 0.85 -> 0.95 against the lr in place of betas[0]. It needs a warm-up of more
      than one step and a decay after it: very short runs (tests, smoke runs) are padded to 3
      scheduled steps, and the warm-up is capped at half the run.
    * warmup_cosine: the official PaPE code's (DTU-PAS/parabolic-position-encoding,
      pape/lr_schedule.py, after MAE's): the lr rises linearly from 0 over the warm-up and
      falls on a half cosine to ``final_lr`` (scaled with each group's peak) at the last
      step; betas stay as configured.
    """
    total = max(steps, 3)
    fraction = optim.warmup_epochs / max(optim.epochs, 1)
    peaks = [group["lr"] for group in optimizer.param_groups]
    if optim.schedule == "onecycle":
        return torch.optim.lr_scheduler.OneCycleLR(
            optimizer,
            max_lr=peaks,
            total_steps=total,
            pct_start=min(max(fraction, 1.5 / total), 0.5),
            anneal_strategy="cos",
            cycle_momentum=optim.cycle_momentum is not False,
        )
    warmup = round(fraction * total)
    floor = optim.final_lr / optim.lr

    def factor(step: int) -> float:
        k = step + 1  # the optimiser step this lr is for, counted from 1 as the official code does
        if k < warmup:
            return k / warmup
        progress = (k - warmup) / max(total - warmup, 1)
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, [factor] * len(peaks))


class ClassificationModule(TaskModule):
    def __init__(
        self,
        model: nn.Module,
        num_classes: int,
        optim: OptimConfig,
        batch_transform: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]] | None = None,
        test_time_augmentation: Callable[[nn.Module, Tensor], Tensor] | None = None,
    ) -> None:
        super().__init__(model, optim)
        self.batch_transform = batch_transform  # e.g. MixUp/CutMix, random resolution per batch
        # Test logits from (model, images), e.g. averaged over resized copies. Validation stays
        # plain, so the checkpoint is chosen as without it and the test can report both.
        self.test_time_augmentation = test_time_augmentation
        self.val_acc = MulticlassAccuracy(num_classes, average="micro")
        self.test_acc = MulticlassAccuracy(num_classes, average="micro")
        self.test_acc_plain = MulticlassAccuracy(num_classes, average="micro")

    def forward(self, images: Tensor) -> Tensor:
        return self.model(images)

    def training_loss(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        images, labels = batch
        if self.batch_transform is not None:
            images, labels = self.batch_transform(images, labels)
        logits = self(images)
        return F.cross_entropy(logits.float(), labels, label_smoothing=self.optim.label_smoothing)

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
