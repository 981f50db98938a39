"""Model merging nodes (comfy_extras nodes_model_merging.py and nodes_model_merging_model_specific.py).

Every merge returns a new handle of the first model with a ``MergePatch`` appended; the weights
are blended when a consumer materializes it (``nodes/weights/merge.py`` has the formulas).
"""

from __future__ import annotations

from mixgraph.graph.node import Float, Socket, node, replace_spec, spec_from_function
from mixgraph.graph.registry import REGISTRY
from mixgraph.nodes.weights.merge import ADD, SIMPLE, SUBTRACT, merge_clip, merge_model

_RATIO = dict(min=0.0, max=1.0, step=0.01)
_MULT = dict(min=-10.0, max=10.0, step=0.01)
_CATEGORY = "advanced/model_merging"


@node(category=_CATEGORY, outputs=("MODEL",))
def ModelMergeSimple(model1=Socket("MODEL"), model2=Socket("MODEL"), ratio=Float(1.0, **_RATIO)):
    """model1 · ratio + model2 · (1 - ratio)."""
    return (merge_model(model1, model2, SIMPLE, ratio),)


@node(category=_CATEGORY, outputs=("MODEL",))
def ModelMergeSubtract(model1=Socket("MODEL"), model2=Socket("MODEL"), multiplier=Float(1.0, **_MULT)):
    """(model1 - model2) · multiplier."""
    return (merge_model(model1, model2, SUBTRACT, multiplier),)


@node(category=_CATEGORY, outputs=("MODEL",))
def ModelMergeAdd(model1=Socket("MODEL"), model2=Socket("MODEL")):
    """model1 + model2."""
    return (merge_model(model1, model2, ADD),)


@node(category=_CATEGORY, outputs=("CLIP",))
def CLIPMergeSimple(clip1=Socket("CLIP"), clip2=Socket("CLIP"), ratio=Float(1.0, **_RATIO)):
    """clip1 · ratio + clip2 · (1 - ratio)."""
    return (merge_clip(clip1, clip2, SIMPLE, ratio),)


@node(category=_CATEGORY, outputs=("CLIP",))
def CLIPMergeSubtract(clip1=Socket("CLIP"), clip2=Socket("CLIP"), multiplier=Float(1.0, **_MULT)):
    """(clip1 - clip2) · multiplier."""
    return (merge_clip(clip1, clip2, SUBTRACT, multiplier),)


@node(category=_CATEGORY, outputs=("CLIP",))
def CLIPMergeAdd(clip1=Socket("CLIP"), clip2=Socket("CLIP")):
    """clip1 + clip2."""
    return (merge_clip(clip1, clip2, ADD),)


# --------------------------------------------------------------------------------------------
# block merges: one ratio input per UNet key prefix. The input names ("input_blocks.0.", ...)
# are not Python identifiers, so these specs are declared from a list rather than a signature.


def _block_merge(name: str, prefixes: tuple[str, ...], category: str, doc: str) -> None:
    def declared(model1=Socket("MODEL"), model2=Socket("MODEL")):
        raise AssertionError("replaced below")

    def run(model1, model2, **ratios):
        # ComfyUI: keys matching no prefix take the first ratio input's value
        return (merge_model(model1, model2, SIMPLE, prefixed=ratios, default=ratios[prefixes[0]]),)

    run.__qualname__ = run.__name__ = name
    spec = spec_from_function(declared, name=name, category=category, outputs=("MODEL",), description=doc)
    REGISTRY.add(replace_spec(spec, fn=run, inputs=spec.inputs + tuple((p, Float(1.0, **_RATIO)) for p in prefixes)))


def _sd_prefixes(n_in: int, n_out: int, dot: str) -> tuple[str, ...]:
    return ("time_embed.", "label_emb.", *(f"input_blocks.{i}{dot}" for i in range(n_in)),
            *(f"middle_block.{i}{dot}" for i in range(3)), *(f"output_blocks.{i}{dot}" for i in range(n_out)), "out.")


_BLOCK_DOC = ("Merges model2 into model1 with a ratio per UNet block (model1's share; the longest "
              "matching key prefix wins).")
_block_merge("ModelMergeBlocks", ("input", "middle", "out"), _CATEGORY, _BLOCK_DOC)
_block_merge("ModelMergeSD1", _sd_prefixes(12, 12, "."), _CATEGORY + "/model_specific", _BLOCK_DOC)
_block_merge("ModelMergeSD2", _sd_prefixes(12, 12, "."), _CATEGORY + "/model_specific", _BLOCK_DOC)
_block_merge("ModelMergeSDXL", _sd_prefixes(9, 9, ""), _CATEGORY + "/model_specific", _BLOCK_DOC)
