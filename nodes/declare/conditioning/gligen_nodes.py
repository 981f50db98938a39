"""GLIGENLoader and GLIGENTextBoxApply (ComfyUI ``nodes.py``): grounding boxes for SD1.x
GLIGEN models (``adapters/gligen.py``); the boxes ride on ``Cond.gligen`` to the sampler, which
patches the fusers into the UNet per evaluation."""

from __future__ import annotations

from mixgraph.graph.node import MAX_RESOLUTION, Int, Socket, String, node
from mixgraph.nodes.helpers.embeddings import embedding_lookup
from mixgraph.nodes.helpers.model_files import GLIGEN
from mixgraph.nodes.adapters.gligen import add_box, load_gligen
from mixgraph.nodes.helpers.precision import effective, encoder_policies


@node(category="loaders", outputs=("GLIGEN",), display_name="GLIGENLoader")
def GLIGENLoader(ctx, gligen_name=GLIGEN.input()):
    """Loads a GLIGEN grounding model from models/gligen."""
    return (load_gligen(GLIGEN.path(ctx.env, gligen_name)),)


@node(category="conditioning/gligen", outputs=("CONDITIONING",), display_name="GLIGENTextBoxApply")
def GLIGENTextBoxApply(ctx, conditioning_to=Socket("CONDITIONING"), clip=Socket("CLIP"),
                       gligen_textbox_model=Socket("GLIGEN"), text=String(multiline=True, dynamic_prompts=True),
                       width=Int(64, min=8, max=MAX_RESOLUTION, step=8),
                       height=Int(64, min=8, max=MAX_RESOLUTION, step=8),
                       x=Int(0, min=0, max=MAX_RESOLUTION, step=8), y=Int(0, min=0, max=MAX_RESOLUTION, step=8)):
    """Grounds `text` in the box (x, y, width, height) in pixels (÷ 8 to latent pixels)."""
    (encoded,) = clip.encode(text, effective(ctx, clip, "CLIP"), policies=encoder_policies(ctx, clip),
                             embedding_lookup=embedding_lookup(ctx.env, warn=ctx.warn))
    return (add_box(conditioning_to, gligen_textbox_model, encoded.pooled, width, height, x, y),)
