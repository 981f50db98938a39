"""Fan-out: one prompt's batch split over several Ray workers, the outputs gathered back in order
(used by `ui.ray.ray_pool.RayPromptQueue` for prompts whose extra_data asks for it with
`"mixgraph_fan_out": true`).

A prompt splits when the result cannot tell: it has one KSampler, whose latent comes from an
EmptyLatentImage with a batch of 2 or more, whose sampler draws no noise after the first step
(the initial noise of image k depends only on the seed and k: `LatentFromBatch` keeps each
image's batch index, and `noise.prepare_noise` honours it), and every node after the sampler works
image by image (decode, scale, save, preview), with every output node after the sampler. Part j
is the same prompt with a `LatentFromBatch` (images [start, start + n)) between the latent and
the sampler, and its SaveImage prefixes end in `_part{j+1}` (parts save at once into one folder;
the counters would collide). Anything else runs whole, with a warning that says why.

A prompt that makes a list (ComfyUI's OUTPUT_IS_LIST: several seeds into a KSampler, several
prompt strings into a CLIPTextEncode) is split by its items instead (`ListSplit`), never by a
batch: the engine calls every node below the list once per item, so item i's images depend on
item i alone. Part j of P is the same prompt with a `FanOutListPart` node after the list's
output, which keeps items [start, start + count) of the list as the engine made it (the chunk
sizes of `split_batch`, found from the list's length on the worker); the parts' UI outputs merge
per node as the engine merges the calls of one node (`graph.lists.merge_ui`), in item order, and
SaveImage's files, written under a per-part marker, are renamed in that order to the names and
counters one machine would have given them (`<prefix>_<counter:05>_.png`, each counter found as
SaveImage finds it), their `prompt` text chunk set to the prompt as submitted. It does not split
(and runs whole, saying why) when a node below the list takes the whole list (INPUT_IS_LIST) or
makes lists of its own, when there are several lists, when an output node does not depend on
the list or is not one whose results merge faithfully (`LIST_OUTPUTS`), or when a node that is
not an output is non-deterministic (each worker would compute its own value).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import zlib
from pathlib import Path
from typing import Any

from mixgraph.graph import lists
from mixgraph.graph.node import Int, Result, Socket, node
from mixgraph.graph.prompt import Link, NodeCall, Workflow
from mixgraph.graph.spec import Output
from mixgraph.graph.formats.workflow import dump_api

__all__ = ["split_batch", "merge_ui", "merged_events", "DETERMINISTIC_SAMPLERS", "PER_IMAGE",
           "LATENT_NODE", "plan", "BatchSplit", "ListSplit", "FanOutListPart", "add_nodes",
           "LIST_NODE", "LIST_OUTPUTS", "PART_UI"]

#: Samplers whose only randomness is the initial noise (no per-step noise over the batch shape).
DETERMINISTIC_SAMPLERS = frozenset({
    "euler", "euler_cfg_pp", "heun", "heunpp2", "dpm_2", "lms", "dpmpp_2m", "dpmpp_2m_cfg_pp",
    "ddim", "ipndm", "ipndm_v", "deis", "cfgpp_ud10_ab", "uni_pc", "uni_pc_bh2", "res_multistep",
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


# --- the one entry point -----------------------------------------------------------------------

def plan(wf: Workflow, outputs: list[str], parts: int, registry: Any, prompt_id: str
         ) -> tuple[BatchSplit | ListSplit | None, str]:
    """How to split the prompt over `parts` workers: (split, "") or (None, why it runs whole).
    A prompt that makes a list splits by its items or not at all (a batch split of a list
    prompt would reorder the images)."""
    listed, why = split_list(wf, outputs, parts, registry, prompt_id)
    if listed is not None or why:
        return listed, why
    done, why = split_batch(wf, outputs, parts)
    return (BatchSplit(done) if done else None), why


@dataclasses.dataclass
class BatchSplit:
    """A batch split (`split_batch`) behind the interface `ui.ray.ray_pool` drives."""

    done: list[tuple[Workflow, tuple[int, int]]]
    kind = "batch"

    @property
    def count(self) -> int:
        return len(self.done)

    def part(self, j: int, attempt: int = 0) -> Workflow:
        return self.done[j][0]

    def discard(self, j: int, attempt: int, env: Any) -> None:
        """Nothing: a batch part's files carry no attempt, so what a dead attempt saved stays
        (its retry saves after it, under the same `_part{j+1}` prefix)."""

    def hidden(self, node_id: str | None) -> bool:
        return node_id == LATENT_NODE

    def describe(self, j: int) -> str:
        a, n = self.done[j][1]
        return f"images {[a, a + n]}"

    def gather(self, uis: list[dict | None], env: Any, workers: list[str]
               ) -> tuple[dict, list[dict], str]:
        notes = [{"worker": w, "images": [a, a + n]} for w, (_, (a, n)) in zip(workers, self.done)]
        return merge_ui([ui for ui in uis if ui is not None]), notes, ""


# --- lists -------------------------------------------------------------------------------------

#: The id of the node each part of a list prompt adds after the list.
LIST_NODE = "mixgraph.fan_out.list"
#: The UI key under which `FanOutListPart` reports the items it kept.
PART_UI = "mixgraph_list_part"
#: Output nodes whose per-item results merge back exactly (SaveImage's files are renamed).
LIST_OUTPUTS = frozenset({"SaveImage", "PreviewImage", "PreviewAny"})


def _chunk(n: int, part: int, parts: int) -> tuple[int, int]:
    """(start, count) of part `part` of `parts` contiguous chunks of n items, the first n % parts
    one longer."""
    return part * (n // parts) + min(part, n % parts), n // parts + (part < n % parts)


def _digest(items: list) -> str | None:
    """A digest of a list of plain values (None for other values), so the front can check that
    every worker made the same list."""
    if not all(isinstance(x, (str, int, float, bool)) or x is None for x in items):
        return None
    return hashlib.blake2b(json.dumps(items).encode(), digest_size=16).hexdigest()


@node(category="_internal", outputs=[Output("*", "items", is_list=True)], input_is_list=True,
      register=False)
def FanOutListPart(values=Socket("*"), part=Int(0, min=0, max=4096),
                   parts=Int(1, min=1, max=4096)):
    """Part `part` of `parts` of a list (fan-out over Ray workers): its items [start, start +
    count), in order; reports (start, count, total, digest) as UI for the front server."""
    j, p = part[0], parts[0]
    start, count = _chunk(len(values), j, p)
    info = {"start": start, "count": count, "total": len(values), "digest": _digest(values)}
    return Result((list(values[start:start + count]),), ui={PART_UI: [info]})


def add_nodes(registry: Any) -> None:
    """Register the node list parts need (a worker's registry; idempotent)."""
    if "FanOutListPart" not in registry:
        registry.add(FanOutListPart.spec)


def _ancestors(prompt: dict[str, NodeCall], roots: list[str]) -> set[str]:
    found, todo = set(), [r for r in roots if r in prompt]
    while todo:
        nid = todo.pop()
        if nid in found:
            continue
        found.add(nid)
        todo.extend(v.node_id for v in prompt[nid].inputs.values()
                    if isinstance(v, Link) and v.node_id in prompt)
    return found


def split_list(wf: Workflow, outputs: list[str], parts: int, registry: Any, prompt_id: str
               ) -> tuple[ListSplit | None, str]:
    """(split, "") for a list prompt that splits, (None, why) for one that does not, (None, "")
    for a prompt that makes no list."""
    prompt = wf.prompt
    spec = {nid: registry.get(c.class_type) for nid, c in prompt.items()}
    if any(s is None for s in spec.values()):
        return None, ""                       # the worker's validation reports it
    outputs = list(outputs) or [n for n, s in spec.items() if s.output_node]
    runs = _ancestors(prompt, outputs)
    makers = sorted(n for n in runs if any(o.is_list for o in spec[n].outputs))
    if not makers:
        return None, ""
    name = {n: f"node {n} ({prompt[n].class_type})" for n in prompt}
    source = next((n for n in makers if not (_ancestors(prompt, [n]) - {n}) & set(makers)),
                  makers[0])
    below = _descendants(prompt, source) & runs
    for n in sorted(below):
        if spec[n].input_is_list:
            return None, f"{name[n]} takes the whole list at once (INPUT_IS_LIST)"
        if any(o.is_list for o in spec[n].outputs):
            return None, f"{name[n]} makes lists of its own"
    if len(makers) > 1:
        return None, f"several lists ({', '.join(name[n] for n in makers)})"
    slots = {v.slot for n in runs for v in prompt[n].inputs.values()
             if isinstance(v, Link) and v.node_id == source}
    outs = spec[source].outputs
    plain = sorted(s for s in slots if s >= len(outs) or not outs[s].is_list)
    if plain or len(slots) != 1:
        return None, (f"{name[source]} is used by output {plain[0]}, which is not its list"
                      if plain else f"several list outputs of {name[source]} are used")
    for n in sorted(runs):
        if not spec[n].deterministic and not spec[n].output_node:
            return None, (f"{name[n]} is not deterministic: each worker would compute its own "
                          "value")
    for n in outputs:
        if n not in below:
            return None, f"output {name[n]} does not depend on the list"
        if prompt[n].class_type not in LIST_OUTPUTS:
            return None, (f"output {name[n]} is not one whose results are known to merge "
                          f"faithfully ({', '.join(sorted(LIST_OUTPUTS))})")
    saves = tuple(n for n in outputs if prompt[n].class_type == "SaveImage")
    if any(isinstance(prompt[n].inputs.get("filename_prefix"), Link) for n in saves):
        return None, "a SaveImage's filename_prefix is linked"
    if parts < 2:
        return None, f"{parts} free worker(s): nothing to split over"
    return ListSplit(wf, source, slots.pop(), parts, frozenset(below), saves, prompt_id), ""


@dataclasses.dataclass
class ListSplit:
    """A list prompt split by items: `part(j)` is part j's prompt; `gather` merges the parts'
    UI outputs and renames their saved files (module docstring)."""

    workflow: Workflow
    source: str
    slot: int
    count: int
    below: frozenset
    saves: tuple[str, ...]
    prompt_id: str
    kind = "list"

    def marker(self, j: int, attempt: int = 0) -> str:
        """What part j's SaveImage prefixes end in: unique per prompt, part and attempt."""
        return f"-mgfan{re.sub('[^0-9A-Za-z]', '', self.prompt_id)[:12]}p{j}a{attempt}"

    def part(self, j: int, attempt: int = 0) -> Workflow:
        prompt = self.workflow.prompt
        at, to = Link(self.source, self.slot), Link(LIST_NODE, 0)
        new = {nid: (dataclasses.replace(c, inputs={k: to if v == at else v
                                                    for k, v in c.inputs.items()})
                     if at in c.inputs.values() else c) for nid, c in prompt.items()}
        new[LIST_NODE] = NodeCall("FanOutListPart", {"values": at, "part": j,
                                                     "parts": self.count})
        for nid in self.saves:
            call = new[nid]
            prefix = str(call.inputs.get("filename_prefix", "ComfyUI"))
            new[nid] = dataclasses.replace(call, inputs={
                **call.inputs, "filename_prefix": prefix + self.marker(j, attempt)})
        return dataclasses.replace(self.workflow, prompt=new)

    def hidden(self, node_id: str | None) -> bool:
        return node_id == LIST_NODE

    def describe(self, j: int) -> str:
        return f"part {j + 1} of {self.count} of the list of {self.source}"

    def _folders(self, env: Any) -> set[Path]:
        out = {Path(env.output)}
        for nid in self.saves:
            prefix = str(self.workflow.prompt[nid].inputs.get("filename_prefix", "ComfyUI"))
            out.add((Path(env.output) / prefix.replace("\\", "/")).parent)
        return out

    def discard(self, j: int, attempt: int, env: Any) -> None:
        """Delete what a dead attempt of part j saved (its retry saves everything again)."""
        mark = self.marker(j, attempt) + "_"
        for folder in self._folders(env):
            if folder.is_dir():
                for f in folder.iterdir():
                    if mark in f.name:
                        f.unlink(missing_ok=True)

    def gather(self, uis: list[dict | None], env: Any, workers: list[str]
               ) -> tuple[dict, list[dict], str]:
        """(merged UI outputs, the history's per-part notes, a problem or ""): each node below
        the list merged over the parts as the engine merges one node's calls, other nodes' UI
        from the first part that has it; SaveImage files renamed in item order."""
        notes, digests, per_node = [], set(), {}
        for j, ui in enumerate(uis):
            info = ((ui or {}).get(LIST_NODE) or {}).get(PART_UI) or [None]
            note = {"worker": workers[j]}
            if info[0] is not None:
                a, n, total = info[0]["start"], info[0]["count"], info[0]["total"]
                note.update(items=[a, a + n], of=total)
                digests.add((total, info[0]["digest"]))
            notes.append(note)
            for nid, out in (ui or {}).items():
                if nid != LIST_NODE and (nid in self.below or nid not in per_node):
                    per_node.setdefault(nid, []).append(out)
        merged = {nid: lists.merge_ui(outs) for nid, outs in per_node.items()}
        problem = ""
        if len(digests) > 1:
            problem = (f"the list of node {self.source} came out differently on the workers "
                       f"({len(digests)} versions); its images would not be one list's")
        api = json.dumps(dump_api(self.workflow))
        for nid in self.saves:
            if nid in merged and isinstance(merged[nid].get("images"), list):
                merged[nid] = {**merged[nid], "images": [
                    self._rename(im, env, api) for im in merged[nid]["images"]]}
        return merged, notes, problem

    _NAME = re.compile(r"^(.*)_(\d{5,})_\.png$")

    def _rename(self, image: dict, env: Any, api: str) -> dict:
        """One saved file under the name (and `prompt` chunk) one machine would have given it."""
        from mixgraph.nodes.helpers.imaging import next_counter
        m = self._NAME.match(str(image.get("filename", "")))
        mark = re.search(r"-mgfan[0-9A-Za-z]*p\d+a\d+$", m.group(1)) if m else None
        if mark is None or image.get("type") != "output" \
                or not mark.group().startswith(self.marker(0)[:-4]):
            return image
        folder = Path(env.output) / image.get("subfolder", "")
        stem = m.group(1)[:mark.start()]
        counter = next_counter(folder, stem)
        while (folder / f"{stem}_{counter:05}_.png").exists():
            counter += 1                       # another prompt's file appeared meanwhile
        name = f"{stem}_{counter:05}_.png"
        old = folder / image["filename"]
        _set_png_text(old, "prompt", api)
        os.rename(old, folder / name)
        return {**image, "filename": name}


def _set_png_text(path: Path, key: str, text: str) -> None:
    """Replace the tEXt chunk `key` of a PNG in place (other chunks byte for byte); nothing if
    the file has none. ComfyUI's chunks hold JSON, which is ASCII, so tEXt suffices."""
    data = path.read_bytes()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        return
    out, pos, found = [data[:8]], 8, False
    word = key.encode("latin-1") + b"\0"
    while pos + 12 <= len(data):
        size = int.from_bytes(data[pos:pos + 4], "big")
        end = pos + 12 + size
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + size]
        if kind == b"tEXt" and body.startswith(word):
            body = word + text.encode("latin-1")
            chunk = kind + body
            out.append(len(body).to_bytes(4, "big") + chunk
                       + zlib.crc32(chunk).to_bytes(4, "big"))
            found = True
        else:
            out.append(data[pos:end])
        pos = end
    if found:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(b"".join(out))
        os.replace(tmp, path)
