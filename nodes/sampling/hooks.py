"""Weight hooks during sampling: the keyframe schedule per run and the hooked UNet runners.

ComfyUI (``comfy/hooks.py`` ``HookKeyframeGroup.prepare_current_keyframe``, ``samplers.py``
``_calc_cond_batch``): every cond carrying hooks is evaluated by the model with those hooks'
weights at the strength of the keyframe active at the current sigma; conds are grouped by hook
set and conds without hooks use the plain model. Here a hook set resolves, at each sigma, to a
tuple of weight patches (``models/hooks.unet_patches``); conds batch together only when their
patch tuples are equal, and a patch tuple names one runner (the handle with those patches,
materialized through the weight store; the empty tuple is the plain model).
"""

from __future__ import annotations

from mixgraph.nodes.models.hooks import unet_patches
from mixgraph.nodes.payloads.hooks import HookKeyframes

__all__ = ["KeyframeState", "HookRuntime"]


class KeyframeState:
    """The active keyframe of one schedule during one sampling run.

    ``advance(sigma, max_sigma)`` is called for every evaluation of a hooked cond; the first call
    at a new sigma may move to a later keyframe: once the current keyframe has been used for its
    guaranteed steps, the following keyframes whose start sigma is ≥ the current sigma are
    walked in order, stopping at the first with guaranteed steps. A keyframe that starts before
    the sampled range (its start sigma above ``max_sigma``) guarantees no steps."""

    def __init__(self, keyframes: HookKeyframes, percent_to_sigma):
        self.keyframes = keyframes.keyframes
        self.start_sigmas = [float(percent_to_sigma(k.start_percent)) for k in self.keyframes]
        self.index = 0
        self.used_steps = 0
        self.last_sigma: float | None = None

    def _guaranteed(self, i: int, max_sigma: float) -> int:
        return 0 if self.start_sigmas[i] > max_sigma else self.keyframes[i].guarantee_steps

    def advance(self, sigma: float, max_sigma: float) -> float:
        """The strength multiplier at ``sigma`` (1.0 without keyframes)."""
        if not self.keyframes:
            return 1.0
        if sigma != self.last_sigma:
            if self.used_steps >= self._guaranteed(self.index, max_sigma):
                for i in range(self.index + 1, len(self.keyframes)):
                    if self.start_sigmas[i] < sigma:
                        break  # starts later in sampling than this step
                    self.index, self.used_steps = i, 0
                    if self._guaranteed(i, max_sigma) > 0:
                        break
            self.used_steps += 1
            self.last_sigma = sigma
        return float(self.keyframes[self.index].strength)


class HookRuntime:
    """Per sampling run (one per denoiser): keyframe states and hooked runners of ``model``
    (a ``SamplerModel`` with ``handle`` and ``policy``, i.e. ``ModelHandle.runner``)."""

    def __init__(self, model, percent_to_sigma):
        self.model = model
        self.percent_to_sigma = percent_to_sigma
        self.max_sigma: float | None = None
        self._states: dict[int, tuple[HookKeyframes, KeyframeState]] = {}
        self._runners: dict[tuple, object] = {}

    def _state(self, keyframes: HookKeyframes) -> KeyframeState:
        # one state per schedule object, as ComfyUI shares one keyframe group between the hooks
        # a SetHookKeyframes node scheduled (the tuple keeps the object alive for the id)
        hit = self._states.get(id(keyframes))
        if hit is None:
            hit = (keyframes, KeyframeState(keyframes, self.percent_to_sigma))
            self._states[id(keyframes)] = hit
        return hit[1]

    def patches_at(self, hooks, sigma: float) -> tuple:
        """The weight patches of the hook group ``hooks`` at ``sigma`` (() for None / empty /
        every strength 0)."""
        if not hooks:
            return ()
        handle = getattr(self.model, "handle", None)
        if handle is None or not hasattr(handle, "with_patches"):
            raise NotImplementedError("conds with hooks need a MODEL loaded by mixgraph's loaders: this "
                                      "model has no weight handle to apply hook LoRAs to (not supported yet)")
        if self.max_sigma is None:
            self.max_sigma = sigma  # the first evaluated sigma is the top of the sampled range
        out: list = []
        for hook in hooks.hooks:
            out.extend(unet_patches(hook, self._state(hook.keyframes).advance(sigma, self.max_sigma), handle))
        return tuple(out)

    def runner(self, patches: tuple):
        """The SamplerModel evaluating with ``patches`` added to the model's weights."""
        if not patches:
            return self.model
        hit = self._runners.get(patches)
        if hit is None:
            if len(self._runners) >= 4:  # keep few modules alive; the weight store caches the rest
                self._runners.clear()
            hit = self.model.handle.with_patches(patches).runner(self.model.policy)
            self._runners[patches] = hit
        return hit
