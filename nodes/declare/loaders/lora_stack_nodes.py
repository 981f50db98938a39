"""ComfyUI ``comfy_extras/nodes_lora_stack.py`` (Comfy-Org/ComfyUI 0e5d418): `LoadLoraModel`,
`LoadLoraTextEncoder`. A stack of LoRAs in one DynamicGroup input `loras` (rows of `lora_name`
and `strength`, 1 to 20; API keys `loras.<row>.lora_name` / `loras.<row>.strength`;
`graph.dynamic.dynamic_group`). Each row with a name and a non-zero strength is applied in turn
through LoraLoader's code path (`adapters.lora.load_lora_patches`), to the model only (CLIP strength
0) or to the text encoder only (model strength 0); other rows are skipped, as in ComfyUI.
In a UI-format workflow the editor saves `[row count, name 0, strength 0, name 1, ...]`
(ComfyUI_frontend `dynamicGroupWidget.ts` 2bdf0e5); `graph.formats.ui_graph` reads it."""

from __future__ import annotations

from typing import Any

from mixgraph.graph.dynamic import dynamic_group
from mixgraph.graph.node import Float, Socket, node
from mixgraph.nodes.helpers.model_files import LORA
from mixgraph.nodes.adapters.lora import load_lora_patches


def _rows_input(tooltip: str):
    return dynamic_group(
        (("lora_name", LORA.input(tooltip="The name of the LoRA file to apply.")),
         ("strength", Float(1.0, min=-100.0, max=100.0, step=0.01,
                            tooltip="How strongly to apply this LoRA. 0 = off, negative inverts "
                                    "the effect."))),
        min=1, max=20, group_name="LoRA", tooltip=tooltip)


def _names(literals: dict[str, Any]) -> list[str]:
    rows = literals.get("loras")
    if isinstance(rows, list):
        return [r.get("lora_name") for r in rows if isinstance(r, dict)]
    keys = sorted((k for k in literals if k.startswith("loras.") and k.endswith(".lora_name")),
                  key=lambda k: int(k.split(".")[1]) if k.split(".")[1].isdecimal() else -1)
    return [literals[k] for k in keys]


def _fingerprint(env: Any, **literals: Any):
    """Each row's LoRA file (rows are grown inputs: their hooks are not the node's own)."""
    return tuple(LORA.fingerprint(env, name) if name else None for name in _names(literals))


def _apply(ctx, model, clip, loras: list[dict], to_model: bool):
    for row in loras:
        name, strength = row.get("lora_name"), row.get("strength")
        if not name or strength == 0 or strength is None:
            continue
        path = LORA.path(ctx.env, name)
        model, clip = load_lora_patches(path, model, clip, strength if to_model else 0.0,
                                        0.0 if to_model else strength, warn=ctx.warn)
    return model, clip


@node(category="model/loaders", outputs=("MODEL",), display_name="Load LoRA (Model)",
      description="Apply a stack of LoRAs to a diffusion model. Add one row per LoRA; each row "
                  "picks a LoRA file and its strength.", fingerprint=_fingerprint)
def LoadLoraModel(ctx, model=Socket("MODEL", tooltip="The diffusion model the LoRAs will be applied to."),
                  loras=_rows_input("Each row applies one LoRA to the model.")):
    return (_apply(ctx, model, None, loras, True)[0],)


@node(category="model/loaders", outputs=("CLIP",), display_name="Load LoRA (Text Encoder)",
      description="Apply a stack of LoRAs to a CLIP text encoder. Add one row per LoRA; each row "
                  "picks a LoRA file and its strength.", fingerprint=_fingerprint)
def LoadLoraTextEncoder(ctx, clip=Socket("CLIP", tooltip="The CLIP text encoder the LoRAs will be "
                                                          "applied to."),
                        loras=_rows_input("Each row applies one LoRA to the text encoder.")):
    return (_apply(ctx, None, clip, loras, False)[1],)
