"""comfy_extras/nodes_cond.py: CLIPTextEncodeControlnet, SaveConditioning, ConditioningLoader.

CLIPTextEncodeControlnet gives every cond a second text that only its ControlNets read
(``Cond.controlnet_cross_attn``; ``CondDenoiser`` passes it to the chain instead of the UNet's
context). The files are ComfyUI's (``weights/cond_file.py``): written to the output folder,
read from the embeddings folder.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from mixgraph.graph.env import writable_folder
from mixgraph.graph.node import Socket, String, node
from mixgraph.nodes.helpers import folders
from mixgraph.nodes.helpers.embeddings import embedding_lookup, embeddings_fingerprint
from mixgraph.nodes.helpers.imaging import next_counter
from mixgraph.nodes.helpers.model_files import CONDITIONING_FILE
from mixgraph.nodes.weights import cond_file
from mixgraph.nodes.helpers.precision import effective, encoder_policies


@node(category="model/conditioning", outputs=("CONDITIONING",), display_name="CLIP Text Encode (Controlnet)",
      fingerprint=embeddings_fingerprint)
def CLIPTextEncodeControlnet(ctx, clip=Socket("CLIP"), conditioning=Socket("CONDITIONING"),
                             text=String(multiline=True, dynamic_prompts=True)):
    """Adds a text that only the ControlNets of these conds read (their cross-attention); the
    UNet keeps the conds' own text."""
    if clip is None:
        raise ValueError("clip input is None: the checkpoint loaded has no text encoder")
    (encoded,) = clip.encode(text, effective(ctx, clip, "CLIP"), policies=encoder_policies(ctx, clip),
                             embedding_lookup=embedding_lookup(ctx.env, warn=ctx.warn))
    return (tuple(dataclasses.replace(c, controlnet_cross_attn=encoded.cross_attn,
                                      controlnet_pooled=encoded.pooled) for c in conditioning),)


@node(category="model/conditioning", outputs=("CONDITIONING",), output_names=("conditioning",),
      output_node=True, display_name="Save Conditioning")
def SaveConditioning(ctx, conditioning=Socket("CONDITIONING"),
                     filename_prefix=String("conditioning/ComfyUI")):
    """Writes ``<prefix>_<counter:05>_.safetensors`` under the output folder (move it to
    models/embeddings to load it with Load Conditioning, e.g. to skip the text encoder)."""
    root = Path(ctx.env.output)
    target = folders.safe_join(root, filename_prefix)
    folder, stem = target.parent, target.name
    writable_folder(folder, "output folder")
    cond_file.save_conditioning(folder / f"{stem}_{next_counter(folder, stem):05}_.safetensors", conditioning)
    return (conditioning,)


@node(category="model/loaders", outputs=("CONDITIONING",), display_name="Load Conditioning")
def ConditioningLoader(ctx, conditioning_name=CONDITIONING_FILE.input()):
    """A conditioning saved with Save Conditioning (or any safetensors file with a
    'conditioning' tensor) from the embeddings folder."""
    conds, ignored = cond_file.load_conditioning(CONDITIONING_FILE.path(ctx.env, conditioning_name))
    if ignored:
        ctx.warn(f"{conditioning_name}: options {', '.join(ignored)} are not used by SD-family models; ignored")
    return (conds,)
