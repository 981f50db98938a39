"""The node library's socket types and precision roles: the diffusion words the engine lacks.

`graph/` knows only generic socket types (INT, FLOAT, STRING, BOOLEAN, COMBO, `*`). This module
tells it, in one place, which of ComfyUI's types the library's declarations use hold a model (a
node consuming one gets a precision policy for it, part of its cache key), which are editor
widgets, and how the presets treat each kind of model (`graph.roles`). It runs when anything in
`mixgraph.nodes` is first imported (`nodes/__init__.py`), because a declaration reads the
registry as it is decorated: `Socket("MODEL")` must already be a model type then.

A family adding a model part with needs of its own declares a role for it beside these (as
`text_large` below: a `RolePresets` line in ``ROLE_PRESETS`` and a ``(socket, role)`` pair in
``FURTHER_ROLES``); its encoder entries name the role (``TextEncoderSlot.role``) and run under
``ctx.policy_for("CLIP", role="text_large")`` (``helpers/precision.encoder_policies``).
"""

from __future__ import annotations

from mixgraph.graph.roles import RolePresets, register_preset_role, register_role
from mixgraph.graph.spec import register_socket_type

#: Socket types that hold a model (ComfyUI's names).
MODEL_SOCKETS = ("MODEL", "CLIP", "VAE", "CONTROL_NET", "CLIP_VISION", "UPSCALE_MODEL",
                 "STYLE_MODEL")
#: Socket types whose values travel only over links and hold no model.
LINK_SOCKETS = ("CONDITIONING", "LATENT", "IMAGE", "MASK", "CLIP_VISION_OUTPUT", "GLIGEN",
                "NOISE", "SAMPLER", "SIGMAS", "GUIDER", "VIDEO", "AUDIO", "HISTOGRAM")
#: ComfyUI V3's own widget types the library's nodes use: BOUNDING_BOX (`{"x", "y", "width",
#: "height"}` ints), COLOR (`"#rrggbb"`) and WEBCAM (WebcamCapture: the annotated file name of
#: the frame the editor uploaded), IMAGECOMPARE (ImageCompare's slider view; the editor sends no
#: value), CURVE (CurveEditor's `{"points", "interpolation"}`). Their literals reach the body
#: uncoerced.
WIDGET_SOCKETS = ("BOUNDING_BOX", "COLOR", "WEBCAM", "IMAGECOMPARE", "CURVE")

#: How the presets treat each kind of model (`graph.precision.preset_spec` has the presets):
#: - unet, the denoiser (and a ControlNet, which runs beside it every step): native half
#:   precision wherever there is one (the NaN guard re-runs a non-finite step in f32); under
#:   `memory` it computes in it too, else it stores bf16 and computes f32.
#: - sd_unet, the SD 1.x / 2.x / SDXL UNet (the SD family's denoiser; a further role of MODEL
#:   that the samplers ask for by the model's family): as unet, except that `balanced` and
#:   `fast` give it int8 where the CPU's row of `graph.precision.CPU_INT8_TABLE` lists that
#:   preset (`cpu_int8`: int8 measured faster than the alternative there). Only the SD UNet
#:   was measured so (benchmarks/README.md); the DiTs' int8 is not faster than their bf16 on
#:   CPU (SD3.5-medium 11.1 vs 10.7 s/step) and fp8 files turn int8 off, so they keep unet.
#: - text, a text encoder: it runs once per prompt, so `balanced` keeps it f32 off accelerators
#:   (nothing to win); `fast` gives it native half.
#: - text_large, a text encoder of billions of weights (T5-XXL 4.7 B, Qwen3-4B, Gemma 2 2B: the
#:   DiT families' slots name it): f32 storage would take 19 / 16 / 10 GB (ComfyUI keeps them as
#:   the files store them: fp16 / bf16 / fp8). `balanced` stores bf16 and computes f32 off
#:   accelerators (half the memory, the arithmetic of `quality`), `memory` stores fp8 and
#:   computes f32, `fast` computes in native half.
#: - vae, an image model (decoder/encoder): its rounding shows as banding, so f32 off
#:   accelerators; `fast` prefers f16 where native (wider mantissa; the NaN guard is its
#:   fallback). Socket types with no role (CLIP vision, upscalers, style models) get the same
#:   careful treatment (`graph.roles.DEFAULT_PRESETS`).
ROLE_PRESETS = {
    "unet": RolePresets(quality=("f32",), balanced=("native_half", "f32"),
                        memory=("native_half", "bf16:f32"), fast=("native_half", "f32")),
    "sd_unet": RolePresets(quality=("f32",), balanced=("accelerator_half", "cpu_int8", "native_half", "f32"),
                           memory=("native_half", "bf16:f32"),
                           fast=("accelerator_half", "cpu_int8", "native_half", "f32")),
    "text": RolePresets(quality=("f32",), balanced=("accelerator_half", "f32"),
                        memory=("bf16:f32",), fast=("native_half", "f32")),
    "text_large": RolePresets(quality=("f32",), balanced=("accelerator_half", "bf16:f32"),
                              memory=("fp8_e4m3fn:f32",), fast=("native_half", "bf16:f32")),
    "vae": RolePresets(quality=("f32",), balanced=("accelerator_half", "f32"),
                       memory=("bf16:f32",), fast=("native_f16", "native_bf16", "f32")),
}
#: Each model socket type's own role, in the order reports list them. MODEL is primary: a preset
#: summarised as one SPEC (a workflow default in `Resolver.describe`) is the denoiser's.
SOCKET_ROLES = (("MODEL", "unet"), ("CONTROL_NET", "unet"), ("CLIP", "text"), ("VAE", "vae"))
#: Roles a socket type's values may hold beside its own (a CLIP's large encoders).
FURTHER_ROLES = (("CLIP", "text_large"), ("MODEL", "sd_unet"))
PRIMARY_SOCKET = "MODEL"


def register() -> None:
    """Register everything above with the engine (idempotent)."""
    for name in MODEL_SOCKETS:
        register_socket_type(name, model=True)
    for name in LINK_SOCKETS:
        register_socket_type(name)
    for name in WIDGET_SOCKETS:
        register_socket_type(name, link_only=False)
    for role, presets in ROLE_PRESETS.items():
        register_preset_role(role, presets)
    for socket, role in SOCKET_ROLES:
        register_role(socket, role, primary=socket == PRIMARY_SOCKET)
    for socket, role in FURTHER_ROLES:
        register_role(socket, role)


register()
