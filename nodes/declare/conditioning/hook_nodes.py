"""ComfyUI's scheduled weight hooks (``comfy_extras/nodes_hooks.py``): create LoRA / model-as-LoRA
hooks, schedule them with keyframes, and attach them to conds and to a CLIP.

Class names, inputs (names, defaults, ranges, options, optional ones) and output order are
ComfyUI's. The work is in ``nodes/helpers/hook_ops.py`` (payloads ``nodes/payloads/hooks.py``); conds
carrying hooks are evaluated with the hook weights by the sampler (``sampling/hooks.py``).
"""

from __future__ import annotations

import logging

from mixgraph.graph.node import Boolean, Combo, Float, Int, Socket, node, replace_spec, spec_from_function
from mixgraph.graph.registry import REGISTRY
from mixgraph.graph.spec import Input
from mixgraph.nodes.helpers import hook_ops
from mixgraph.nodes.helpers.model_files import CHECKPOINT, LORA
from mixgraph.nodes.models import loader
from mixgraph.nodes.payloads.hooks import HookGroup

logger = logging.getLogger(__name__)

_STRENGTH = dict(min=-20.0, max=20.0, step=0.01)
_PERCENT = dict(min=0.0, max=1.0, step=0.001)
_COND_STRENGTH = dict(min=0.0, max=10.0, step=0.01)
_AREA = ("default", "mask bounds")
_EXPERIMENTAL = (("experimental", True),)  # ComfyUI marks every hook node EXPERIMENTAL


def _hook_node(**kw):
    """``@node`` for these declarations, registered with ComfyUI's ``experimental`` flag."""
    def wrap(fn):
        fn = node(register=False, **kw)(fn)
        fn.spec = REGISTRY.add(replace_spec(fn.spec, info_extra=_EXPERIMENTAL))
        return fn

    return wrap


# ------------------------------------------------------------------------------- create


@_hook_node(category="advanced/hooks/create", outputs=("HOOKS",), display_name="Create Hook LoRA")
def CreateHookLora(ctx, lora_name=LORA.input(), strength_model=Float(1.0, **_STRENGTH),
                   strength_clip=Float(1.0, **_STRENGTH), prev_hooks=Socket("HOOKS", optional=True)):
    """A LoRA applied only where its hooks go (conds, a CLIP), not merged into the model."""
    if strength_model == 0 and strength_clip == 0:
        return (prev_hooks if prev_hooks is not None else HookGroup(),)
    path = LORA.path(ctx.env, lora_name)
    return (hook_ops.lora_hook(path, strength_model, strength_clip, prev_hooks),)


@_hook_node(category="advanced/hooks/create", outputs=("HOOKS",), display_name="Create Hook LoRA (MO)")
def CreateHookLoraModelOnly(ctx, lora_name=LORA.input(),
                            strength_model=Float(1.0, **_STRENGTH), prev_hooks=Socket("HOOKS", optional=True)):
    if strength_model == 0:
        return (prev_hooks if prev_hooks is not None else HookGroup(),)
    path = LORA.path(ctx.env, lora_name)
    return (hook_ops.lora_hook(path, strength_model, 0.0, prev_hooks),)


@_hook_node(category="advanced/hooks/create", outputs=("HOOKS",), display_name="Create Hook Model as LoRA")
def CreateHookModelAsLora(ctx, ckpt_name=CHECKPOINT.input(),
                          strength_model=Float(1.0, **_STRENGTH), strength_clip=Float(1.0, **_STRENGTH),
                          prev_hooks=Socket("HOOKS", optional=True)):
    """Another checkpoint's weights as a hook: W + s·(W_other − W)."""
    model, clip, _ = loader.load_checkpoint(CHECKPOINT.path(ctx.env, ckpt_name))
    return (hook_ops.model_as_lora_hook(model, clip, ckpt_name, strength_model, strength_clip, prev_hooks),)


@_hook_node(category="advanced/hooks/create", outputs=("HOOKS",), display_name="Create Hook Model as LoRA (MO)")
def CreateHookModelAsLoraModelOnly(ctx, ckpt_name=CHECKPOINT.input(),
                                   strength_model=Float(1.0, **_STRENGTH),
                                   prev_hooks=Socket("HOOKS", optional=True)):
    model, _, _ = loader.load_checkpoint(CHECKPOINT.path(ctx.env, ckpt_name))
    return (hook_ops.model_as_lora_hook(model, None, ckpt_name, strength_model, 0.0, prev_hooks),)


# --------------------------------------------------------------------------- scheduling


@_hook_node(category="advanced/hooks/scheduling", outputs=("HOOKS",), display_name="Set Hook Keyframes")
def SetHookKeyframes(hooks=Socket("HOOKS"), hook_kf=Socket("HOOK_KEYFRAMES", optional=True)):
    return (hooks.with_keyframes(hook_kf) if hook_kf is not None else hooks,)


