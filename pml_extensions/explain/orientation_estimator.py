"""Cross-view orientation estimation from activation maps (Zhu et al., IEEE TIP 2021, Sec. VI-D, CVUSA)."""

import math
from typing import Dict, Optional

import numpy as np
import torch

from .activation_decomposition import ActivationDecomposition

GEOMETRIES = ("panorama", "polar")


class OrientationEstimator:
    """Rotation between a query view and an aerial view from point-specific (or, for comparison, overall) maps.

    The street view's overall-map maximum gives θ_s (its panorama column); that pixel's point-specific map on the aerial
    image has its maximum at polar angle θ_a around the centre; estimate = θ_a − θ_s, error = ground truth − estimate,
    wrapped to [−180°, 180°). Panorama column x of width W is at 360·(x + 0.5)/W degrees (0° at the left edge; CVUSA:
    south); aerial pixel (y, x) at atan2(x − c_x, y − c_y) mod 360: 0° points down and angles grow counter-clockwise as
    displayed, like a positive angle of ``skimage.transform.rotate`` / ``torchvision``'s ``rotate``.

    Args:
        decomposition: :class:`ActivationDecomposition` (query model = street branch, reference model = aerial).
        query_geometry: ``"panorama"`` (default; the query angle is its column) or ``"polar"`` (a centred query
            view, e.g. an unrotated aerial image).
        clockwise: measure polar angles clockwise. Default ``False``.

    Raises:
        ValueError: unknown ``query_geometry``.
    """

    def __init__(
        self,
        decomposition: Optional[ActivationDecomposition] = None,
        query_geometry: str = "panorama",
        clockwise: bool = False,
    ):
        if query_geometry not in GEOMETRIES:
            raise ValueError(f"query_geometry must be one of {GEOMETRIES}, got {query_geometry!r}")
        self.decomposition = decomposition
        self.query_geometry = query_geometry
        self.clockwise = bool(clockwise)

    @staticmethod
    def wrap_degrees(angle):
        """Wrap degrees (tensor, array or float) to [−180, 180); +180 maps to −180, also where floating-point ``%``
        rounds a value just below −180 up to +180."""
        wrapped = ((angle + 180.0) % 360.0) - 180.0
        if torch.is_tensor(wrapped):
            return torch.where(wrapped >= 180.0, wrapped - 360.0, wrapped)
        if isinstance(wrapped, np.ndarray) or isinstance(wrapped, np.generic):
            return np.where(wrapped >= 180.0, wrapped - 360.0, wrapped).astype(np.asarray(wrapped).dtype)[()]
        return wrapped - 360.0 if wrapped >= 180.0 else wrapped

    @staticmethod
    def wrap_360(angle: float) -> float:
        """Wrap degrees to [0, 360) (``x % 360`` may round to 360.0 for tiny negative x)."""
        wrapped = angle % 360.0
        return 0.0 if wrapped >= 360.0 else wrapped

    @classmethod
    def angle_error(cls, ground_truth, estimate):
        """ground truth − estimate, wrapped to [−180°, 180°) (paper Sec. VI-D)."""
        return cls.wrap_degrees(ground_truth - estimate)

    @staticmethod
    def panorama_angle(x: float, width: int) -> float:
        """Angle in degrees of panorama column ``x`` (pixels, 0-based) for a panorama ``width`` pixels wide."""
        if not 0 <= x < width:
            raise ValueError(f"column {x} is outside a panorama of width {width}")
        return 360.0 * (x + 0.5) / width

    def polar_angle(self, y: float, x: float, height: int, width: int) -> float:
        """Polar angle in degrees [0, 360) of pixel (y, x) around the centre of an ``height × width`` image."""
        if not (0 <= y < height and 0 <= x < width):
            raise ValueError(f"pixel {(y, x)} is outside an image of size {(height, width)}")
        dy, dx = y - (height - 1) / 2.0, x - (width - 1) / 2.0
        angle = self.wrap_360(math.degrees(math.atan2(dx, dy)))
        return self.wrap_360(-angle) if self.clockwise else angle

    def query_angle(self, y: float, x: float, height: int, width: int) -> float:
        if self.query_geometry == "panorama":
            return self.panorama_angle(x, width)
        return self.polar_angle(y, x, height, width)

    def estimate(
        self, query_images: torch.Tensor, aerial_images: torch.Tensor, *, method: str = "point_specific"
    ) -> Dict[str, torch.Tensor]:
        """Rotation (degrees, in [0, 360)) of each aerial image relative to its query.

        Args:
            query_images: ``[N, 3, H, W]`` street panoramas (or centred views with ``query_geometry="polar"``).
            aerial_images: ``[N, 3, H', W']``.
            method: ``"point_specific"`` (the paper's: the query's max pixel → its point-specific map on the aerial
                image) or ``"overall"`` (the aerial overall map's maximum).

        Returns:
            float64 ``"estimate"``, ``"query_angle"``, ``"aerial_angle"`` ``[N]`` (degrees) and ``"query_point"`` /
            ``"aerial_point"`` ``[N, 2]`` pixel (y, x) (maps upsampled to image size).

        Raises:
            ValueError: no decomposition, unknown method.
        """
        if self.decomposition is None:
            raise ValueError("estimate() needs a decomposition")
        if method not in ("point_specific", "overall"):
            raise ValueError(f"method must be 'point_specific' or 'overall', got {method!r}")
        dec = self.decomposition
        fq, fr = dec.fold_query(query_images), dec.fold_reference(aerial_images)
        overall = dec.overall_maps(fq, fr, output_size="image")
        H, W = fq.image_size
        Ha, Wa = fr.image_size
        rows = []
        for n in range(len(fr)):
            qmap = overall["query"][n if overall["query"].shape[0] > 1 else 0]
            qy, qx = divmod(int(torch.argmax(qmap)), qmap.shape[1])
            if method == "overall":
                amap = overall["reference"][n]
            else:
                amap = dec.point_specific(fq[n if len(fq) > 1 else 0], fr[n], [(qy, qx)], output_size="image")[0, 0]
            ay, ax = divmod(int(torch.argmax(amap)), amap.shape[1])
            ts = self.query_angle(qy, qx, H, W)
            ta = self.polar_angle(ay, ax, Ha, Wa)
            rows.append((self.wrap_360(ta - ts), ts, ta, (qy, qx), (ay, ax)))
        keys = ("estimate", "query_angle", "aerial_angle", "query_point", "aerial_point")
        return {k: torch.tensor(v, dtype=torch.float64) for k, v in zip(keys, zip(*rows))}
