"""nuScenes v1.0 samples through the nuscenes-devkit (``pip install nuscenes-devkit``), for the
``paper`` profile. The devkit is optional: it is imported only here, when the profile runs.

A sample, in the frame of its LIDAR_TOP keyframe (UniTR's frame; x forward, z up):

* ``points`` (N, 5): ``sweeps`` LiDAR sweeps accumulated by the devkit
  (``LidarPointCloud.from_file_multisweep``): x, y, z, intensity, time lag (s);
* ``images`` (6, 3, H, W): the six cameras, resized by ``image_resize`` (UniTR's test-time
  0.48: 1600x900 -> 768x432) and cropped to ``image_size``, centred in width and keeping
  the bottom rows (BEVFusion's crop); ``intrinsics`` adjusted to match;
* ``cam_to_ego`` (6, 4, 4): camera -> ego (at the camera's time) -> global -> ego (at the
  LiDAR's time) -> LiDAR;
* ``boxes`` (K, 7: x, y, z, l, w, h, yaw) and ``labels`` (K,): annotations mapped to the
  detection classes by the devkit's ``category_to_detection_name``; boxes without a LiDAR or
  radar point are dropped, as the devkit's evaluation drops them;
* ``ego_frame`` (4, 4): LiDAR -> the global frame's axes with the ego at the origin, where the
  devkit measures how far a box is from the ego (its class ranges, :mod:`.metric`);
* ``bike_racks`` (R, 4, 4): the sample's ``static_object.bicycle_rack`` annotations (all of
  them, as the devkit's ``filter_eval_boxes`` reads them: no point or distance filter), each as
  :func:`rack_frame` from the LiDAR frame; the evaluation drops bicycles and motorcycles inside.

Not verified against the real dataset in this repository (no copy here); the layout and
the devkit calls follow the devkit's documentation and tutorials.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from pe_bench.harness.data import DatasetMissingError
from pe_bench.tasks._shared.data_checks import CorruptFileError

CAMERAS = ("CAM_FRONT", "CAM_FRONT_RIGHT", "CAM_FRONT_LEFT", "CAM_BACK", "CAM_BACK_LEFT", "CAM_BACK_RIGHT")
INSTALL = (
    "pip install --no-deps nuscenes-devkit==1.2.0 pyquaternion descartes && pip install opencv-python-headless "
    "'shapely~=2.0.3' scikit-learn (its metadata pins numpy < 2; its evaluation runs on numpy 2)"
)
BIKE_RACK = "static_object.bicycle_rack"  # the category the devkit's bike-rack filter reads
#: version -> (train split, val split) in ``nuscenes.utils.splits.create_splits_scenes()``
SPLITS = {"v1.0-trainval": ("train", "val"), "v1.0-mini": ("mini_train", "mini_val")}


def require_devkit() -> None:
    """Raise a clear error when the optional nuscenes-devkit is missing."""
    try:
        importlib.import_module("nuscenes")
    except ImportError as err:
        raise ImportError(
            f"the nuscenes paper profile reads nuScenes through the nuscenes-devkit, which is not installed: "
            f"{INSTALL} (or run --profile tiny, which needs no dataset)"
        ) from err


def check_sample_file(path: str) -> None:
    """Raise :class:`CorruptFileError` when a keyframe's LiDAR (.pcd.bin: float32 x 5 per
    point) or camera (.jpg) file is missing or unreadable."""
    file = Path(path)
    if not file.is_file():
        raise CorruptFileError(path, "missing")
    if file.name.endswith(".bin"):
        size = file.stat().st_size
        if size == 0 or size % (5 * 4):
            raise CorruptFileError(path, f"{size} bytes is not a whole number of 5-float points")
        return
    from PIL import Image

    try:
        with Image.open(file) as img:
            img.verify()
    except Exception as err:  # PIL raises several types for broken images
        raise CorruptFileError(path, f"unreadable image ({type(err).__name__}: {err})") from None


def _matrix(record: dict) -> np.ndarray:
    """4 x 4 pose of a calibrated_sensor or ego_pose record (maps its frame to the parent frame)."""
    from nuscenes.utils.geometry_utils import transform_matrix
    from pyquaternion import Quaternion

    return transform_matrix(record["translation"], Quaternion(record["rotation"]))


def ego_frame(lidar_to_ego: np.ndarray, ego_to_global: np.ndarray) -> np.ndarray:
    """LiDAR -> the global frame's axes with the ego at the origin (4 x 4). The devkit's
    ``add_center_dist`` measures a box's distance to the ego there: the box's global translation
    minus the ego pose's, of which its class ranges keep the ground-plane norm."""
    axes = ego_to_global.copy()
    axes[:3, 3] = 0.0
    return axes @ lidar_to_ego


