"""ComfyUI's model-free latent nodes: batch picking, composites, transforms (nodes.py) and
arithmetic / batching (comfy_extras/nodes_latent.py)."""

from __future__ import annotations

from mixgraph.graph.node import MAX_RESOLUTION, Combo, Float, Int, Socket, node
from mixgraph.nodes.helpers import latent_ops
from mixgraph.nodes.sampling.cfg_patches_extra import LatentOperationCFG


@node(category="latent/batch", outputs=("LATENT",), display_name="Latent From Batch")
def LatentFromBatch(samples=Socket("LATENT"), batch_index=Int(0, min=0, max=63),
                    length=Int(1, min=1, max=64)):
    return (latent_ops.from_batch(samples, batch_index, length),)


@node(category="latent/batch", outputs=("LATENT",), display_name="Repeat Latent Batch")
def RepeatLatentBatch(samples=Socket("LATENT"), amount=Int(1, min=1, max=64)):
    return (latent_ops.repeat_batch(samples, amount),)


@node(category="latent/inpaint", outputs=("LATENT",), display_name="Set Latent Noise Mask")
def SetLatentNoiseMask(samples=Socket("LATENT"), mask=Socket("MASK")):
    return (latent_ops.with_noise_mask(samples, mask),)


@node(category="latent", outputs=("LATENT",))
def LatentComposite(samples_to=Socket("LATENT"), samples_from=Socket("LATENT"),
                    x=Int(0, min=0, max=MAX_RESOLUTION, step=8),
                    y=Int(0, min=0, max=MAX_RESOLUTION, step=8),
                    feather=Int(0, min=0, max=MAX_RESOLUTION, step=8)):
    return (latent_ops.composite(samples_to, samples_from, x, y, feather),)


@node(category="_for_testing", outputs=("LATENT",), display_name="Latent Blend")
def LatentBlend(samples1=Socket("LATENT"), samples2=Socket("LATENT"),
                blend_factor=Float(0.5, min=0, max=1, step=0.01)):
    return (latent_ops.blend(samples1, samples2, blend_factor),)


@node(category="latent/transform", outputs=("LATENT",), display_name="Rotate Latent")
def LatentRotate(samples=Socket("LATENT"), rotation=Combo(latent_ops.ROTATIONS)):
    return (latent_ops.rotate(samples, rotation),)


@node(category="latent/transform", outputs=("LATENT",), display_name="Flip Latent")
def LatentFlip(samples=Socket("LATENT"), flip_method=Combo(latent_ops.FLIPS)):
    return (latent_ops.flip(samples, flip_method),)


@node(category="latent/transform", outputs=("LATENT",), display_name="Crop Latent")
def LatentCrop(samples=Socket("LATENT"), width=Int(512, min=64, max=MAX_RESOLUTION, step=8),
               height=Int(512, min=64, max=MAX_RESOLUTION, step=8),
               x=Int(0, min=0, max=MAX_RESOLUTION, step=8),
               y=Int(0, min=0, max=MAX_RESOLUTION, step=8)):
    return (latent_ops.crop(samples, width, height, x, y),)


@node(category="latent/advanced", outputs=("LATENT",))
def LatentAdd(samples1=Socket("LATENT"), samples2=Socket("LATENT")):
    return (latent_ops.add(samples1, samples2),)


@node(category="latent/advanced", outputs=("LATENT",))
def LatentSubtract(samples1=Socket("LATENT"), samples2=Socket("LATENT")):
    return (latent_ops.subtract(samples1, samples2),)


@node(category="latent/advanced", outputs=("LATENT",))
def LatentMultiply(samples=Socket("LATENT"), multiplier=Float(1.0, min=-10.0, max=10.0, step=0.01)):
    return (latent_ops.multiply(samples, multiplier),)


@node(category="latent/advanced", outputs=("LATENT",))
def LatentInterpolate(samples1=Socket("LATENT"), samples2=Socket("LATENT"),
                      ratio=Float(1.0, min=0.0, max=1.0, step=0.01)):
    return (latent_ops.interpolate(samples1, samples2, ratio),)


@node(category="latent/batch", outputs=("LATENT",))
def LatentBatch(samples1=Socket("LATENT"), samples2=Socket("LATENT")):
    return (latent_ops.concat_batch(samples1, samples2),)


@node(category="latent/advanced", outputs=("LATENT",))
def LatentBatchSeedBehavior(samples=Socket("LATENT"),
                            seed_behavior=Combo(latent_ops.SEED_BEHAVIORS, default="fixed")):
    return (latent_ops.seed_behavior(samples, seed_behavior),)


@node(category="latent/advanced", outputs=("LATENT",))
def LatentConcat(samples1=Socket("LATENT"), samples2=Socket("LATENT"), dim=Combo(latent_ops.CONCAT_DIMS)):
    return (latent_ops.concat(samples1, samples2, dim),)


@node(category="latent/advanced", outputs=("LATENT",))
def LatentCut(samples=Socket("LATENT"), dim=Combo(latent_ops.CUT_DIMS),
              index=Int(0, min=-MAX_RESOLUTION, max=MAX_RESOLUTION, step=1),
              amount=Int(1, min=1, max=MAX_RESOLUTION, step=1)):
    return (latent_ops.cut(samples, dim, index, amount),)


@node(category="latent/advanced", outputs=("LATENT",))
def LatentCutToBatch(samples=Socket("LATENT"), dim=Combo(latent_ops.CUT_TO_BATCH_DIMS),
                     slice_size=Int(1, min=1, max=MAX_RESOLUTION, step=1)):
    return (latent_ops.cut_to_batch(samples, dim, slice_size),)


@node(category="latent/advanced/operations", outputs=("LATENT",))
def LatentApplyOperation(samples=Socket("LATENT"), operation=Socket("LATENT_OPERATION")):
    return (latent_ops.apply_operation(samples, operation),)


@node(category="latent/advanced/operations", outputs=("MODEL",))
def LatentApplyOperationCFG(model=Socket("MODEL"), operation=Socket("LATENT_OPERATION")):
    """Applies the operation to the guidance direction (cond − uncond) before CFG, every step
    (at cfg = 1 to the conditional prediction itself)."""
    return (model.with_sampler_patch(LatentOperationCFG(operation)),)


@node(category="latent/advanced/operations", outputs=("LATENT_OPERATION",))
def LatentOperationTonemapReinhard(multiplier=Float(1.0, min=0.0, max=100.0, step=0.01)):
    return (latent_ops.TonemapReinhard(multiplier),)


@node(category="latent/advanced/operations", outputs=("LATENT_OPERATION",))
def LatentOperationSharpen(sharpen_radius=Int(9, min=1, max=31, step=1),
                           sigma=Float(1.0, min=0.1, max=10.0, step=0.1),
                           alpha=Float(0.1, min=0.0, max=5.0, step=0.01)):
    return (latent_ops.SharpenDirections(sharpen_radius, sigma, alpha),)


@node(category="latent/advanced/operations", outputs=("LATENT_OPERATION",), display_name="Latent Operation Blend")
def LatentOperationBlend(reference=Socket("LATENT"), strength=Float(1.0, min=0.0, max=1.0, step=0.0001)):
    return (latent_ops.BlendToward(reference.samples, strength),)
