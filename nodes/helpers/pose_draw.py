"""OpenPose / DWPose-style drawing of whole-body keypoints, as ComfyUI's
``comfy_extras/pose/keypoint_draw.py`` (comfyanonymous/ComfyUI 1294041) draws them with its
NumPy backend (the one it uses when OpenCV is not installed; mixgraph has no OpenCV).

Keypoints: 134 (x, y) in pixels with scores, OpenPose order: body 0-17 (neck at 1), feet 18-23,
face 24-91, right hand 92-112, left hand 113-133. Body limbs are filled ellipse polygons
(half-length x `stick_width`) in the 18 DWPose colours, one colour per limb in sequence order;
body and foot joints are radius-4 dots in the colour of their index; hand bones are 2-px lines in
an HSV rainbow (edge i of 20: hue i/20), hand joints radius-4 blue dots; face points white dots of
`face_point_size`. A limb or point below `threshold` is skipped; hands and face also skip points
at x or y <= 0.01 and anything off the canvas.
"""

from __future__ import annotations

import colorsys
import math

import numpy as np

# DWPose limbSeq, 1-based joint numbers in OpenPose order
BODY_LIMBS = ((2, 3), (2, 6), (3, 4), (4, 5), (6, 7), (7, 8), (2, 9), (9, 10), (10, 11), (2, 12),
              (12, 13), (13, 14), (2, 1), (1, 15), (15, 17), (1, 16), (16, 18))
COLORS = ((255, 0, 0), (255, 85, 0), (255, 170, 0), (255, 255, 0), (170, 255, 0), (85, 255, 0),
          (0, 255, 0), (0, 255, 85), (0, 255, 170), (0, 255, 255), (0, 170, 255), (0, 85, 255),
          (0, 0, 255), (85, 0, 255), (170, 0, 255), (255, 0, 255), (255, 0, 170), (255, 0, 85))
HAND_EDGES = tuple((0, a) if a % 4 == 1 else (a - 1, a) for a in range(1, 21))
MARKER_RADIUS = 4
HAND_STICK_WIDTH = 2
HAND_MARKER_RADIUS = 4
HAND_DOT_COLOR = (0, 0, 255)


def fill_circle(canvas: np.ndarray, cx: int, cy: int, radius: float, color) -> None:
    h, w = canvas.shape[:2]
    r = int(np.ceil(radius))
    y0, y1 = max(0, cy - r), min(h, cy + r + 1)
    x0, x1 = max(0, cx - r), min(w, cx + r + 1)
    if y1 <= y0 or x1 <= x0:
        return
    yy, xx = np.ogrid[y0:y1, x0:x1]
    canvas[y0:y1, x0:x1][(xx - cx) ** 2 + (yy - cy) ** 2 <= radius ** 2] = color


def draw_line(canvas: np.ndarray, p0, p1, color, thickness: int = 1) -> None:
    """Bresenham points; thicker lines stamp a disc of radius thickness/2 + 0.5 on each."""
    x, y = int(p0[0]), int(p0[1])
    xe, ye = int(p1[0]), int(p1[1])
    dx, dy = abs(xe - x), abs(ye - y)
    sx = 1 if x < xe else -1
    sy = 1 if y < ye else -1
    err = dx - dy
    points = []
    while True:
        points.append((x, y))
        if x == xe and y == ye:
            break
        e2 = 2 * err
        if e2 > -dy:
            err -= dy
            x += sx
        if e2 < dx:
            err += dx
            y += sy
    h, w = canvas.shape[:2]
    if thickness > 1:
        radius = thickness / 2.0 + 0.5
        for px, py in points:
            fill_circle(canvas, px, py, radius, color)
    else:
        for px, py in points:
            if 0 <= px < w and 0 <= py < h:
                canvas[py, px] = color


def ellipse_polygon(center, axes, angle: int) -> list[list[int]]:
    """cv2.ellipse2Poly over the full 0..360 arc with 1-degree steps (ComfyUI's NumPy version:
    axes grown by 0.5, consecutive duplicates dropped)."""
    ax, ay = axes[0] + 0.5, axes[1] + 0.5
    rad = math.radians(angle % 360)
    ca, sa = math.cos(rad), math.sin(rad)
    pts: list[list[int]] = []
    for deg in range(0, 361):
        t = math.radians(deg)
        px, py = ax * math.cos(t), ay * math.sin(t)
        pt = [int(round(center[0] + px * ca - py * sa)), int(round(center[1] + px * sa + py * ca))]
        if not pts or pts[-1] != pt:
            pts.append(pt)
    return pts if len(pts) > 1 else [list(center), list(center)]


