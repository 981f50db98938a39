"""A ComfyUI V1 custom node pack written against ComfyUI's host API only (tests of mixgraph's
custom node support). It must run unchanged in ComfyUI."""

import asyncio
import json
import os
import time

import torch
from aiohttp import web
from PIL import Image

import comfy.model_management
import comfy.utils
import folder_paths
import nodes  # ComfyUI's `nodes` module (ui/comfy/comfy_host/nodes.py), as packs import it
from comfy.comfy_types import IO, ComfyNodeABC, InputTypeDict
from comfy_execution.graph import ExecutionBlocker
from comfy_execution.graph_utils import GraphBuilder
from server import BinaryEventTypes, PromptServer

WEB_DIRECTORY = "./web"
CALLS = {"changed": 0, "lazy_b": 0}
SLEEPS = []      # (tag, "start" | "end", time.monotonic()) of MgSleep calls


@PromptServer.instance.routes.get("/mg_pack/hello")
async def hello(request):
    return web.json_response({"hello": "from mg_v1_pack", "max": nodes.MAX_RESOLUTION})


class MgAppendText(ComfyNodeABC):
    @classmethod
    def INPUT_TYPES(cls) -> InputTypeDict:
        return {"required": {"text": (IO.STRING, {"multiline": True, "default": "hi",
                                                  "tooltip": "the text"})},
                "optional": {"suffix": ("STRING", {"default": "!"})}}

    RETURN_TYPES = ("STRING",)
    RETURN_NAMES = ("joined",)
    OUTPUT_TOOLTIPS = ("text + suffix",)
    FUNCTION = "run"
    CATEGORY = "mg/text"
    DESCRIPTION = "Appends a suffix."

    def run(self, text, suffix="?"):
        return (text + suffix,)


class MgShowText:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"text": ("STRING", {"forceInput": True})},
                "hidden": {"unique_id": "UNIQUE_ID"}}

    RETURN_TYPES = ("STRING",)
    FUNCTION = "show"
    OUTPUT_NODE = True
    CATEGORY = "mg/text"

    def show(self, text, unique_id=None):
        PromptServer.instance.send_sync("mg.shown", {"node": unique_id, "text": text},
                                        PromptServer.instance.client_id)
        return {"ui": {"text": [text]}, "result": (text,)}


class MgSendMessages:
    """Sends what packs send over the WebSocket: JSON to the prompt's client and to everyone,
    a binary frame of its own, an unencoded preview image and progress text."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"text": ("STRING", {"default": "hello"})},
                "hidden": {"unique_id": "UNIQUE_ID"}}

    RETURN_TYPES = ("STRING",)
    FUNCTION = "send"
    OUTPUT_NODE = True
    CATEGORY = "mg/text"

    def send(self, text, unique_id=None):
        server = PromptServer.instance
        server.send_sync("mg.note", {"node": unique_id, "text": text}, server.client_id)
        server.send_sync("mg.everyone", {"text": text})
        server.send_sync(77, text.encode(), server.client_id)
        image = Image.new("RGB", (32, 16), (255, 0, 0))
        server.send_sync(BinaryEventTypes.UNENCODED_PREVIEW_IMAGE, ("PNG", image, 8),
                         server.client_id)
        server.send_progress_text(text, unique_id, server.client_id)
        return {"ui": {"text": [text]}, "result": (text,)}


class MgHidden:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"tag": ("STRING", {"default": "x"})},
                "hidden": {"unique_id": "UNIQUE_ID", "prompt": "PROMPT",
                           "extra_pnginfo": "EXTRA_PNGINFO"}}

    RETURN_TYPES = ("STRING",)
    FUNCTION = "run"
    CATEGORY = "mg"

    def run(self, tag, unique_id, prompt, extra_pnginfo):
        return (json.dumps({"unique_id": unique_id, "classes": sorted(
            n["class_type"] for n in prompt.values()), "pnginfo": extra_pnginfo}),)


class MgScaleLatent:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"samples": ("LATENT",),
                             "factor": ("FLOAT", {"default": 2.0, "min": 0.0, "max": 10.0,
                                                  "step": 0.5})}}

    RETURN_TYPES = ("LATENT",)
    FUNCTION = "scale"
    CATEGORY = "mg/latent"

    def scale(self, samples, factor):
        bar = comfy.utils.ProgressBar(3)
        for _ in range(3):
            comfy.model_management.throw_exception_if_processing_interrupted()
            bar.update(1)
        out = samples.copy()
        out["samples"] = samples["samples"] * factor
        return (out,)


class MgEmptyLatent:
    """Calls a core node as ComfyUI packs do."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"size": ("INT", {"default": 64, "min": 16,
                                              "max": nodes.MAX_RESOLUTION, "step": 8})}}

    RETURN_TYPES = ("LATENT",)
    FUNCTION = "make"
    CATEGORY = "mg/latent"

    def make(self, size):
        (latent,) = nodes.NODE_CLASS_MAPPINGS["EmptyLatentImage"]().generate(size, size, 1)
        assert isinstance(latent, dict) and latent["samples"].shape == (1, 4, size // 8, size // 8)
        latent = dict(latent, samples=latent["samples"] + 1.0)
        return (latent,)


class MgChanged:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"name": ("STRING", {"default": "a.txt"})}}

    RETURN_TYPES = ("STRING",)
    FUNCTION = "read"
    CATEGORY = "mg"

    @classmethod
    def IS_CHANGED(cls, name):
        path = os.path.join(folder_paths.get_input_directory(), name)
        return os.path.getmtime(path) if os.path.exists(path) else float("nan")

    def read(self, name):
        CALLS["changed"] += 1
        with open(os.path.join(folder_paths.get_input_directory(), name)) as f:
            return (f.read(),)


