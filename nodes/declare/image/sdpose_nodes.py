"""ComfyUI ``comfy_extras/nodes_sdpose.py`` (Comfy-Org/ComfyUI 47e4a90): `SDPoseDrawKeypoints`,
`SDPoseFaceBBoxes`, `CropByBBoxes` (no model; `nodes/helpers/sdpose_ops.py`, drawing in
`nodes/helpers/pose_draw.py`) and `SDPoseKeypointExtractor` (an SDPose checkpoint: a Lotus UNet with a
heatmap head, loaded by UNETLoader / CheckpointLoaderSimple; pipeline in `nodes/helpers/sdpose_extract.py`,
head and decoding in `nodes/families/sd/sdpose.py`)."""

from __future__ import annotations

import secrets
from dataclasses import replace
from pathlib import Path

from mixgraph.graph.node import Boolean, Combo, Float, Int, Result, Socket, Widget, node, replace_spec
from mixgraph.graph.registry import REGISTRY
from mixgraph.graph.spec import Output
from mixgraph.nodes.helpers import crop_ops, imaging, sdpose_extract, sdpose_ops
from mixgraph.nodes.helpers.precision import effective



def _boxes_socket(optional: bool = False, tooltip: str | None = None):
    """ComfyUI's `io.BoundingBox.Input(..., force_input=True)`: a link-only BOUNDING_BOX that
    still shows the widget's default box and `socketless` in object_info."""
    return replace(Widget("BOUNDING_BOX", dict(crop_ops.BOX_DEFAULTS), optional=optional,
                          tooltip=tooltip, socketless=True), force_input=True)


@node(category="image/detection", outputs=(Output("POSE_KEYPOINT", "keypoints"),),
      display_name="SDPose Keypoint Extractor",
      description="Extract pose keypoints from images using the SDPose model: "
                  "https://huggingface.co/Comfy-Org/SDPose/tree/main/checkpoints")
def SDPoseKeypointExtractor(ctx, model=Socket("MODEL"), vae=Socket("VAE"), image=Socket("IMAGE"),
                            batch_size=Int(16, min=1, max=10000, step=1),
                            bboxes=_boxes_socket(optional=True,
                                                 tooltip="Optional bounding boxes for more accurate "
                                                         "detections. Required for multi-person "
                                                         "detection.")):
    done = [0]

    def on_image(n: int) -> None:
        done[0] += n
        ctx.progress(done[0], int(image.shape[0]))

    return (sdpose_extract.extract(model, vae, image, batch_size, bboxes, effective(ctx, model, "MODEL"),
                                   effective(ctx, vae, "VAE"), on_image),)


@node(category="image/detection", outputs=("IMAGE",), display_name="SDPose Draw Keypoints")
def SDPoseDrawKeypoints(keypoints=Socket("POSE_KEYPOINT"), draw_body=Boolean(True),
                        draw_hands=Boolean(True), draw_face=Boolean(True), draw_feet=Boolean(False),
                        stick_width=Int(4, min=1, max=10, step=1),
                        face_point_size=Int(3, min=1, max=10, step=1),
                        score_threshold=Float(0.3, min=0.0, max=1.0, step=0.01),
                        draw_head=Boolean(True)):
    return (sdpose_ops.draw_keypoints(keypoints, draw_body, draw_hands, draw_face, draw_feet,
                                      stick_width, face_point_size, score_threshold, draw_head),)


@node(category="image/detection",
      outputs=(Output("BOUNDING_BOX", "bboxes"),),
      display_name="SDPose Face Bounding Boxes")
def SDPoseFaceBBoxes(keypoints=Socket("POSE_KEYPOINT"),
                     scale=Float(1.5, min=1.0, max=10.0, step=0.1,
                                 tooltip="Multiplier for the bounding box area around each detected face."),
                     force_square=Boolean(True, tooltip="Expand the shorter bbox axis so the crop "
                                                        "region is always square.")):
    return (sdpose_ops.face_bboxes(keypoints, scale, force_square),)


@node(category="image/transform",
      outputs=("IMAGE",),
      display_name="Crop By Bounding Boxes",
      description="Crop and resize regions from the input image batch based on provided bounding "
                  "boxes.", register=False)
def CropByBBoxes(ctx, image=Socket("IMAGE"), bboxes=_boxes_socket(),
                 output_width=Int(512, min=64, max=4096, step=8, tooltip="Width each crop is resized to."),
                 output_height=Int(512, min=64, max=4096, step=8, tooltip="Height each crop is resized to."),
                 padding=Int(0, min=0, max=1024, step=1, tooltip="Extra padding in pixels added on "
                                                                 "each side of the bbox before cropping."),
                 keep_aspect=Combo(["stretch", "pad"], "stretch",
                                   tooltip="Whether to stretch the crop to fit the output size, or pad "
                                           "with black pixels to preserve aspect ratio.")):
    boxes = sdpose_ops.normalise_boxes(bboxes)
    if len(boxes) == 0:
        return (image,)
    out = sdpose_ops.crop_by_bboxes(image, boxes, output_width, output_height, padding, keep_aspect)
    # ComfyUI's preview: the first source frame (PreviewImage, temp) and the first frame's boxes
    prefix = "comfy.crop_bboxes.source_temp_" + "".join(
        secrets.choice("abcdefghijklmnopqrstupvxyz") for _ in range(5))
    source = imaging.save_images(image[:1], Path(ctx.env.temp), prefix, kind="temp", compress_level=1,
                                 metadata=False)
    first = boxes[0] if isinstance(boxes[0], list) else [boxes[0]]
    shown = [{k: int(b[k]) for k in crop_ops.BOX_DEFAULTS} for b in first]
    return Result((out,), ui={"source_images": source, "input_bboxes": shown})


REGISTRY.add(replace_spec(CropByBBoxes.spec, info_extra=(("has_intermediate_output", True),)))
