"""The model-free part of ComfyUI ``comfy_extras/nodes_sdpose.py`` (Comfy-Org/ComfyUI 47e4a90):
drawing POSE_KEYPOINT frames, face boxes from them, and cropping a batch by boxes.

POSE_KEYPOINT is ComfyUI's OpenPose-JSON value: a list of frames
``{"canvas_width", "canvas_height", "people": [{"pose_keypoints_2d" (18 x [x, y, score]),
"foot_keypoints_2d" (6, may be missing), "face_keypoints_2d" (70: 68 landmarks + right eye +
left eye), "hand_right_keypoints_2d" (21), "hand_left_keypoints_2d" (21)}]}``, coordinates in
pixels. BOUNDING_BOX here is a list per frame of ``{"x", "y", "width", "height"}`` dicts (a single
dict stands for ``[[dict]]``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from mixgraph.nodes.helpers import pose_draw
from mixgraph.nodes.models.resize import upscale

HEAD_JOINTS = (0, 14, 15, 16, 17)   # nose, eyes, ears (OpenPose order)


class PoseError(ValueError):
    pass


def _points(person: dict, key: str, n: int, required: bool = True) -> tuple[np.ndarray, np.ndarray]:
    flat = person.get(key)
    if not flat:
        if required:
            raise PoseError(f"keypoints: a person has no {key!r}")
        return np.zeros((n, 2), np.float32), np.zeros(n, np.float32)
    arr = np.asarray(flat, dtype=np.float32)
    if arr.size != n * 3:
        raise PoseError(f"keypoints: {key!r} holds {arr.size} numbers, expected {n * 3} "
                        f"({n} points of x, y, score)")
    arr = arr.reshape(n, 3)
    return arr[:, :2], arr[:, 2]


def _frames(keypoints: Any) -> list[dict]:
    if not isinstance(keypoints, list) or not all(
            isinstance(f, dict) and "people" in f for f in keypoints):
        raise PoseError("keypoints: expected POSE_KEYPOINT, a list of frames "
                        "{canvas_width, canvas_height, people}")
    return keypoints


def draw_keypoints(keypoints: Any, draw_body: bool, draw_hands: bool, draw_face: bool,
                   draw_feet: bool, stick_width: int, face_point_size: int,
                   score_threshold: float, draw_head: bool) -> torch.Tensor:
    """`SDPoseDrawKeypoints`: one black canvas per frame, the size of the first frame, every
    person drawn on it; [B, H, W, 3] in [0, 1]. No frames: zeros (1, 64, 64, 3).

    `draw_head=False` leaves out the head joints (nose, eyes, ears) and the limbs to them: the
    drawing helper ComfyUI imports (keypoint_draw.py 1294041) was read without that switch, so
    this is mixgraph's reading of its name."""
    if not keypoints:
        return torch.zeros((1, 64, 64, 3), dtype=torch.float32)
    frames = _frames(keypoints)
    h, w = int(frames[0]["canvas_height"]), int(frames[0]["canvas_width"])
    out = []
    for frame in frames:
        canvas = np.zeros((h, w, 3), dtype=np.uint8)
        for person in frame["people"]:
            body = _points(person, "pose_keypoints_2d", 18)
            feet = _points(person, "foot_keypoints_2d", 6, required=False)
            face_kp, face_sc = _points(person, "face_keypoints_2d", 70)
            rhand = _points(person, "hand_right_keypoints_2d", 21)
            lhand = _points(person, "hand_left_keypoints_2d", 21)
            kp = np.concatenate([body[0], feet[0], face_kp[:68], rhand[0], lhand[0]])
            sc = np.concatenate([body[1], feet[1], face_sc[:68], rhand[1], lhand[1]])
            if not draw_head:
                sc = sc.copy()
                sc[list(HEAD_JOINTS)] = -math.inf
            pose_draw.draw_wholebody(canvas, kp, sc, threshold=score_threshold, draw_body=draw_body,
                                     draw_feet=draw_feet, draw_face=draw_face, draw_hands=draw_hands,
                                     stick_width=stick_width, face_point_size=face_point_size)
        out.append(canvas)
    return torch.from_numpy(np.stack(out)).float() / 255.0


def face_box(face_xy: np.ndarray, scale: float, w: int, h: int) -> tuple[int, int, int, int]:
    """(x1, x2, y1, y2) of one face: the extent of all its points (invalid -1 ones included, as
    in ComfyUI; normalised and scaled back as it does), grown to `scale` times the area with the
    aspect kept, widened evenly but grown 3:1 upward, clamped to the image, truncated to ints."""
    pts = (face_xy / np.array([w, h], np.float32)) * np.array([w, h])
    minx, miny = pts.min(axis=0)
    maxx, maxy = pts.max(axis=0)
    bw, bh = maxx - minx, maxy - miny
    if bw <= 0 or bh <= 0:
        return 0, 0, 0, 0
    area = bw * bh * scale
    nw, nh = math.sqrt(area * (bw / bh)), math.sqrt(area * (bh / bw))
    dw, dh = (nw - bw) / 2, (nh - bh) / 4
    return (int(max(minx - dw, 0)), int(min(maxx + dw, w)),
            int(max(miny - 3 * dh, 0)), int(min(maxy + dh, h)))