def rack_frame(translation, size, rotation, to_sample: np.ndarray) -> np.ndarray:
    """A box annotation (translation, size w, l, h and rotation quaternion w, x, y, z in the
    global frame, as ``sample_annotation``) as the 4 x 4 map from a sample's frame into the box
    scaled to the cube |x|, |y|, |z| <= 1/2 (x along its length, y its width, as the devkit's
    ``Box``); ``to_sample`` maps global to the sample's frame. The full rotation is kept, so the
    devkit's ``points_in_box`` test needs no flat-box assumption."""
    from nuscenes.utils.geometry_utils import transform_matrix
    from pyquaternion import Quaternion

    width, length, height = size
    scaled = np.diag([length, width, height, 1.0])  # the unit cube -> the box's extent
    return np.linalg.inv(to_sample @ transform_matrix(translation, Quaternion(rotation)) @ scaled)


def bike_racks(nusc, record: dict, to_sample: np.ndarray) -> np.ndarray:
    """The bicycle racks (R, 4, 4) of a ``sample`` record, each as :func:`rack_frame`."""
    annotations = (nusc.get("sample_annotation", token) for token in record["anns"])
    racks = [
        rack_frame(ann["translation"], ann["size"], ann["rotation"], to_sample)
        for ann in annotations
        if ann["category_name"] == BIKE_RACK
    ]
    return np.stack(racks) if racks else np.zeros((0, 4, 4))