class MgValidate:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"mode": (["a", "b"],), "value": ("INT", {"default": 1, "min": 0,
                                                                      "max": 10}),
                             "other": ("INT", {"default": 1, "min": 0, "max": 10}),
                             "thing": ("*",)}}

    RETURN_TYPES = ("STRING",)
    FUNCTION = "run"
    CATEGORY = "mg"

    @classmethod
    def VALIDATE_INPUTS(cls, mode, value, input_types):
        if mode not in ("a", "b", "c"):
            return f"mode {mode} is not a, b or c"
        if value == 7:
            return "seven is not allowed"
        if input_types.get("thing") not in ("INT", "STRING"):
            return f"thing must be INT or STRING, not {input_types.get('thing')}"
        return True

    def run(self, mode, value, other, thing):
        return (f"{mode}:{value}:{other}:{thing}",)


class MgAnyCount:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"first": (IO.ANY, {})}, "optional": {"num": (IO.NUMBER,)}}

    RETURN_TYPES = ("INT",)
    FUNCTION = "count"
    CATEGORY = "mg"

    def count(self, first, num=None, **kwargs):
        return (1 + (num is not None) + len(kwargs),)


class MgAsync:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"value": ("INT", {"default": 3})}}

    RETURN_TYPES = ("INT",)
    FUNCTION = "run"
    CATEGORY = "mg"

    async def run(self, value):
        await asyncio.sleep(0)
        return (value * 10,)


class MgFolders:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"ckpt": (folder_paths.get_filename_list("checkpoints"),)}}

    RETURN_TYPES = ("STRING",)
    FUNCTION = "run"
    CATEGORY = "mg"

    def run(self, ckpt):
        return (json.dumps({"path": folder_paths.get_full_path("checkpoints", ckpt),
                            "out": folder_paths.get_output_directory(),
                            "save": folder_paths.get_save_image_path(
                                "mg/img", folder_paths.get_output_directory())[1:4]}),)


class MgNeedsInternals:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"model": ("MODEL",)}}

    RETURN_TYPES = ("MODEL",)
    FUNCTION = "patch"
    CATEGORY = "mg"

    def patch(self, model):
        m = model.clone()
        return (m,)


class MgLazyPick:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"use_a": ("BOOLEAN", {"default": True}),
                             "a": ("STRING", {"lazy": True, "forceInput": True}),
                             "b": ("STRING", {"lazy": True, "forceInput": True})}}

    RETURN_TYPES = ("STRING",)
    FUNCTION = "pick"
    CATEGORY = "mg/flow"

    def check_lazy_status(self, use_a, a=None, b=None):
        return ["a"] if use_a else ["b"]

    def pick(self, use_a, a=None, b=None):
        return (a if use_a else b,)


