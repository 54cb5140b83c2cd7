"""Helpers shared by several task families (never imported sideways between families): the ViT
backbone, motion paths, and the space-filling-curve serialization and set grouping of voxelised
points (point clouds, LiDAR, lifted camera tokens)."""
