"""ContextWindowsManual from ComfyUI's ``comfy_extras/nodes_context_windows.py``
(comfyanonymous/ComfyUI 065c1df; machinery per drozbay/ComfyUI 03e034e ``comfy/context_windows.py``,
see ``sampling/context_windows.py``). Returns a new MODEL handle carrying the settings as a
sampler patch. WanContextWindowsManual and LTXVContextWindows (Wan / LTXV video models) are not
part of mixgraph."""

from __future__ import annotations

from mixgraph.graph.node import Boolean, Combo, Int, Socket, String, node
from mixgraph.nodes.sampling import context_windows as cw


@node(category="model_patches", outputs=("MODEL",),
      display_name="Context Windows (Manual)", description="Manually set context windows.")
def ContextWindowsManual(
        model=Socket("MODEL", tooltip="The model to apply context windows to during sampling."),
        context_length=Int(16, min=1, tooltip="The length of the context window."),
        context_overlap=Int(4, min=0, tooltip="The overlap of the context window."),
        context_schedule=Combo(cw.SCHEDULES, default="standard_static",
                               tooltip="Step-dependent scheduling algorithm for context windows."),
        context_stride=Int(1, min=1, tooltip="The stride of the context window; only applicable to uniform schedules."),
        closed_loop=Boolean(False, tooltip="Whether to close the context window loop; only applicable to looped schedules."),
        fuse_method=Combo(cw.FUSE_METHODS, default="pyramid", tooltip="The method to use to fuse the context windows."),
        dim=Int(0, min=0, max=5, tooltip="The dimension to apply the context windows to."),
        freenoise=Boolean(False, tooltip="Whether to apply FreeNoise noise shuffling, improves window blending."),
        cond_retain_index_list=String("", tooltip=(
            "List of latent indices to retain in the conditioning tensors for each window. For "
            "concat-style I2V models (e.g. Wan I2V, HunyuanVideo I2V, Cosmos I2V, SVD) the encoded "
            "start image lives in the c_concat conditioning channels; setting this to '0' will "
            "retain that start image content at sub-pos 0 of every window.")),
        split_conds_to_windows=Boolean(False, tooltip=(
            "Whether to split multiple conditionings (created by ConditionCombine) to each window "
            "based on region index.")),
        latent_retain_index_list=String("", tooltip=(
            "List of latent indices to retain in the noise latent itself for each window. Use for "
            "workflows where reference content (e.g. a start image) lives directly in the noise "
            "latent rather than in separate conditioning channels (e.g. inplace-style I2V like "
            "LTXV, AnimateDiff). Independent of cond_retain_index_list.")),
        causal_window_fix=Boolean(True, tooltip="Whether to add a causal fix frame to non-0-indexed context windows.")):
    patch = cw.ContextWindows(
        int(context_length), int(context_overlap), context_schedule, int(context_stride),
        bool(closed_loop), fuse_method, int(dim), bool(freenoise),
        cw.parse_index_list(cond_retain_index_list, "cond_retain_index_list"),
        bool(split_conds_to_windows),
        cw.parse_index_list(latent_retain_index_list, "latent_retain_index_list"),
        bool(causal_window_fix))
    return (model.with_sampler_patch(patch),)
