"""2-D object detection: coco (ViT) and gen1 (Spiking Patches tokens + event ViT), both with
ViTDet's simple feature pyramid and a YOLOv10-style dual head (PaPE Table 1).

The tasks are declared in ``configs/tasks/<name>.yaml`` (``implementation:``) and imported
on first use."""
