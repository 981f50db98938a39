"""ComfyUI ``comfy_extras/nodes_model_advanced.py`` (691e827): `ModelAttentionBackend`.

ComfyUI's options and what mixgraph does with each (``models/attention.py``):

* "pytorch attention": ComfyUI's ``F.scaled_dot_product_attention`` path, which is mixgraph's
  attention; the node returns a new MODEL handle pinned to it (the input handle is unchanged).
* "comfy kitchen attention": Comfy Kitchen's quantized INT8 attention (ComfyUI offers it only
  where that package runs, on NVIDIA/AMD GPUs). mixgraph has no INT8 attention, and ComfyUI's own
  fallback (warn, run PyTorch attention) would compute something other than what was asked, so
  a prompt choosing it is refused at validation.
"""

from __future__ import annotations

from mixgraph.graph.node import Combo, Socket, node, replace_spec
from mixgraph.graph.registry import REGISTRY
from mixgraph.graph.spec import Output

# ComfyUI option -> mixgraph backend name (models/attention.py BACKENDS); None: not available
OPTIONS = {"pytorch attention": "pytorch", "comfy kitchen attention": None}
_REFUSED = {"comfy kitchen attention": "Comfy Kitchen's quantized INT8 attention"}


def _check(env, attention=None) -> list[tuple[str, str]]:
    if attention is None or OPTIONS.get(attention) is not None:
        return []   # linked or available (an unknown literal is the option check's to report)
    what = _REFUSED.get(attention, attention)
    return [("attention", f"backend {attention!r} ({what}) is not supported yet: mixgraph has no such "
                          f"attention kernel; use 'pytorch attention'")]


@node(category="model/patch", outputs=(Output("MODEL", "model"),), display_name="Model Attention Backend",
      validate=_check, register=False)
def ModelAttentionBackend(model=Socket("MODEL", tooltip="The model to patch."),
                          attention=Combo(tuple(OPTIONS), "pytorch attention", display_name="backend",
                                          tooltip="The dense attention backend.")):
    """Selects the dense attention implementation for the model."""
    name = OPTIONS.get(attention)
    if name is None:   # validation refuses it first; a direct call says the same
        raise NotImplementedError(_check(None, attention)[0][1])
    return (model.with_attention_backend(name),)


ModelAttentionBackend.spec = REGISTRY.add(replace_spec(ModelAttentionBackend.spec,  # type: ignore[attr-defined]
                                                       info_extra=(("experimental", True),)))