def fill_convex(canvas: np.ndarray, pts, color) -> None:
    """Even-odd scanline fill over the polygon's bounding box (edges half-open in y)."""
    if len(pts) < 3:
        return
    p = np.asarray(pts, dtype=np.int64)
    h, w = canvas.shape[:2]
    y0, y1 = max(0, p[:, 1].min()), min(h, p[:, 1].max() + 1)
    x0, x1 = max(0, p[:, 0].min()), min(w, p[:, 0].max() + 1)
    if y1 <= y0 or x1 <= x0:
        return
    yy, xx = np.mgrid[y0:y1, x0:x1]
    inside = np.zeros(yy.shape, dtype=bool)
    for i in range(len(p)):
        a, b = p[i], p[(i + 1) % len(p)]
        if a[1] == b[1]:
            continue
        if a[1] > b[1]:
            a, b = b, a
        band = (yy >= a[1]) & (yy < b[1])
        if not band.any():
            continue
        inside ^= band & (xx >= a[0] + (yy - a[1]) * (b[0] - a[0]) / (b[1] - a[1]))
    canvas[y0:y1, x0:x1][inside] = color


def _hand(canvas, kp, sc, base, threshold, W, H):
    eps = 0.01
    for ie, (a, b) in enumerate(HAND_EDGES):
        i1, i2 = base + a, base + b
        if sc[i1] < threshold or sc[i2] < threshold:
            continue
        x1, y1 = int(kp[i1][0]), int(kp[i1][1])
        x2, y2 = int(kp[i2][0]), int(kp[i2][1])
        if min(x1, y1, x2, y2) > eps and 0 <= x1 < W and 0 <= y1 < H and 0 <= x2 < W and 0 <= y2 < H:
            r, g, bl = colorsys.hsv_to_rgb(ie / float(len(HAND_EDGES)), 1.0, 1.0)
            draw_line(canvas, (x1, y1), (x2, y2), (int(r * 255), int(g * 255), int(bl * 255)),
                      HAND_STICK_WIDTH)
    for i in range(base, base + 21):
        if sc[i] < threshold:
            continue
        x, y = int(kp[i][0]), int(kp[i][1])
        if x > eps and y > eps and 0 <= x < W and 0 <= y < H:
            fill_circle(canvas, x, y, HAND_MARKER_RADIUS, HAND_DOT_COLOR)


def draw_wholebody(canvas: np.ndarray, kp: np.ndarray, sc: np.ndarray, *, threshold: float = 0.3,
                   draw_body: bool = True, draw_feet: bool = True, draw_face: bool = True,
                   draw_hands: bool = True, stick_width: int = 4, face_point_size: int = 3
                   ) -> np.ndarray:
    """Draw one person's 134 keypoints on an [H, W, 3] uint8 RGB canvas, in place."""
    H, W = canvas.shape[:2]
    n = len(kp)
    if draw_body and n >= 18:
        for i, (a, b) in enumerate(BODY_LIMBS):
            i1, i2 = a - 1, b - 1
            if sc[i1] < threshold or sc[i2] < threshold:
                continue
            (x1, y1), (x2, y2) = kp[i1][:2], kp[i2][:2]
            length = math.hypot(x1 - x2, y1 - y2)
            if length < 1:
                continue
            angle = math.degrees(math.atan2(y1 - y2, x1 - x2))
            poly = ellipse_polygon((int((x1 + x2) / 2), int((y1 + y2) / 2)),
                                   (int(length / 2), stick_width), int(angle))
            fill_convex(canvas, poly, COLORS[i % len(COLORS)])
        for i in range(18):
            if sc[i] < threshold:
                continue
            x, y = int(kp[i][0]), int(kp[i][1])
            if 0 <= x < W and 0 <= y < H:
                fill_circle(canvas, x, y, MARKER_RADIUS, COLORS[i % len(COLORS)])
    if draw_feet and n >= 24:
        for i in range(18, 24):
            if sc[i] < threshold:
                continue
            x, y = int(kp[i][0]), int(kp[i][1])
            if 0 <= x < W and 0 <= y < H:
                fill_circle(canvas, x, y, MARKER_RADIUS, COLORS[i % len(COLORS)])
    if draw_hands and n >= 113:
        _hand(canvas, kp, sc, 92, threshold, W, H)
    if draw_hands and n >= 134:
        _hand(canvas, kp, sc, 113, threshold, W, H)
    if draw_face and n >= 92:
        for i in range(24, 92):
            if sc[i] < threshold:
                continue
            x, y = int(kp[i][0]), int(kp[i][1])
            if x > 0.01 and y > 0.01 and 0 <= x < W and 0 <= y < H:
                fill_circle(canvas, x, y, face_point_size, (255, 255, 255))
    return canvas