@_hook_node(category="advanced/hooks/scheduling", outputs=(("HOOK_KEYFRAMES", "HOOK_KF"),),
      display_name="Create Hook Keyframe")
def CreateHookKeyframe(strength_mult=Float(1.0, **_STRENGTH), start_percent=Float(0.0, **_PERCENT),
                       prev_hook_kf=Socket("HOOK_KEYFRAMES", optional=True)):
    return (hook_ops.keyframe(prev_hook_kf, strength_mult, start_percent),)


@_hook_node(category="advanced/hooks/scheduling", outputs=(("HOOK_KEYFRAMES", "HOOK_KF"),),
      display_name="Create Hook Keyframes Interp.")
def CreateHookKeyframesInterpolated(strength_start=Float(1.0, min=0.0, max=10.0, step=0.001),
                                    strength_end=Float(1.0, min=0.0, max=10.0, step=0.001),
                                    interpolation=Combo(list(hook_ops.INTERPOLATIONS)),
                                    start_percent=Float(0.0, **_PERCENT), end_percent=Float(1.0, **_PERCENT),
                                    keyframes_count=Int(5, min=2, max=100, step=1),
                                    print_keyframes=Boolean(False),
                                    prev_hook_kf=Socket("HOOK_KEYFRAMES", optional=True)):
    return (hook_ops.interpolated_keyframes(prev_hook_kf, strength_start, strength_end, interpolation,
                                            start_percent, end_percent, keyframes_count, print_keyframes,
                                            logger.info),)


@_hook_node(category="advanced/hooks/scheduling", outputs=(("HOOK_KEYFRAMES", "HOOK_KF"),),
      display_name="Create Hook Keyframes From Floats")
def CreateHookKeyframesFromFloats(floats_strength=Input("FLOATS", -1, min=-1, step=0.001, force_input=True),
                                  start_percent=Float(0.0, **_PERCENT), end_percent=Float(1.0, **_PERCENT),
                                  print_keyframes=Boolean(False),
                                  prev_hook_kf=Socket("HOOK_KEYFRAMES", optional=True)):
    return (hook_ops.keyframes_from_floats(prev_hook_kf, floats_strength, start_percent, end_percent,
                                           print_keyframes, logger.info),)


# ------------------------------------------------------------------------------ combine


def _combine(name: str, letters: str) -> None:
    def run(**hooks):
        return (HookGroup.combine_all([hooks.get(f"hooks_{c}") for c in letters]),)

    def declared(**_):  # the signature is built from `letters` below
        return None

    spec = spec_from_function(declared, name=name, category="advanced/hooks/combine", outputs=("HOOKS",),
                              display_name=f"Combine Hooks [{len(letters)}]")
    inputs = tuple((f"hooks_{c}", Socket("HOOKS", optional=True)) for c in letters)
    REGISTRY.add(replace_spec(spec, inputs=inputs, fn=run, info_extra=_EXPERIMENTAL))


_combine("CombineHooks2", "AB")
_combine("CombineHooks4", "ABCD")
_combine("CombineHooks8", "ABCDEFGH")


# ------------------------------------------------------------------------------- attach


@_hook_node(category="advanced/hooks/cond single", outputs=("CONDITIONING",), display_name="Cond Set Props")
def ConditioningSetProperties(cond_NEW=Socket("CONDITIONING"), strength=Float(1.0, **_COND_STRENGTH),
                              set_cond_area=Combo(list(_AREA)), mask=Socket("MASK", optional=True),
                              hooks=Socket("HOOKS", optional=True),
                              timesteps=Socket("TIMESTEPS_RANGE", optional=True)):
    return (hook_ops.set_props(cond_NEW, strength, set_cond_area, mask, hooks, timesteps),)


@_hook_node(category="advanced/hooks/cond single", outputs=("CONDITIONING",), display_name="Cond Set Props Combine")
def ConditioningSetPropertiesAndCombine(cond=Socket("CONDITIONING"), cond_NEW=Socket("CONDITIONING"),
                                        strength=Float(1.0, **_COND_STRENGTH), set_cond_area=Combo(list(_AREA)),
                                        mask=Socket("MASK", optional=True), hooks=Socket("HOOKS", optional=True),
                                        timesteps=Socket("TIMESTEPS_RANGE", optional=True)):
    return (hook_ops.set_props_and_combine(cond, cond_NEW, strength, set_cond_area, mask, hooks, timesteps),)


@_hook_node(category="advanced/hooks/cond pair", outputs=("CONDITIONING", "CONDITIONING"),
      output_names=("positive", "negative"), display_name="Cond Pair Set Props")
