"""ComfyUI ``comfy_extras/nodes_model_patch.py`` (read at Comfy-Org/ComfyUI 08f68f0), its SD-family
part: `ModelPatchLoader` (the SUPIR format; the other formats, for model families mixgraph does
not run, are refused by name) and `SUPIRApply`. Runtime: ``adapters/supir.py``."""

from __future__ import annotations

import dataclasses

import torch

from mixgraph.graph.node import Float, Socket, node, replace_spec
from mixgraph.graph.registry import REGISTRY
from mixgraph.nodes.helpers.model_files import MODEL_PATCH
from mixgraph.nodes.adapters.supir import (ModelPatchError, RestoreCFG, SupirPatch, SupirWeights,
                                           denoise_encoder_vae, load_model_patch)
from mixgraph.nodes.vae.vae import encode_image
from mixgraph.nodes.helpers.precision import effective

_EXPERIMENTAL = (("experimental", True),)


def _advanced(inp):
    return dataclasses.replace(inp, extra=inp.extra + (("advanced", True),))


# No docstrings on the node functions: they would become object_info descriptions.
@node(category="model/loaders", outputs=("MODEL_PATCH",), display_name="Load Model Patch", register=False)
def ModelPatchLoader(ctx, name=MODEL_PATCH.input()):
    return (load_model_patch(MODEL_PATCH.path(ctx.env, name)),)


ModelPatchLoader.spec = REGISTRY.add(replace_spec(ModelPatchLoader.spec, info_extra=_EXPERIMENTAL))


def _check_fits(model, patch: SupirWeights) -> None:
    c = model.config
    if c.adm_in_channels is None:
        raise ModelPatchError(f"SUPIRApply: SUPIR is an SDXL model patch; the model is {model.kind}")
    n_out = sum(n + 1 for n in c.num_res_blocks)
    expected = 1 + n_out + (len(c.channel_mult) - 1)
    control = patch.model.control_model
    if (len(patch.model.project_modules) != expected or len(control.input_blocks) != n_out
            or control.config.model_channels != c.model_channels):
        raise ModelPatchError(
            f"SUPIRApply: the model patch {patch.name!r} was built for another UNet ({len(control.input_blocks)} "
            f"control blocks of base width {control.config.model_channels}, "
            f"{len(patch.model.project_modules)} adapters; this UNet needs {n_out} of width {c.model_channels} "
            f"and {expected} adapters)")


def _encode(vae, policy, pixels: torch.Tensor, denoise: dict | None) -> torch.Tensor:
    if not denoise:
        return vae.encode(pixels, policy)
    module = denoise_encoder_vae(vae.module(policy), denoise)
    with torch.inference_mode():
        return encode_image(lambda x: module.encode(x).float(), pixels, downscale=vae.downscale,
                            latent_channels=vae.latent_channels)


@node(category="model/patch/supir", outputs=("MODEL",), display_name="Apply SUPIR Patch", register=False)
def SUPIRApply(ctx, model=Socket("MODEL"), model_patch=Socket("MODEL_PATCH"), vae=Socket("VAE"),
               image=Socket("IMAGE"),
               strength_start=Float(1.0, min=0.0, max=10.0, step=0.01,
                                    tooltip="Control strength at the start of sampling (high sigma)."),
               strength_end=Float(1.0, min=0.0, max=10.0, step=0.01,
                                  tooltip="Control strength at the end of sampling (low sigma). Linearly "
                                          "interpolated from start."),
               restore_cfg=_advanced(Float(4.0, min=0.0, max=20.0, step=0.1,
                                           tooltip="Pulls denoised output toward the input latent. Higher = "
                                                   "stronger fidelity to input. 0 to disable.")),
               restore_cfg_s_tmin=_advanced(Float(0.05, min=0.0, max=1.0, step=0.01,
                                                  tooltip="Sigma threshold below which restore_cfg is disabled."))):
    if not isinstance(model_patch, SupirWeights):
        raise ModelPatchError("SUPIRApply: model_patch is not a SUPIR model patch")
    _check_fits(model, model_patch)
    policy = effective(ctx, vae, "VAE")
    fmt = model.latent_format
    hint = fmt.process_in(_encode(vae, policy, image[..., :3], model_patch.denoise_encoder))
    patched = model.with_unet_patch(SupirPatch(model_patch, hint, float(strength_start), float(strength_end)))
    if restore_cfg > 0.0:
        # as ComfyUI: the hint decoded and re-encoded with the plain VAE
        decoded = vae.decode(fmt.process_out(hint), policy)
        x_center = fmt.process_in(vae.encode(decoded[..., :3], policy))
        patched = patched.with_sampler_patch(RestoreCFG(x_center, float(restore_cfg), float(restore_cfg_s_tmin)))
    return (patched,)


SUPIRApply.spec = REGISTRY.add(replace_spec(SUPIRApply.spec, info_extra=_EXPERIMENTAL))