class NuScenesReader:
    def __init__(
        self,
        root: Path,
        version: str,
        classes: list[str],
        image_size: tuple[int, int],
        sweeps: int,
        point_channels: int,
        image_resize: float = 0.48,
    ) -> None:
        self.root, self.version, self.classes = Path(root), version, list(classes)
        self.image_size, self.image_resize = image_size, image_resize
        self.sweeps, self.point_channels = sweeps, point_channels
        self._nusc = None

    def check(self) -> None:
        require_devkit()
        if self.version not in SPLITS:
            raise ValueError(f"data.version {self.version!r}: known versions are {', '.join(SPLITS)}")
        tables = self.root / self.version
        if not (tables / "sample.json").is_file():
            raise DatasetMissingError(
                f"nuScenes {self.version} not found at {self.root}: expected {tables}/sample.json and samples/, "
                f"sweeps/ beside it (the layout of the nuScenes download from nuscenes.org; set --data-root so "
                f"that DATA_ROOT/nuscenes is that folder)"
            )
        if self.point_channels != 5:
            raise ValueError(
                f"data.point_channels: nuScenes points have 5 (x, y, z, intensity, time), not {self.point_channels}"
            )

    @property
    def nusc(self):
        if self._nusc is None:
            self.check()
            from nuscenes.nuscenes import NuScenes

            self._nusc = NuScenes(version=self.version, dataroot=str(self.root), verbose=False)
        return self._nusc

    def split(self, name: str) -> list[str]:
        """Sample tokens of the official ``train`` or ``val`` split."""
        from nuscenes.utils.splits import create_splits_scenes

        scenes = set(create_splits_scenes()[SPLITS[self.version][0 if name == "train" else 1]])
        return [s["token"] for s in self.nusc.sample if self.nusc.get("scene", s["scene_token"])["name"] in scenes]

    def sample_files(self) -> list[str]:
        """The LiDAR and camera files of every keyframe (the sweeps before them are not listed)."""
        nusc = self.nusc
        channels = ("LIDAR_TOP", *CAMERAS)
        files = (nusc.get("sample_data", s["data"][c])["filename"] for s in nusc.sample for c in channels)
        return [str(self.root / name) for name in files]

    def sample(self, token: str) -> dict[str, Tensor]:
        from nuscenes.eval.detection.utils import category_to_detection_name
        from nuscenes.utils.data_classes import LidarPointCloud

        nusc = self.nusc
        record = nusc.get("sample", token)
        lidar = nusc.get("sample_data", record["data"]["LIDAR_TOP"])
        cloud, times = LidarPointCloud.from_file_multisweep(nusc, record, "LIDAR_TOP", "LIDAR_TOP", nsweeps=self.sweeps)
        points = np.concatenate([cloud.points[:4].T, times.T], axis=1).astype(np.float32)

        lidar_to_ego = _matrix(nusc.get("calibrated_sensor", lidar["calibrated_sensor_token"]))
        ego_to_global = _matrix(nusc.get("ego_pose", lidar["ego_pose_token"]))
        global_to_lidar = np.linalg.inv(ego_to_global @ lidar_to_ego)
        images, intrinsics, poses = [], [], []
        for channel in CAMERAS:
            cam = nusc.get("sample_data", record["data"][channel])
            sensor = nusc.get("calibrated_sensor", cam["calibrated_sensor_token"])
            cam_to_global = _matrix(nusc.get("ego_pose", cam["ego_pose_token"])) @ _matrix(sensor)
            image, K = self._image(self.root / cam["filename"], np.array(sensor["camera_intrinsic"]))
            images.append(image)
            intrinsics.append(K)
            poses.append(global_to_lidar @ cam_to_global)

        _, annotations, _ = nusc.get_sample_data(lidar["token"])
        boxes, labels = [], []
        for box in annotations:
            name = category_to_detection_name(box.name)
            ann = nusc.get("sample_annotation", box.token)
            if name not in self.classes or ann["num_lidar_pts"] + ann["num_radar_pts"] == 0:
                continue
            w, length, h = box.wlh
            boxes.append([*box.center, length, w, h, box.orientation.yaw_pitch_roll[0]])
            labels.append(self.classes.index(name))
        return {
            "points": torch.from_numpy(points),
            "images": torch.stack(images),
            "intrinsics": torch.from_numpy(np.stack(intrinsics)).float(),
            "cam_to_ego": torch.from_numpy(np.stack(poses)).float(),
            "boxes": torch.tensor(boxes, dtype=torch.float32).reshape(-1, 7),
            "labels": torch.tensor(labels, dtype=torch.long),
            "ego_frame": torch.from_numpy(ego_frame(lidar_to_ego, ego_to_global)),
            "bike_racks": torch.from_numpy(bike_racks(nusc, record, global_to_lidar)),
        }

    def _image(self, path: Path, K: np.ndarray) -> tuple[Tensor, np.ndarray]:
        """Resize, crop (centred in width, bottom rows kept) and the matching intrinsics."""
        from PIL import Image

        width, height = self.image_size
        with Image.open(path) as img:
            new_w, new_h = round(img.width * self.image_resize), round(img.height * self.image_resize)
            if new_w < width or new_h < height:
                raise ValueError(
                    f"{path}: {img.width}x{img.height} x image_resize {self.image_resize} is smaller than "
                    f"data.image_size {width}x{height}"
                )
            left, top = (new_w - width) // 2, new_h - height
            img = img.convert("RGB").resize((new_w, new_h), Image.BILINEAR)
            img = img.crop((left, top, left + width, top + height))
            pixels = torch.from_numpy(np.asarray(img, dtype=np.float32) / 255.0).permute(2, 0, 1)
        K = K.astype(np.float64).copy()
        K[:2] *= self.image_resize
        K[0, 2] -= left
        K[1, 2] -= top
        return pixels, K