def PairConditioningSetProperties(positive_NEW=Socket("CONDITIONING"), negative_NEW=Socket("CONDITIONING"),
                                  strength=Float(1.0, **_COND_STRENGTH), set_cond_area=Combo(list(_AREA)),
                                  mask=Socket("MASK", optional=True), hooks=Socket("HOOKS", optional=True),
                                  timesteps=Socket("TIMESTEPS_RANGE", optional=True)):
    return tuple(hook_ops.set_props(c, strength, set_cond_area, mask, hooks, timesteps)
                 for c in (positive_NEW, negative_NEW))


@_hook_node(category="advanced/hooks/cond pair", outputs=("CONDITIONING", "CONDITIONING"),
      output_names=("positive", "negative"), display_name="Cond Pair Set Props Combine")
def PairConditioningSetPropertiesAndCombine(positive=Socket("CONDITIONING"), negative=Socket("CONDITIONING"),
                                            positive_NEW=Socket("CONDITIONING"),
                                            negative_NEW=Socket("CONDITIONING"),
                                            strength=Float(1.0, **_COND_STRENGTH),
                                            set_cond_area=Combo(list(_AREA)), mask=Socket("MASK", optional=True),
                                            hooks=Socket("HOOKS", optional=True),
                                            timesteps=Socket("TIMESTEPS_RANGE", optional=True)):
    return tuple(hook_ops.set_props_and_combine(c, n, strength, set_cond_area, mask, hooks, timesteps)
                 for c, n in ((positive, positive_NEW), (negative, negative_NEW)))


@_hook_node(category="advanced/hooks/cond pair", outputs=("CONDITIONING", "CONDITIONING"),
      output_names=("positive", "negative"), display_name="Cond Pair Combine")
def PairConditioningCombine(positive_A=Socket("CONDITIONING"), negative_A=Socket("CONDITIONING"),
                            positive_B=Socket("CONDITIONING"), negative_B=Socket("CONDITIONING")):
    return (hook_ops.set_props_and_combine(positive_A, positive_B),
            hook_ops.set_props_and_combine(negative_A, negative_B))


@_hook_node(category="advanced/hooks/cond pair", outputs=("CONDITIONING", "CONDITIONING"),
      output_names=("positive", "negative"), display_name="Cond Pair Set Default Combine")
def PairConditioningSetDefaultCombine(positive=Socket("CONDITIONING"), negative=Socket("CONDITIONING"),
                                      positive_DEFAULT=Socket("CONDITIONING"),
                                      negative_DEFAULT=Socket("CONDITIONING"),
                                      hooks=Socket("HOOKS", optional=True)):
    return (hook_ops.set_default_and_combine(positive, positive_DEFAULT, hooks),
            hook_ops.set_default_and_combine(negative, negative_DEFAULT, hooks))


@_hook_node(category="advanced/hooks/cond single", outputs=("CONDITIONING",), display_name="Cond Set Default Combine")
def ConditioningSetDefaultCombine(cond=Socket("CONDITIONING"), cond_DEFAULT=Socket("CONDITIONING"),
                                  hooks=Socket("HOOKS", optional=True)):
    return (hook_ops.set_default_and_combine(cond, cond_DEFAULT, hooks),)


@_hook_node(category="advanced/hooks/clip", outputs=("CLIP",), display_name="Set CLIP Hooks")
def SetClipHooks(clip=Socket("CLIP"), apply_to_conds=Boolean(True), schedule_clip=Boolean(False),
                 hooks=Socket("HOOKS", optional=True)):
    """Text encoded with this CLIP uses the hooks' CLIP weights; with apply_to_conds its conds
    carry the hooks to the sampler; with schedule_clip it is encoded once per keyframe range."""
    if hooks is None:
        return (clip,)
    return (clip.with_hooks(hooks, apply_to_conds, schedule_clip),)


@_hook_node(category="advanced/hooks", outputs=("TIMESTEPS_RANGE", "TIMESTEPS_RANGE", "TIMESTEPS_RANGE"),
      output_names=("TIMESTEPS_RANGE", "BEFORE_RANGE", "AFTER_RANGE"), display_name="Timesteps Range")
def ConditioningTimestepsRange(start_percent=Float(0.0, **_PERCENT), end_percent=Float(1.0, **_PERCENT)):
    return ((start_percent, end_percent), (0.0, start_percent), (end_percent, 1.0))


@_hook_node(category="advanced/hooks/manual", outputs=("CONDITIONING",))
def SetModelHooksOnCond(conditioning=Socket("CONDITIONING"), hooks=Socket("HOOKS")):
    return (hook_ops.set_hooks(conditioning, hooks),)