class MgCountB:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"text": ("STRING", {"default": "b"})}}

    RETURN_TYPES = ("STRING",)
    FUNCTION = "run"
    CATEGORY = "mg/flow"
    EXPERIMENTAL = True

    def run(self, text):
        CALLS["lazy_b"] += 1
        return (text,)


class MgJoinList:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"texts": ("STRING", {"forceInput": True}),
                             "sep": ("STRING", {"default": ","})}}

    INPUT_IS_LIST = True
    RETURN_TYPES = ("STRING",)
    FUNCTION = "join"
    CATEGORY = "mg/flow"

    def join(self, texts, sep):
        return (sep[0].join(texts),)


class MgSplit:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"text": ("STRING", {"default": "x y z"})}}

    RETURN_TYPES = ("STRING",)
    OUTPUT_IS_LIST = (True,)
    FUNCTION = "split"
    CATEGORY = "mg/flow"

    def split(self, text):
        return (text.split(),)


class MgExpandAppend:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"text": ("STRING", {"default": "e"}), "times": ("INT", {"default": 2})}}

    RETURN_TYPES = ("STRING",)
    FUNCTION = "expand"
    CATEGORY = "mg/flow"

    def expand(self, text, times):
        graph = GraphBuilder()
        current = text
        for _ in range(times):
            node = graph.node("MgAppendText", text=current, suffix="+")
            current = node.out(0)
        return {"result": (current,), "expand": graph.finalize()}


class MgBlockIf:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"text": ("STRING", {"forceInput": True}),
                             "block": ("BOOLEAN", {"default": False})},
                "optional": {"message": ("STRING", {"default": ""})}}

    RETURN_TYPES = ("STRING",)
    FUNCTION = "run"
    CATEGORY = "mg/flow"

    def run(self, text, block, message=""):
        return (ExecutionBlocker(message or None) if block else text,)


class MgLatentStats:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"samples": ("LATENT",)}}

    RETURN_TYPES = ()
    FUNCTION = "stats"
    OUTPUT_NODE = True
    CATEGORY = "mg/latent"

    def stats(self, samples):
        s = samples["samples"]
        return {"ui": {"shape": [list(s.shape)], "mean": [float(s.mean())]}}


class MgLazyInternal:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"text": ("STRING", {"default": "x"})}}

    RETURN_TYPES = ("STRING",)
    FUNCTION = "run"
    CATEGORY = "mg"

    def run(self, text):
        import comfy.model_patcher  # noqa: F401 - a ComfyUI internal
        return (text,)


class MgSleep:
    """An async node: two of them run concurrently (their recorded spans overlap)."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"tag": ("STRING", {"default": "s"}),
                             "seconds": ("FLOAT", {"default": 0.2, "min": 0.0, "max": 5.0})}}

    RETURN_TYPES = ("STRING",)
    FUNCTION = "sleep"
    OUTPUT_NODE = True
    CATEGORY = "mg/flow"

    async def sleep(self, tag, seconds):
        bar = comfy.utils.ProgressBar(2)     # reports for this node while the other one sleeps
        SLEEPS.append((tag, "start", time.monotonic()))
        bar.update(1)
        await asyncio.sleep(seconds)
        SLEEPS.append((tag, "end", time.monotonic()))
        bar.update(1)
        return {"ui": {"slept": [tag]}, "result": (tag,)}


class MgNumber:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"value": ("FLOAT", {"default": 1.0}),
                             "tag": ("STRING", {"default": "n"})}}

    RETURN_TYPES = ("FLOAT",)
    FUNCTION = "run"
    CATEGORY = "mg/flow"

    def run(self, value, tag):
        CALLS[tag] = CALLS.get(tag, 0) + 1
        return (value,)


class MgLazyMix:
    """A lazy mix: ratio 0 needs only a, ratio 1 only b, anything between both."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"ratio": ("FLOAT", {"default": 0.5, "min": 0.0, "max": 1.0}),
                             "a": ("FLOAT", {"lazy": True, "forceInput": True}),
                             "b": ("FLOAT", {"lazy": True, "forceInput": True})}}

    RETURN_TYPES = ("FLOAT",)
    FUNCTION = "mix"
    OUTPUT_NODE = True
    CATEGORY = "mg/flow"

    def check_lazy_status(self, ratio, a=None, b=None):
        need = []
        if ratio < 1.0 and a is None:
            need.append("a")
        if ratio > 0.0 and b is None:
            need.append("b")
        return need

    def mix(self, ratio, a=None, b=None):
        value = (a if ratio < 1.0 else 0.0) * (1.0 - ratio) + (b if ratio > 0.0 else 0.0) * ratio
        return {"ui": {"mix": [value]}, "result": (value,)}


