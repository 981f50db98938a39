"""Fan-out: one prompt's batch split over several Ray workers, the outputs gathered back in order
(issue 12; used by `ui.ray_pool.RayPromptQueue` for prompts whose extra_data asks for it with
`"mixgraph_fan_out": true`).

A prompt splits when the result cannot tell: it has one KSampler, whose latent comes from an
EmptyLatentImage with a batch of 2 or more, whose sampler draws no noise after the first step
(the initial noise of image k depends only on the seed and k: `LatentFromBatch` keeps each
image's batch index, and `noise.prepare_noise` honours it), and every node after the sampler works
image by image (decode, scale, save, preview), with every output node after the sampler. Part j
is the same prompt with a `LatentFromBatch` (images [start, start + n)) between the latent and
the sampler, and its SaveImage prefixes end in `_part{j+1}` (parts save at once into one folder;
the counters would collide). Anything else runs whole, with a warning that says why.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mixgraph.graph.prompt import Link, NodeCall, Workflow

__all__ = ["split_batch", "merge_ui", "merged_events", "DETERMINISTIC_SAMPLERS", "PER_IMAGE",
           "LATENT_NODE"]

#: Samplers whose only randomness is the initial noise (no per-step noise over the batch shape).
DETERMINISTIC_SAMPLERS = frozenset({
    "euler", "euler_cfg_pp", "heun", "heunpp2", "dpm_2", "lms", "dpmpp_2m", "dpmpp_2m_cfg_pp",
    "ddim", "ipndm", "ipndm_v", "deis", "uni_pc", "uni_pc_bh2", "res_multistep",
    "res_multistep_cfg_pp", "gradient_estimation", "gradient_estimation_cfg_pp"})
#: Node classes that treat each image of a batch on its own.
PER_IMAGE = frozenset({"VAEDecode", "VAEDecodeTiled", "SaveImage", "PreviewImage", "ImageScale",
                       "ImageScaleBy", "ImageInvert", "LatentUpscale", "LatentUpscaleBy"})
#: The id of the node each part adds in front of the sampler.
LATENT_NODE = "mixgraph.fan_out"


def _descendants(prompt: dict[str, NodeCall], root: str) -> set[str]:
    found, grew = {root}, True
    while grew:
        grew = False
        for nid, call in prompt.items():
            if nid not in found and any(isinstance(v, Link) and v.node_id in found
                                        for v in call.inputs.values()):
                found.add(nid)
                grew = True
    return found - {root}


def split_batch(wf: Workflow, outputs: list[str], parts: int
                ) -> tuple[list[tuple[Workflow, tuple[int, int]]], str]:
    """([(part workflow, (start, count))...], "") or ([], why it does not split)."""
    prompt = wf.prompt
    samplers = [nid for nid, c in prompt.items() if c.class_type.startswith("KSampler")
                or c.class_type.startswith("SamplerCustom")]
    if len(samplers) != 1 or prompt[samplers[0]].class_type != "KSampler":
        return [], "fan-out needs exactly one KSampler (not supported yet for other graphs)"
    sid = samplers[0]
    sampler = prompt[sid]
    if sampler.inputs.get("sampler_name") not in DETERMINISTIC_SAMPLERS:
        return [], (f"sampler {sampler.inputs.get('sampler_name')!r} draws noise at every step "
                    "over the whole batch, so a split batch would give other images")
    latent = sampler.inputs.get("latent_image")
    source = prompt.get(latent.node_id) if isinstance(latent, Link) else None
    if source is None or source.class_type != "EmptyLatentImage" \
            or not isinstance(source.inputs.get("batch_size"), int):
        return [], "fan-out needs the sampler's latent straight from an EmptyLatentImage"
    batch = source.inputs["batch_size"]
    after = _descendants(prompt, sid)
    odd = sorted({prompt[n].class_type for n in after} - PER_IMAGE)
    if odd:
        return [], f"nodes after the sampler that may mix the batch: {', '.join(odd)}"
    if not set(outputs) <= after:
        return [], "an output node does not depend on the sampler"
    parts = min(parts, batch)
    if parts < 2:
        return [], f"a batch of {batch} on {parts} free worker(s) is not worth splitting"
    out, start = [], 0
    for j in range(parts):
        count = batch // parts + (j < batch % parts)
        new = dict(prompt)
        new[LATENT_NODE] = NodeCall("LatentFromBatch", {"samples": latent, "batch_index": start,
                                                         "length": count})
        new[sid] = dataclasses.replace(sampler, inputs={**sampler.inputs,
                                                        "latent_image": Link(LATENT_NODE, 0)})
        for nid in after:
            call = prompt[nid]
            if call.class_type == "SaveImage":
                prefix = str(call.inputs.get("filename_prefix", "ComfyUI"))
                new[nid] = dataclasses.replace(call, inputs={
                    **call.inputs, "filename_prefix": f"{prefix}_part{j + 1}"})
        out.append((dataclasses.replace(wf, prompt=new), (start, count)))
        start += count
    return out, ""


def merge_ui(parts: list[dict[str, dict]]) -> dict[str, dict]:
    """The parts' UI outputs as one prompt's: per node and key, lists concatenated in part
    order; other values from the first part that has them."""
    merged: dict[str, dict] = {}
    for ui in parts:
        for nid, out in ui.items():
            into = merged.setdefault(nid, {})
            for key, value in out.items():
                if isinstance(value, list):
                    into[key] = [*into.get(key, []), *value]
                else:
                    into.setdefault(key, value)
    return merged


def merged_events(prompt_id: str, ui: dict[str, dict]) -> list[Any]:
    """One `executed` per output node, carrying every part's output."""
    from mixgraph.graph import events as ev
    return [ev.Executed(prompt_id, node=nid, output=out) for nid, out in ui.items()]
