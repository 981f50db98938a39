"""Edge payloads: the typed values that travel between nodes (DESIGN §4, ARCHITECTURE.md).

``latent.Latent`` (LATENT) and ``conditioning.Cond`` (CONDITIONING, with ``SizeCond``,
``Control`` and ``ControlLike``). Plain dataclasses with no import of ``graph/``: the model
runtime (``nodes.models``, ``nodes.sampling``) and the node declarations both import them.
"""