class MgWhileAppend:
    """A while loop built by expansion: while n > 0, append "+" and go round again."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"text": ("STRING", {"default": "w"}),
                             "n": ("INT", {"default": 2, "min": 0, "max": 1000})}}

    RETURN_TYPES = ("STRING",)
    FUNCTION = "loop"
    CATEGORY = "mg/flow"

    def loop(self, text, n):
        if n <= 0:
            return (text,)
        graph = GraphBuilder()
        step = graph.node("MgAppendText", text=text, suffix="+")
        again = graph.node("MgWhileAppend", text=step.out(0), n=n - 1)
        return {"result": (again.out(0),), "expand": graph.finalize()}


class MgNestedLoop:
    """A loop whose body is a loop: each outer round runs MgWhileAppend(inner), then adds "|"."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"text": ("STRING", {"default": "o"}),
                             "outer": ("INT", {"default": 2, "min": 0, "max": 100}),
                             "inner": ("INT", {"default": 2, "min": 0, "max": 100})}}

    RETURN_TYPES = ("STRING",)
    FUNCTION = "loop"
    CATEGORY = "mg/flow"

    def loop(self, text, outer, inner):
        if outer <= 0:
            return (text,)
        graph = GraphBuilder()
        body = graph.node("MgWhileAppend", text=text, n=inner)
        bar = graph.node("MgAppendText", text=body.out(0), suffix="|")
        again = graph.node("MgNestedLoop", text=bar.out(0), outer=outer - 1, inner=inner)
        return {"result": (again.out(0),), "expand": graph.finalize()}


class MgSampleLoop:
    """Expands into `times` chained core KSamplers (the links arrive raw, as ComfyUI packs that
    expand take them)."""

    @classmethod
    def INPUT_TYPES(cls):
        link = {"rawLink": True}
        return {"required": {"model": ("MODEL", link), "positive": ("CONDITIONING", link),
                             "negative": ("CONDITIONING", link), "latent": ("LATENT", link),
                             "seed": ("INT", {"default": 0}),
                             "steps": ("INT", {"default": 2, "min": 1, "max": 100}),
                             "times": ("INT", {"default": 2, "min": 1, "max": 10})}}

    RETURN_TYPES = ("LATENT",)
    FUNCTION = "loop"
    CATEGORY = "mg/sampling"

    def loop(self, model, positive, negative, latent, seed, steps, times):
        graph = GraphBuilder()
        current = latent
        for i in range(times):
            k = graph.node("KSampler", model=model, positive=positive, negative=negative,
                           latent_image=current, seed=seed + i, steps=steps, cfg=2.0,
                           sampler_name="euler", scheduler="normal",
                           denoise=1.0 if i == 0 else 0.5)
            current = k.out(0)
        return {"result": (current,), "expand": graph.finalize()}


class MgDecode:
    """Decodes through the core VAEDecode node, under the precision this node is given."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"vae": ("VAE",), "samples": ("LATENT",)}}

    RETURN_TYPES = ("IMAGE",)
    FUNCTION = "decode"
    CATEGORY = "mg/latent"

    def decode(self, vae, samples):
        core = nodes.NODE_CLASS_MAPPINGS["VAEDecode"]
        (image,) = getattr(core(), core.FUNCTION)(vae=vae, samples=samples)
        return (image,)


NODE_CLASS_MAPPINGS = {c.__name__: c for c in (
    MgSleep, MgNumber, MgLazyMix, MgWhileAppend, MgNestedLoop, MgSampleLoop, MgDecode,
    MgLatentStats, MgLazyInternal,
    MgAppendText, MgShowText, MgSendMessages, MgHidden, MgScaleLatent, MgEmptyLatent,
    MgChanged, MgValidate, MgAnyCount, MgAsync, MgFolders, MgNeedsInternals, MgLazyPick,
    MgCountB, MgJoinList, MgSplit, MgExpandAppend, MgBlockIf)}
NODE_DISPLAY_NAME_MAPPINGS = {"MgAppendText": "Append Text (mg)"}
