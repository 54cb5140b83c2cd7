"""nuScenes 3-D detection from camera + LiDAR with a UniTR-style transformer."""