def face_bboxes(keypoints: Any, scale: float, force_square: bool) -> list[list[dict[str, int]]]:
    """`SDPoseFaceBBoxes`: per frame, one box per person with face keypoints."""
    out = []
    for frame in _frames(keypoints):
        h, w = int(frame["canvas_height"]), int(frame["canvas_width"])
        boxes = []
        for person in frame["people"]:
            flat = person.get("face_keypoints_2d") or []
            if not flat:
                continue
            xy = np.asarray(flat, dtype=np.float32).reshape(-1, 3)[:, :2]
            x1, x2, y1, y2 = face_box(xy, scale, w, h)
            if not (x2 > x1 and y2 > y1):
                continue
            if force_square and (x2 - x1) != (y2 - y1):
                side = max(x2 - x1, y2 - y1)
                cx, cy, half = (x1 + x2) // 2, (y1 + y2) // 2, side // 2
                x1, y1 = max(0, cx - half), max(0, cy - half)
                x2, y2 = min(w, x1 + side), min(h, y1 + side)
                x1, y1 = max(0, x2 - side), max(0, y2 - side)
            boxes.append({"x": x1, "y": y1, "width": x2 - x1, "height": y2 - y1})
        out.append(boxes)
    return out


def _box_int(b: Any, key: str) -> int:
    if not isinstance(b, dict) or key not in b:
        raise PoseError(f"bboxes: a box is a dict with x, y, width, height; got {b!r}")
    return int(b[key])


def normalise_boxes(bboxes: Any) -> list:
    return [[bboxes]] if not isinstance(bboxes, list) else bboxes


def crop_by_bboxes(image: torch.Tensor, bboxes: Any, out_w: int, out_h: int, padding: int,
                   keep_aspect: str) -> torch.Tensor:
    """`CropByBBoxes`: per frame the union of its boxes (+ padding, clamped), resized with area
    to out_w x out_h (`stretch`) or fitted and centred on black (`pad`); all crops as one batch.
    Frame i takes box list min(i, last); frames without boxes give no crop; none at all: the
    input. A degenerate region falls back to a 0.3*min(H, W) square centred horizontally at
    0.1*H; if that is empty too, a black crop."""
    bboxes = normalise_boxes(bboxes)
    if len(bboxes) == 0:
        return image
    b, ih, iw, ch = image.shape
    crops = []
    for i in range(b):
        boxes = bboxes[min(i, len(bboxes) - 1)]
        if not boxes:
            continue
        if isinstance(boxes, dict):
            boxes = [boxes]
        x1 = min(_box_int(bx, "x") for bx in boxes)
        y1 = min(_box_int(bx, "y") for bx in boxes)
        x2 = max(_box_int(bx, "x") + _box_int(bx, "width") for bx in boxes)
        y2 = max(_box_int(bx, "y") + _box_int(bx, "height") for bx in boxes)
        x1, y1 = max(0, x1 - padding), max(0, y1 - padding)
        x2, y2 = min(iw, x2 + padding), min(ih, y2 + padding)
        if x2 <= x1 or y2 <= y1:
            side = int(min(ih, iw) * 0.3)
            x1, y1 = max(0, (iw - side) // 2), max(0, int(ih * 0.1))
            x2, y2 = min(iw, x1 + side), min(ih, y1 + side)
            if x2 <= x1 or y2 <= y1:
                crops.append(torch.zeros(1, ch, out_h, out_w, dtype=image.dtype, device=image.device))
                continue
        crop = image[i:i + 1, y1:y2, x1:x2, :].movedim(-1, 1)
        if keep_aspect == "pad":
            cw, chh = x2 - x1, y2 - y1
            s = min(out_w / cw, out_h / chh)
            sw, sh = int(round(cw * s)), int(round(chh * s))
            scaled = upscale(crop, sw, sh, "area", "disabled")
            canvas = torch.zeros(1, ch, out_h, out_w, dtype=image.dtype, device=image.device)
            left, top = (out_w - sw) // 2, (out_h - sh) // 2
            canvas[:, :, top:top + sh, left:left + sw] = scaled
            crops.append(canvas)
        elif keep_aspect == "stretch":
            crops.append(upscale(crop, out_w, out_h, "area", "disabled"))
        else:
            raise PoseError(f"keep_aspect: {keep_aspect!r} is not 'stretch' or 'pad'")
    if not crops:
        return image
    return torch.cat(crops).movedim(1, -1)
