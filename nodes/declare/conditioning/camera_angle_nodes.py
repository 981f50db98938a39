"""ComfyUI ``comfy_extras/nodes_camera_angle.py`` (59090bd): ``CameraAngle``, model-free. An
azimuth / elevation / zoom gives a ``LOAD3D_CAMERA`` dict (the camera orbiting a unit subject
cube centred at (0, 0.5, 0), as ComfyUI's editor preview lays it out) and a plain-English shot
description for prompts. The 3-D preview itself is an editor widget (``view``, ignored here as
by ComfyUI's execute)."""

from __future__ import annotations

import dataclasses
import math

from mixgraph.graph.node import Float, Int, Socket, String, node, replace_spec
from mixgraph.graph.registry import REGISTRY

__all__ = ["camera_prompt", "camera_info"]

_CENTRE = (0.0, 0.5, 0.0)
_FOV = 35.0
_NEAR, _FAR = 3.2, 6.0  # camera distance at zoom 10 and at zoom 0
_H_RANGE, _V_RANGE, _ZOOM_RANGE = (0, 360), (-30, 60), (0.0, 10.0)
_SIDES = ("front view", "front-right quarter view", "right side view", "back-right quarter view",
          "back view", "back-left quarter view", "left side view", "front-left quarter view")
_HEIGHTS = ((-15, "low-angle shot"), (15, "eye-level shot"), (45, "elevated shot"))
_DISTANCES = ((2, "wide shot"), (6, "medium shot"))


def _first_below(value: float, bounds, last: str) -> str:
    return next((term for bound, term in bounds if value < bound), last)


def camera_prompt(horizontal: float, vertical: float, zoom: float) -> str:
    """"<side> <height> <distance>": the side is one of 8 sectors of 45° centred on 0°, 45°, …;
    the height and distance terms are picked by the first upper bound the value is below."""
    side = _SIDES[int(((horizontal % 360) + 22.5) // 45) % len(_SIDES)]
    return (f"{side} {_first_below(vertical, _HEIGHTS, 'high-angle shot')} "
            f"{_first_below(zoom, _DISTANCES, 'close-up')}")


def camera_info(horizontal: float, vertical: float, zoom: float) -> dict:
    """The LOAD3D_CAMERA dict: the camera at distance 6 − 2.8·zoom/10 from the centre, yaw the
    azimuth and pitch the elevation, looking at the centre."""
    yaw, pitch = math.radians(horizontal), math.radians(vertical)
    d = _FAR - (_FAR - _NEAR) * (zoom / _ZOOM_RANGE[1])
    cx, cy, cz = _CENTRE
    return {
        "position": {"x": cx + d * math.cos(pitch) * math.sin(yaw), "y": cy + d * math.sin(pitch),
                     "z": cz + d * math.cos(pitch) * math.cos(yaw)},
        "target": {"x": cx, "y": cy, "z": cz},
        "zoom": 1.0,
        "cameraType": "perspective",
        "fov": _FOV,
    }


def _clamp(value, bounds):
    return max(bounds[0], min(bounds[1], value))


_VIEW = dataclasses.replace(String("", optional=True),
                            extra=(("socketless", True), ("widgetType", "CAMERA_ANGLE_VIEW")))


@node(category="3d", outputs=(("LOAD3D_CAMERA", "camera_info"), ("STRING", "prompt")),
      display_name="Camera Angle", register=False,
      description="Pick a camera angle around a subject with a 3D preview. Outputs a camera_info "
                  "for 3D nodes and a plain-English shot description for prompts.")
def CameraAngle(horizontal_angle=Int(0, min=0, max=360, step=1, tooltip=(
                    "Azimuth around the subject in degrees. 0 is the front, 90 the right side, 180 the back.")),
                vertical_angle=Int(0, min=-30, max=60, step=1, tooltip=(
                    "Elevation in degrees. Negative looks up from below, positive looks down from above.")),
                zoom=Float(5.0, min=0.0, max=10.0, step=0.1,
                           tooltip="How close the camera is: 0 is a wide shot, 10 a close-up."),
                image=Socket("IMAGE", optional=True, tooltip=(
                    "Optional reference image shown on the front of the subject cube in the 3D preview.")),
                view=_VIEW):
    h = _clamp(int(horizontal_angle), _H_RANGE)
    v = _clamp(int(vertical_angle), _V_RANGE)
    z = _clamp(float(zoom), _ZOOM_RANGE)
    return camera_info(h, v, z), camera_prompt(h, v, z)


CameraAngle.spec = REGISTRY.add(replace_spec(CameraAngle.spec, info_extra=(  # type: ignore[attr-defined]
    ("search_aliases", ["multi angle", "camera view", "orbit camera", "shot angle", "camera prompt"]),)))
