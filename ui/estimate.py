"""Memory predicted before a run: `mixgraph estimate WF.json [--precision SPEC] [--json]`, the
`memory` part of `validate --json`, `POST /mixgraph/estimate`, and the refusal of a prompt that
cannot fit (server and CLI) with the preset that would.

The model of one run's peak resident memory:

    peak = BASE_BYTES                      the interpreter, torch and the node library
         + weights held at the node        what the weight store holds: every module loaded so
                                           far (per file component and text encoder, storage
                                           dtype and LoRA stack: `cast.precision_bytes`, from
                                           shapes only), least recently used ones dropped as the
                                           store does when a load takes it over its budget
                                           (`store.STORE.budget_bytes`, the memory budget by
                                           default); a model over the memory budget is counted
                                           at its streamed footprint (`_streamed_parts`)
         + ACTIVATION_FACTOR * activations the largest live set of tensors while the node's model
                                           runs at the workflow's size and batch, traced on fake
                                           tensors (no memory, no arithmetic: `trace_peak`), plus
                                           what each use of the model adds (int8 layers)
         + outputs                         cached LATENT/IMAGE outputs of the nodes before it

taken as the maximum over the nodes, in run order. Weights come from each file's header (the
loaders read nothing else), so estimating a 7 GB checkpoint costs milliseconds plus one traced
forward per distinct (model, policy, shape), about a second on a CPU for an SD1.5 UNet.
BASE_BYTES and ACTIVATION_FACTOR are calibrated against measured peak RSS of full-size SD1.5
runs and checked on full-size SDXL (benchmarks/bench_hardware.py, numbers in benchmarks/README.md).

Nodes the model knows: the loaders (CheckpointLoaderSimple, CheckpointLoader, UNETLoader,
VAELoader, CLIPLoader, DualCLIPLoader, ControlNetLoader, and ComfyUI-GGUF's UnetLoaderGGUF(Advanced),
(Dual)CLIPLoaderGGUF, whose quantised weights count as the blocks held), pass-through model nodes (LoRA,
precision pins, anything whose output is the model type of an input), the samplers (KSampler,
KSamplerAdvanced; batch doubled for CFG, plus every ControlNet applied in the workflow), VAE
decode/encode (whole and tiled) and text encoding. Sizes come from EmptyLatentImage / EmptySD3LatentImage,
LatentUpscale(By), ImageScale(By) and LoadImage (the image header); a node whose size cannot be
followed is estimated at 512x512 and says so in `assumed`.
"""

from __future__ import annotations

import functools
import os
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from mixgraph.graph.precision import (PRESETS, DeviceCaps, Policy, PrecisionError, Resolver,
                                      parse_precision_arg, resolve)
from mixgraph.graph.prompt import Link, Workflow, WorkflowError

__all__ = ["estimate", "estimate_presets", "trace_peak", "available_bytes", "BASE_BYTES",
           "ACTIVATION_FACTOR", "refusal", "format_estimate", "memory_section", "system_section",
           "InsufficientMemory", "cli_main", "weights_needed", "size_refusal", "budget_section"]

#: RSS of a process that has imported torch and the node library and run nothing (measured:
#: 0.40-0.45 GiB on x86-64 Linux with torch 2.13 CPU).
BASE_BYTES = 430 * 2**20
#: measured peak RSS growth of a node / its traced activation peak (allocator slack, oneDNN
#: scratch and weight reorders, the tensors the trace cannot see): calibrated on SD1.5 full size.
ACTIVATION_FACTOR = 1.5
#: half compute that the device only emulates (bf16 on a CPU without AVX512-BF16/AMX) holds
#: more than the trace sees (f32 working copies, weight reorders): this fraction of the model's
#: stored weight bytes on top, per use. Calibrated on one point (SD1.5 full size, bf16, 256 px, on
#: a Zen 3 EPYC: measured 3.29 GiB against 2.48 GiB without it).
EMULATED_HALF_FACTOR = 0.5
DEFAULT_SIDE = 512
#: `MIXGRAPH_MEMORY_CHECK=0` turns the refusal of runs that would not fit off.
MEMORY_CHECK_ENV = "MIXGRAPH_MEMORY_CHECK"

#: VAELoader choices that name no file of the vae folder: TAESD's pair in vae_approx (a few MB,
#: not counted) and pixel space
_BUILTIN_VAES = ("taesd", "taesdxl", "pixel_space")


def _names_a_file(call: Any) -> bool:
    return not (call.class_type == "VAELoader" and call.inputs.get("vae_name") in _BUILTIN_VAES)


_LOADERS = {   # class -> (folder, file inputs, {output slot: socket type})
    "CheckpointLoaderSimple": ("checkpoints", ("ckpt_name",), {0: "MODEL", 1: "CLIP", 2: "VAE"}),
    "CheckpointLoader": ("checkpoints", ("ckpt_name",), {0: "MODEL", 1: "CLIP", 2: "VAE"}),
    "UNETLoader": ("diffusion_models", ("unet_name",), {0: "MODEL"}),
    "VAELoader": ("vae", ("vae_name",), {0: "VAE"}),
    "CLIPLoader": ("text_encoders", ("clip_name",), {0: "CLIP"}),
    "DualCLIPLoader": ("text_encoders", ("clip_name1", "clip_name2"), {0: "CLIP"}),
    "ControlNetLoader": ("controlnet", ("control_net_name",), {0: "CONTROL_NET"}),
    # ComfyUI-GGUF's (nodes/declare/loaders/gguf_nodes.py): quantised weights counted as held
    "UnetLoaderGGUF": ("diffusion_models", ("unet_name",), {0: "MODEL"}),
    "UnetLoaderGGUFAdvanced": ("diffusion_models", ("unet_name",), {0: "MODEL"}),
    "CLIPLoaderGGUF": ("text_encoders", ("clip_name",), {0: "CLIP"}),
    "DualCLIPLoaderGGUF": ("text_encoders", ("clip_name1", "clip_name2"), {0: "CLIP"}),
}
_SAMPLERS = {"KSampler": "latent_image", "KSamplerAdvanced": "latent_image"}
_VAE_NODES = {"VAEDecode": ("samples", "decode"), "VAEDecodeTiled": ("samples", "decode"),
              "VAEEncode": ("pixels", "encode"), "VAEEncodeTiled": ("pixels", "encode"),
              "VAEEncodeForInpaint": ("pixels", "encode")}


# --------------------------------------------------------------------------------------------
# tracing activations on fake tensors


class _LiveBytes(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the bytes of tensor storages created under it that are still alive; `peak` is the
    most at once. A storage is freed when the last tensor that viewed it dies."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = 0
        self._refs: dict[int, int] = {}
        self._size: dict[int, int] = {}

    def _drop(self, key: int) -> None:
        self._refs[key] -= 1
        if self._refs[key] == 0:
            self.live -= self._size.pop(key)
            del self._refs[key]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                key = t.untyped_storage()._cdata
                if key not in self._refs:
                    self._refs[key] = 0
                    self._size[key] = t.untyped_storage().nbytes()
                    self.live += self._size[key]
                    self.peak = max(self.peak, self.live)
                self._refs[key] += 1
                weakref.finalize(t, self._drop, key)
        return out


def trace_peak(build, policy: Policy, run) -> int:
    """Peak bytes of the tensors `run(module)` creates, for the module `build()` returns with
    `policy` applied; on fake CPU tensors, so nothing is allocated or computed (weights excluded:
    they are counted as weights)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from mixgraph.nodes.weights.cast import apply_precision

    with torch.device("meta"):
        module = build()
    with FakeTensorMode(allow_non_fake_inputs=True):
        module = apply_precision(module.to_empty(device="cpu"), policy)
        with _LiveBytes() as live, torch.inference_mode():
            out = run(module)
            del out
    return live.peak


def _policy_key(p: Policy) -> tuple:
    return (p.storage, p.compute, p.upcast_attention, p.f32_norms, p.int8)


@functools.lru_cache(maxsize=64)
def _model_peak(family_name: str, config: Any, pkey: tuple, batch: int, h: int, w: int, t: int | None = None,
                refs: tuple[tuple[int, int], ...] = ()) -> int:
    """The traced peak of one diffusion model call on an h x w latent (latent pixels), of `t`
    latent frames for a video latent (None: an image): the model class and its dummy inputs are
    the family's (``build``, ``trace_inputs``). `refs`: the (h, w) latent sizes of reference
    latents (edit models), given to a family whose ``trace_inputs`` takes ``refs``."""
    import inspect

    from mixgraph.nodes.families import registry as families

    family = families.get(family_name)
    policy = Policy(*pkey)
    shape = (h, w) if t is None else (t, h, w)
    extra = {"refs": refs} if refs and "refs" in inspect.signature(family.trace_inputs).parameters else {}

    def run(m):
        args, kwargs = family.trace_inputs(config, shape, batch, **extra)
        return m(*args, **kwargs)
    return trace_peak(lambda: family.build(config), policy, run)


@functools.lru_cache(maxsize=64)
def _vae_peak(config: Any, pkey: tuple, batch: int, h: int, w: int, mode: str, down: int, arch: str = "kl") -> int:
    """The traced peak of one VAE call on an h x w image: the module and its dummy inputs are
    the VAE architecture's (``nodes/vae/arch_registry.py``: ``build``, ``trace``)."""
    from mixgraph.nodes.vae import arch_registry as vae_archs

    architecture = vae_archs.get(arch)
    return trace_peak(lambda: architecture.build(config), Policy(*pkey), architecture.trace(config, mode, batch, h, w))


@functools.lru_cache(maxsize=64)
def _controlnet_peak(config: Any, pkey: tuple, batch: int, h: int, w: int, down: int) -> int:
    from mixgraph.nodes.adapters.controlnet import ControlNetModel

    policy = Policy(*pkey)

    def run(m):
        y = torch.empty(batch, config.unet.adm_in_channels) if config.unet.adm_in_channels else None
        return m(torch.empty(batch, config.unet.in_channels, h // down, w // down),
                 torch.empty(batch, config.hint_channels, h, w), torch.empty(batch),
                 torch.empty(batch, 77, config.unet.context_dim or 768), y)
    return trace_peak(lambda: ControlNetModel(config), policy, run)


# --------------------------------------------------------------------------------------------
# models, weights and sizes of one workflow


@dataclass(frozen=True)
class _Component:
    """One loaded model: which loader node and output, its handle (header only)."""

    loader: str
    socket: str
    handle: Any
    patched: bool = False
    pinned: Any = None          # a Set*Precision node's policy on the way
    storage: Any = None         # UNETLoader's weight_dtype


@functools.lru_cache(maxsize=32)
def _load(class_type: str, paths: tuple[str, ...], mtimes: tuple[int, ...], extra: str) -> tuple:
    from mixgraph.nodes.models import loader

    if class_type in ("CheckpointLoaderSimple", "CheckpointLoader"):
        return loader.load_checkpoint(paths[0])
    if class_type == "UNETLoader":
        return (loader.load_unet(paths[0], weight_dtype=extra),)
    if class_type.startswith("UnetLoaderGGUF"):
        return (loader.load_unet(paths[0]),)
    if class_type.endswith("CLIPLoaderGGUF"):
        return (loader.load_clip(list(paths), extra),)
    if class_type == "VAELoader":
        return (loader.load_vae(paths[0]),)
    if class_type in ("CLIPLoader", "DualCLIPLoader"):
        return (loader.load_clip(list(paths), extra),)
    return (loader.load_controlnet(paths[0]),)


def _modules(socket: str, handle: Any) -> list:
    """(builder, weight source) of each module a handle materializes (builders make it on the
    meta device when called)."""
    if socket == "MODEL":
        from mixgraph.nodes.families import registry as families
        build = families.get(getattr(handle, "family", "sd")).build
        return [(lambda: build(handle.config), getattr(handle, "source", None))]
    if socket == "VAE":
        from mixgraph.nodes.vae import arch_registry as vae_archs
        build = vae_archs.get(getattr(handle, "arch", "kl")).build
        return [(lambda: build(handle.config), getattr(handle, "source", None))]
    if socket == "CONTROL_NET":  # DiT nets name their module class (adapters/*_controlnet.py)
        from mixgraph.nodes.adapters.controlnet import ControlNetModel
        build = getattr(handle, "module_class", None) or ControlNetModel
        return [(lambda: build(handle.config), getattr(handle, "source", None))]
    if socket == "CLIP":  # one module per text encoder of the set
        return [(functools.partial(e.build, e.config), e.source) for e in handle.encoders]
    return []


def _stored_table_bytes(module: torch.nn.Module, source: Any) -> int:
    """Bytes of the module's `keep_stored` tables in the file's dtype: the weight store counts
    them against its budget although they stay lazily paged views (not resident)."""
    from mixgraph.nodes.weights.cast import matched_names
    from mixgraph.nodes.weights.safetensors_io import source_dtypes

    names = matched_names(module, "keep_stored")
    if not names:
        return 0
    try:
        item = max((torch.empty((), dtype=d).element_size() for d in source_dtypes(source)), default=4)
    except (OSError, ValueError, AttributeError, AssertionError):
        item = 4
    mods = dict(module.named_modules())
    return sum(p.numel() * item for n in names if n in mods for p in mods[n].parameters(recurse=False))


@functools.lru_cache(maxsize=128)
def _weight_parts(socket: str, handle: Any, pkey: tuple) -> tuple[tuple[int, int, int], ...]:
    """(held, per use, counted) bytes of each module the handle materializes, one weight store
    entry each (a CLIP handle's text encoders are separate entries); `counted` is what the store
    counts against its budget (held plus the lazily paged tables)."""
    from mixgraph.nodes.weights.cast import precision_bytes

    parts = []
    for build, source in _modules(socket, handle):
        with torch.device("meta"):
            module = build()
        held, use = precision_bytes(module, Policy(*pkey))
        held -= _quantised_saving(module, source, pkey[0])
        parts.append((held, use, held + _stored_table_bytes(module, source)))
    return tuple(parts)


def _quantised_saving(module: torch.nn.Module, source: Any, storage: torch.dtype) -> int:
    """Bytes the weights a source keeps quantised (a GGUF file's blocks, an int8 file's layers)
    hold less than `precision_bytes` counts for them (it counts them in the storage dtype)."""
    from mixgraph.nodes.weights.safetensors_io import WeightSource, held_quantised

    if not isinstance(source, WeightSource):
        return 0
    held_by_key = held_quantised(source)
    if not held_by_key:
        return 0
    params = dict(module.named_parameters())
    item = torch.empty((), dtype=storage).element_size()
    return sum(max(0, numel * item - held) for key, (held, numel) in held_by_key.items() if key in params)


def _weight_bytes(socket: str, handle: Any, pkey: tuple) -> tuple[int, int]:
    parts = _weight_parts(socket, handle, pkey)
    return sum(p[0] for p in parts), sum(p[1] for p in parts)


def _store_budget(memory_bytes: int | None = None) -> int:
    """The weight store's LRU bound (under a memory budget of `memory_bytes`, default the one in force)."""
    from mixgraph.nodes.weights import store
    return store.STORE.budget_bytes if memory_bytes is None else store.STORE.budget_for(memory_bytes)


class _Held:
    """The weight store as the run will fill it: an LRU of entries, bounded like
    `nodes.weights.store.WeightStore` (a new entry evicts the least recently used others while
    the total is over the budget; the new one is always kept). Entries a node is using stay
    resident until the node ends even when evicted (its module still references them)."""

    def __init__(self, budget: int):
        self.budget = budget
        self.entries: OrderedDict[tuple, tuple[int, int]] = OrderedDict()  # (resident, counted)
        self.loaded: dict[tuple, int] = {}
        self.pinned: dict[tuple, int] = {}         # evicted during this node but in use by it
        self.using: set[tuple] = set()

    def use(self, key: tuple, nbytes: int, counted: int | None = None) -> int:
        """Use one entry of `nbytes` resident bytes (`counted` against the budget, default the
        same); returns the bytes it loads (0 on a hit)."""
        self.using.add(key)
        if key in self.entries:
            self.entries.move_to_end(key)
            return 0
        self.entries[key] = (nbytes, nbytes if counted is None else counted)
        self.loaded[key] = nbytes
        total = sum(c for _, c in self.entries.values())
        for k in list(self.entries):
            if total <= self.budget:
                break
            if k == key:
                continue
            dropped, c = self.entries.pop(k)
            total -= c
            if k in self.using:
                self.pinned[k] = dropped
        return nbytes

    def resident(self) -> int:
        return sum(r for r, _ in self.entries.values()) + sum(self.pinned.values())

    def end_node(self) -> None:
        self.pinned.clear()
        self.using.clear()


class _Graph:
    """What the estimate needs from a workflow: each node's model inputs traced back to their
    loader, and the pixel size and batch of its LATENT/IMAGE inputs."""

    def __init__(self, wf: Workflow, registry: Any, env: Any):
        self.wf, self.registry, self.env = wf, registry, env
        self._sizes: dict[tuple[str, int], tuple[int, int, int, bool]] = {}

    def inputs_of(self, nid: str) -> dict[str, Any]:
        return self.wf.prompt[nid].inputs

    def input_type(self, nid: str, name: str) -> str | None:
        spec = self.registry.get(self.wf.prompt[nid].class_type)
        inp = spec.input_map.get(name) if spec is not None else None
        return inp.type if inp is not None else None

    def component(self, link: Link, socket: str, depth: int = 0) -> _Component | None:
        """Follow a model link up to its loader, noting LoRA and precision pins on the way."""
        nid = link.node_id
        call = self.wf.prompt.get(nid)
        if call is None or depth > 200:
            return None
        ct = call.class_type
        if ct in _LOADERS and not _names_a_file(call):
            return None
        if ct in _LOADERS:
            folder, names, outs = _LOADERS[ct]
            if outs.get(link.slot) is None:
                return None
            from mixgraph.nodes.helpers import folders
            paths = tuple(str(folders.resolve(self.env, folder, call.inputs[n])) for n in names)
            extra = str(call.inputs.get("weight_dtype", call.inputs.get("type", "stable_diffusion")))
            mtimes = tuple(os.stat(p).st_mtime_ns for p in paths)
            handles = _load(ct, paths, mtimes, extra)
            storage = getattr(handles[link.slot], "weight_dtype", None)
            return _Component(f"{nid}:{link.slot}", outs[link.slot], handles[link.slot],
                              storage=storage)
        for name, value in call.inputs.items():
            if isinstance(value, Link) and self.input_type(nid, name) == socket:
                up = self.component(value, socket, depth + 1)
                if up is None:
                    return None
                if ct.startswith("Lora"):
                    up = _replace(up, patched=True)
                if ct.startswith("Set") and ct.endswith("Precision") and up.pinned is None:
                    from mixgraph.nodes.declare.model_patches.precision_nodes import policy_from
                    up = _replace(up, pinned=policy_from(
                        call.inputs.get("storage", "bf16"), call.inputs.get("compute", "bf16"),
                        bool(call.inputs.get("upcast_attention")), bool(call.inputs.get("f32_norms"))))
                return up
        return None

    def frames(self, link: Any, depth: int = 0) -> int | None:
        """Pixel frames of a video LATENT output (``length`` of the node that made it, less what
        TrimVideoLatent cut, or the IMAGE batch a video VAE encoded); None for an image latent
        or an IMAGE (whose frames are its batch)."""
        if not isinstance(link, Link) or depth > 200:
            return None
        call = self.wf.prompt.get(link.node_id)
        if call is None:
            return None
        ins, ct = call.inputs, call.class_type
        if self.output_type(link) != "LATENT":
            return None
        if _is_video_source(ins):
            return int(ins["length"])
        if ct == "TrimVideoLatent":
            up = self.frames(ins.get("samples"), depth + 1)
            trim = ins.get("trim_amount", 0)
            return None if up is None else max(1, up - TIME_DOWNSCALE * int(trim if isinstance(trim, int) else 0))
        if ct in _VAE_NODES and _VAE_NODES[ct][1] == "encode":
            comp = self._vae(link.node_id)
            if comp is not None and _is_video_vae(comp.handle):
                return self.size(ins.get(_VAE_NODES[ct][0]), depth + 1)[0]
            return None
        for name, value in ins.items():
            if isinstance(value, Link) and self.input_type(link.node_id, name) == "LATENT":
                return self.frames(value, depth + 1)
        return None

    def output_type(self, link: Link) -> str | None:
        spec = self.registry.get(self.wf.prompt[link.node_id].class_type)
        outs = getattr(spec, "outputs", None) if spec is not None else None
        try:
            out = outs[link.slot]
        except (TypeError, IndexError):
            return None
        return getattr(out, "type", out)

    def _vae(self, nid: str) -> _Component | None:
        vae = self.wf.prompt[nid].inputs.get("vae")
        if not isinstance(vae, Link):
            return None
        try:
            return self.component(vae, "VAE")
        except (ValueError, OSError, KeyError):
            return None

    def references(self, link: Any, depth: int = 0) -> tuple[tuple[int, int], ...]:
        """(height, width) in pixels of each reference latent a CONDITIONING carries (ComfyUI's
        ``reference_latents``: ReferenceLatent, TextEncodeQwenImageEdit(Plus) given a VAE)."""
        if not isinstance(link, Link) or depth > 200:
            return ()
        call = self.wf.prompt.get(link.node_id)
        if call is None:
            return ()
        ins, ct, found = call.inputs, call.class_type, []
        if ct == "ReferenceLatent" and isinstance(ins.get("latent"), Link):
            _, h, w, _ = self.size(ins["latent"])
            found.append((h, w))
        elif ct.startswith("TextEncodeQwenImageEdit") and isinstance(ins.get("vae"), Link):
            for name in ("image", "image1", "image2", "image3"):
                if isinstance(ins.get(name), Link):
                    _, h, w, _ = self.size(ins[name])
                    s = (QWEN_EDIT_AREA / max(1, h * w)) ** 0.5   # scaled to about 1 megapixel
                    found.append((max(1, round(h * s)), max(1, round(w * s))))
        for name, value in ins.items():
            if isinstance(value, Link) and self.input_type(link.node_id, name) == "CONDITIONING":
                found.extend(self.references(value, depth + 1))
        return tuple(found)

    def size(self, link: Any, depth: int = 0) -> tuple[int, int, int, bool]:
        """(batch, height px, width px, assumed) of a LATENT or IMAGE output."""
        if not isinstance(link, Link) or depth > 200:
            return 1, DEFAULT_SIDE, DEFAULT_SIDE, True
        key = (link.node_id, link.slot)
        if key not in self._sizes:
            self._sizes[key] = self._size(link, depth)
        return self._sizes[key]

    def _size(self, link: Link, depth: int) -> tuple[int, int, int, bool]:
        call = self.wf.prompt.get(link.node_id)
        if call is None:
            return 1, DEFAULT_SIDE, DEFAULT_SIDE, True
        ins, ct = call.inputs, call.class_type

        def num(name: str, default: float) -> float:
            v = ins.get(name, default)
            return float(v) if isinstance(v, (int, float)) else default

        def upstream() -> tuple[int, int, int, bool]:
            for name, value in ins.items():
                if isinstance(value, Link) and self.input_type(link.node_id, name) in ("LATENT", "IMAGE"):
                    return self.size(value, depth + 1)
            return 1, DEFAULT_SIDE, DEFAULT_SIDE, True

        if ct in ("EmptyLatentImage", "EmptySD3LatentImage", "EmptyImage") or _is_video_source(ins):
            # the 16-channel one and the video latents (EmptyHunyuanLatentVideo, WanImageToVideo,
            # ...: `length` frames, see `frames`): the same sizes
            return int(num("batch_size", 1)), int(num("height", 512)), int(num("width", 512)), False
        if ct in ("VAEDecode", "VAEDecodeTiled"):      # a video's frames become IMAGE rows
            b, h, w, a = upstream()
            frames = self.frames(ins.get("samples"), depth + 1)
            return (b if frames is None else b * _decoded(frames)), h, w, a
        if ct in ("VAEEncode", "VAEEncodeTiled"):      # a video VAE encodes the frames as one video
            b, h, w, a = upstream()
            comp = self._vae(link.node_id)
            return (1 if comp is not None and _is_video_vae(comp.handle) else b), h, w, a
        if ct in ("LatentUpscale", "ImageScale"):
            b, h, w, a = upstream()
            nw, nh = int(num("width", 0)), int(num("height", 0))
            if nw == 0 and nh == 0:
                return b, h, w, a
            nw = nw or max(1, round(w * nh / h))
            nh = nh or max(1, round(h * nw / w))
            return b, nh, nw, a
        if ct == "SD_4XUpscale_Conditioning":  # the latent of the output size (image × scale_ratio)
            b, h, w, a = upstream()
            s = num("scale_ratio", 4.0)
            return b, max(1, round(h * s)), max(1, round(w * s)), a
        if ct in ("LatentUpscaleBy", "ImageScaleBy"):
            b, h, w, a = upstream()
            s = num("scale_by", 1.0)
            return b, round(h * s), round(w * s), a
        if ct in ("LoadImage", "LoadImageMask") and isinstance(ins.get("image"), str):
            try:    # the header only, whatever its size (no decompression-bomb error here)
                from mixgraph.nodes.media.memory_guards import image_header
                h = image_header(Path(self.env.input) / ins["image"])
                return 1, h.height, h.width, False
            except Exception:  # noqa: BLE001 - PIL raises many types for what is no image
                return 1, DEFAULT_SIDE, DEFAULT_SIDE, True
        if ct in ("RepeatImageBatch", "RepeatLatentBatch"):
            b, h, w, a = upstream()
            return b * max(1, int(num("amount", 1))), h, w, a
        if ct == "ImageScaleToTotalPixels":
            b, h, w, a = upstream()
            s = (num("megapixels", 1.0) * 1024 * 1024 / max(1, h * w)) ** 0.5
            return b, max(1, round(h * s)), max(1, round(w * s)), a
        return upstream()


#: TIME_DOWNSCALE of the video VAEs (nodes/vae/video_latent_formats.py): 1 + 4k frames make
#: 1 + k latent frames; QWEN_EDIT_AREA: the pixel area TextEncodeQwenImageEdit scales to
TIME_DOWNSCALE = 4
QWEN_EDIT_AREA = 1024 * 1024


def _is_video_source(ins: dict) -> bool:
    """A node that makes a video latent from widgets (EmptyHunyuanLatentVideo, WanImageToVideo,
    WanFirstLastFrameToVideo, WanVaceToVideo, Wan22ImageToVideoLatent, the Fun nodes)."""
    return all(isinstance(ins.get(k), (int, float)) for k in ("width", "height", "length"))


def _is_video_vae(handle: Any) -> bool:
    """A VAE with a time axis (the Wan 2.1 / 2.2 VAEs: an IMAGE batch is one video)."""
    return getattr(handle, "arch", "kl") == "wan"


def _latent_frames(frames: int) -> int:
    return (max(1, frames) - 1) // TIME_DOWNSCALE + 1


def _decoded(frames: int) -> int:
    """Frames a video VAE decodes from the latent of `frames` pixel frames."""
    return TIME_DOWNSCALE * (_latent_frames(frames) - 1) + 1


def _replace(c: _Component, **kw: Any) -> _Component:
    import dataclasses
    return dataclasses.replace(c, **kw)


# --------------------------------------------------------------------------------------------
# the estimate


def estimate(wf: Workflow, registry: Any, env: Any, precision: str | None = None,
             caps: DeviceCaps | None = None, order: Sequence[str] | None = None,
             budget: Any = None) -> dict:
    """The predicted peak memory of running `wf` under `precision` (a `--precision` argument,
    None: the workflow's own settings), per node and in total. `order` is the validated run order
    (default: the prompt's order). Raises PrecisionError for a bad SPEC, FolderError for a missing
    file (validation reports those first). `budget`: the memory budget the run streams within
    (`memory_budget.Budget`; default the one in force): a model that does not fit is counted at
    its streamed footprint (`_streamed_parts`), and its node lists it under `streamed`."""
    device = env.device or "cpu"
    budget = _run_budget() if budget is None else budget
    default, types = parse_precision_arg(precision, device)
    resolver = Resolver(wf.precision, types, default, device, caps=caps)
    graph = _Graph(wf, registry, env)
    controls: list[tuple[str, _Component]] = []
    held = _Held(_store_budget(budget.nbytes))    # the weight store's entries
    outputs = 0
    nodes: dict[str, dict] = {}
    peak, peak_node = BASE_BYTES, None
    for nid in (order or list(wf.prompt)):
        call = wf.prompt[nid]
        ct = call.class_type
        entry: dict[str, Any] = {"class_type": ct, "weights_bytes": 0, "activation_bytes": 0,
                                 "policy": {}}
        uses: list[tuple[str, _Component, Any]] = []
        for name, value in call.inputs.items():
            socket = graph.input_type(nid, name)
            if isinstance(value, Link) and socket in ("MODEL", "CLIP", "VAE", "CONTROL_NET"):
                comp = graph.component(value, socket)
                if comp is not None:
                    uses.append((socket, comp, name))
        activation = 0
        for socket, comp, _name in uses:
            policy = resolve(resolver.policy(nid, socket), pinned=comp.pinned, storage=comp.storage)
            entry["policy"][socket] = policy.spec
            pkey = _policy_key(policy)
            if socket == "CONTROL_NET":
                controls.append((nid, comp))
                continue
            store_key = (comp.loader, socket, policy.storage, policy.int8, comp.patched)
            w_held, w_use = _weight_bytes(socket, comp.handle, pkey)
            parts, streamed = _streamed_parts(socket, comp.handle, pkey, budget)
            if streamed:
                entry.setdefault("streamed", []).append(socket)
            for part, (p_held, _, p_counted) in enumerate(parts):
                entry["weights_bytes"] += held.use(store_key + (part,), p_held, p_counted)
            activation += w_use
            if policy.is_half and not resolver.caps.native(policy.compute):
                activation += EMULATED_HALF_FACTOR * w_held / ACTIVATION_FACTOR
            if socket == "MODEL" and ct in _SAMPLERS:
                b, h, w, assumed = graph.size(call.inputs.get(_SAMPLERS[ct]))
                cfg = call.inputs.get("cfg", 8.0)
                batch = b * (1 if cfg == 1 else 2)
                down = getattr(getattr(comp.handle, "latent_format", None), "downscale", 8)
                frames = graph.frames(call.inputs.get(_SAMPLERS[ct]))
                t = None if frames is None else _latent_frames(frames)
                refs = tuple((max(1, rh // down), max(1, rw // down)) for rh, rw in sorted(set(
                    graph.references(call.inputs.get("positive")) + graph.references(call.inputs.get("negative")))))
                act = _model_peak(getattr(comp.handle, "family", "sd"), comp.handle.config, pkey, batch,
                                  max(1, h // down), max(1, w // down), t, refs)
                for cn_nid, cn in controls:
                    cpol = resolve(resolver.policy(cn_nid, "CONTROL_NET"), pinned=cn.pinned)
                    ckey = (cn.loader, "CONTROL_NET", cpol.storage, cpol.int8, cn.patched)
                    c_held, c_use = _weight_bytes("CONTROL_NET", cn.handle, _policy_key(cpol))
                    entry["weights_bytes"] += held.use(ckey, c_held)
                    act += c_use
                    if getattr(cn.handle, "module_class", None) is None:  # DiT nets: activations not traced yet
                        act += _controlnet_peak(cn.handle.config, _policy_key(cpol), batch, h, w, down)
                activation += act
                entry["size"] = [b, h, w]
                if assumed:
                    entry["assumed"] = f"size unknown: {DEFAULT_SIDE}x{DEFAULT_SIDE} assumed"
                channels = getattr(getattr(comp.handle, "latent_format", None), "channels", 4)
                outputs += b * channels * (t or 1) * (h // down) * (w // down) * 4
                if t is not None:
                    entry["frames"] = frames
            elif socket == "VAE" and ct in _VAE_NODES:
                inp, mode = _VAE_NODES[ct]
                b, h, w, assumed = graph.size(call.inputs.get(inp))
                vdown = getattr(comp.handle, "downscale", 8)
                if _is_video_vae(comp.handle):
                    act, out_bytes = _video_vae_bytes(comp.handle, pkey, graph, call, mode, b, h, w)
                    activation += act
                    outputs += out_bytes
                    entry["size"] = [b, h, w]
                    if assumed:
                        entry["assumed"] = f"size unknown: {DEFAULT_SIDE}x{DEFAULT_SIDE} assumed"
                    continue
                if ct.endswith("Tiled"):
                    tile = int(call.inputs.get("tile_size", 512))
                    th, tw = min(h, tile), min(w, tile)
                    act = _vae_peak(comp.handle.config, pkey, 1, th, tw, mode, vdown,
                                    getattr(comp.handle, "arch", "kl")) + b * h * w * 3 * 4
                else:
                    act = _vae_peak(comp.handle.config, pkey, b, h, w, mode, vdown, getattr(comp.handle, "arch", "kl"))
                activation += act
                entry["size"] = [b, h, w]
                if assumed:
                    entry["assumed"] = f"size unknown: {DEFAULT_SIDE}x{DEFAULT_SIDE} assumed"
                channels = getattr(comp.handle, "latent_channels", 4)
                outputs += b * h * w * 3 * 4 if mode == "decode" else b * channels * (h // vdown) * (w // vdown) * 4
        resident = held.resident()
        held.end_node()
        node_peak = BASE_BYTES + resident + outputs + int(ACTIVATION_FACTOR * activation)
        entry.update(activation_bytes=int(ACTIVATION_FACTOR * activation), resident_bytes=resident,
                     peak_bytes=node_peak)
        if not entry["policy"]:
            del entry["policy"]
        nodes[nid] = entry
        if node_peak > peak:
            peak, peak_node = node_peak, nid
    return {"peak_bytes": peak, "peak_node": peak_node, "base_bytes": BASE_BYTES,
            "budget_bytes": budget.nbytes,
            "weights_bytes": sum(held.loaded.values()), "precision": precision or "workflow",
            "resolved": resolver.describe(), "nodes": nodes}


def _video_vae_bytes(handle: Any, pkey: tuple, graph: _Graph, call: Any, mode: str, b: int, h: int,
                     w: int) -> tuple[int, int]:
    """(activations, output bytes) of a video VAE node (the Wan VAEs). The VAE runs a chunk of
    latent frames at a time with a frame cache (``nodes/vae/wan_arch.py``), so its traced peak
    (two latent frames) does not grow with the frame count; what does: the decoded IMAGE
    [N, H, W, 3] (written frame by frame into one tensor), and for an encode the f32 video
    [1, 3, N, H, W] and its [-1, 1] copy besides the latent [1, C, 1 + (N-1)/4, h, w]. `b`, h, w:
    the latent's batch and pixel size for a decode, the IMAGE's for an encode."""
    config, arch = handle.config, getattr(handle, "arch", "kl")
    f = getattr(handle, "downscale", 8)
    channels = getattr(handle, "latent_channels", 16)
    if mode == "decode":
        frames = graph.frames(call.inputs.get("samples"))
        n = b * (1 if frames is None else _decoded(frames))
        peak = _vae_peak(config, pkey, 1, h, w, mode, f, arch)
        if call.class_type.endswith("Tiled"):
            tile = int(call.inputs.get("tile_size", 512))
            peak = _vae_peak(config, pkey, 1, min(h, tile), min(w, tile), mode, f, arch)
        return peak, n * h * w * 3 * 4
    peak = _vae_peak(config, pkey, 1, h, w, mode, f, arch)
    latent = channels * _latent_frames(b) * (h // f) * (w // f) * 4
    return peak + 2 * b * h * w * 3 * 4, latent


def estimate_presets(wf: Workflow, registry: Any, env: Any, caps: DeviceCaps | None = None,
                     order: Sequence[str] | None = None) -> dict[str, int]:
    """{preset: predicted peak bytes} with each preset as the run's default (regions and pins in
    the workflow still apply)."""
    return {p: estimate(wf, registry, env, p, caps, order)["peak_bytes"] for p in PRESETS}


def available_bytes(device: str = "cpu") -> int | None:
    """Memory a new run can use: CUDA's free memory; on a CPU, MemAvailable, capped by the
    cgroup's limit (a container) when there is one. None when it cannot be read."""
    d = torch.device(device)
    if d.type == "cuda" and torch.cuda.is_available():
        return int(torch.cuda.mem_get_info(d.index or 0)[0])
    avail = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
        if limit != "max":
            room = int(limit) - used
            avail = room if avail is None else min(avail, room)
    except (OSError, ValueError):
        pass
    return avail


def weights_needed(wf: Workflow, registry: Any, env: Any,
                   order: Sequence[str] | None = None) -> set[tuple[str, torch.dtype]]:
    """The (file path, storage dtype) pairs the weight store will hold after running `wf`: every
    model input of a node traced back to its loader, under the policy that node resolves, as
    `estimate` counts them. What a Ray worker must hold for the prompt to need no load
    (ui/ray/ray_pool.py). Models it cannot trace (a custom loader) are left out."""
    from mixgraph.nodes.helpers import folders

    resolver = Resolver(wf.precision, {}, None, env.device or "cpu", set())
    graph = _Graph(wf, registry, env)
    needed: set[tuple[str, torch.dtype]] = set()
    for nid in (order or list(wf.prompt)):
        for name, value in wf.prompt[nid].inputs.items():
            socket = graph.input_type(nid, name)
            if not (isinstance(value, Link) and socket in ("MODEL", "CLIP", "VAE", "CONTROL_NET")):
                continue
            try:
                comp = graph.component(value, socket)
            except (folders.FolderError, OSError, ValueError, KeyError):
                continue
            source = getattr(comp.handle, "source", None) if comp is not None else None
            if source is None:          # CLIP handles name their file per encoder
                sources = [e.source for e in getattr(comp.handle, "encoders", ())] if comp is not None else []
            else:
                sources = [source]
            policy = resolve(resolver.policy(nid, socket), pinned=comp.pinned,
                             storage=comp.storage) if comp is not None else None
            for src in sources:
                if src is not None and getattr(src, "path", None):
                    needed.add((src.path, policy.storage))
    return needed


def refusal(wf: Workflow, registry: Any, env: Any, precision: str | None = None,
            order: Sequence[str] | None = None, held_bytes: int = 0,
            available: int | None = None) -> str | None:
    """A message when the run cannot fit in the memory there is, naming the estimate and the
    preset that would fit; None when it fits (or memory cannot be read). `held_bytes`: memory
    this process already holds that the run can reuse (the weight store, the process itself)."""
    device = env.device or "cpu"
    if os.environ.get(MEMORY_CHECK_ENV, "1") == "0" or torch.device(device).type != "cpu":
        return None     # the model is of a CPU run's resident memory
    available = available_bytes(device) if available is None else available
    if available is None:
        return None
    room = available + held_bytes + BASE_BYTES    # this process already holds its base
    budget = _run_budget()
    if _upper_bound(wf, registry, env, order) <= min(room, BASE_BYTES + budget.nbytes):
        return None     # fits even by a coarse bound: no tracing needed
    try:
        est = estimate(wf, registry, env, precision, order=order, budget=budget)
    except (PrecisionError, ValueError, OSError):
        return None  # validation reports bad SPECs and missing files itself
    if est["peak_bytes"] <= room and est["peak_bytes"] - BASE_BYTES <= budget.nbytes:
        return None
    if est["peak_bytes"] <= room:   # fits the machine, not the budget, even streamed
        return _budget_refusal(wf, registry, env, precision, order, est, budget, room)
    presets = estimate_presets(wf, registry, env, order=order)
    fitting = [p for p in ("balanced", "memory", "fast", "quality") if presets[p] <= room]
    hint = (f"--precision {fitting[0]} would fit ({_gib(presets[fitting[0]])})" if fitting else
            f"no preset fits (the smallest: memory, {_gib(presets['memory'])}); use a smaller "
            f"size or batch, or VAEDecodeTiled")
    smaller = _fitting_budget(wf, registry, env, precision, order, budget, room)
    if smaller is not None and smaller * 2**30 < budget.nbytes:
        hint = f"--memory-budget {smaller} would fit (model blocks stream within it); " + hint
    node = est["peak_node"]
    where = f" at node {node} ({wf.prompt[node].class_type})" if node else ""
    return (f"not enough memory: this run needs about {_gib(est['peak_bytes'])}{where}, "
            f"{_gib(room)} is available; {hint}{_length_hint(wf, registry, env, precision, order, room)}")


def _length_hint(wf: Workflow, registry: Any, env: Any, precision: str | None,
                 order: Sequence[str] | None, room: int) -> str:
    """For a video run that does not fit: the longest video (a `length` of 1 + 4k frames, what
    the video VAEs make whole latent frames of) that fits in `room` under the same precision, as
    a clause to add to the refusal (with the `--set` that asks for it); "" for a run with no
    video latent node or whose estimate fails. Video latents are made by the nodes with `width`,
    `height` and `length` widgets (`_is_video_source`); each gets at most the suggested length.
    The estimate grows with the frames, so a binary search over the latent frame count finds it
    in a few estimates."""
    lengths = {nid: int(c.inputs["length"]) for nid, c in wf.prompt.items()
               if (order is None or nid in order) and _is_video_source(c.inputs)}
    if not lengths:
        return ""
    import dataclasses

    def shortened(n: int) -> Workflow:
        prompt = dict(wf.prompt)
        for nid, length in lengths.items():
            if length > n:
                prompt[nid] = dataclasses.replace(prompt[nid], inputs={**prompt[nid].inputs, "length": n})
        return dataclasses.replace(wf, prompt=prompt)

    peaks: dict[int, int] = {}

    def fits(k: int) -> bool:  # whether 1 + 4k frames fit
        if k not in peaks:
            peaks[k] = estimate(shortened(TIME_DOWNSCALE * k + 1), registry, env, precision,
                                order=order)["peak_bytes"]
        return peaks[k] <= room

    lo, hi = 0, _latent_frames(max(lengths.values())) - 1     # k of 1 + 4k frames; hi does not fit
    if hi <= 0:
        return ""
    try:
        if not fits(0):
            return "; not even one frame fits at this size"
        while hi - lo > 1:                      # fits(lo), not fits(hi)
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    except (PrecisionError, ValueError, OSError):
        return ""
    n = TIME_DOWNSCALE * lo + 1
    sets = " ".join(f"--set {nid}.length={n}" for nid, length in lengths.items() if length > n)
    return f"; or a shorter video under this precision: length {n} would fit ({_gib(peaks[lo])}: {sets})"


def _run_budget() -> Any:
    """The CPU memory budget in force (models are materialized, and stream, on the CPU)."""
    from mixgraph.nodes.models import memory_budget
    return memory_budget.budget("cpu")


@functools.lru_cache(maxsize=256)
def _stream_units(socket: str, handle: Any, storage: torch.dtype) -> tuple:
    """Per module the handle materializes: (units that can stream, bytes of the rest), from
    shapes on the meta device (``streaming.units_of``)."""
    from mixgraph.nodes.weights import store, streaming

    out = []
    for build, _source in _modules(socket, handle):
        with torch.device("meta"):
            module = build()
        out.append(streaming.units_of(module, store.dtype_rule(module), storage))
    return tuple(out)


def _streamed_parts(socket: str, handle: Any, pkey: tuple, budget: Any) -> tuple[tuple, bool]:
    """`_weight_parts` as the weight store will hold them under `budget`: a module whose weights
    do not fit (``streaming.choose``) counted at its streamed footprint (resident part + the
    block held at once). Unit sizes are scaled to `_weight_parts`' total (a GGUF file's blocks,
    keep-f32 parts). Returns (parts, whether any streams)."""
    from mixgraph.nodes.weights import streaming

    parts = _weight_parts(socket, handle, pkey)
    if budget is None or pkey[4]:   # int8 weights do not stream (refused at run time)
        return parts, False
    out, any_streamed = [], False
    allowance = streaming.weights_allowance(budget)
    for (p_held, use, counted), (units, fixed) in zip(parts, _stream_units(socket, handle, pkey[0])):
        dense = fixed + sum(u.nbytes for u in units)
        ratio = p_held / dense if dense else 1.0
        scaled = [streaming.Unit(u.name, (), int(u.nbytes * ratio)) for u in units]
        rest = p_held - sum(u.nbytes for u in scaled)
        streamed = streaming.choose(scaled, rest, allowance, budget.mode)
        if streamed:
            held_now = streaming.footprint(scaled, rest, streamed)
            out.append((held_now, use, counted - p_held + held_now))
            any_streamed = True
        else:
            out.append((p_held, use, counted))
    return tuple(out), any_streamed


def _budget_refusal(wf: Workflow, registry: Any, env: Any, precision: str | None,
                    order: Sequence[str] | None, est: dict, budget: Any, room: int) -> str:
    """The refusal of a run that fits the machine but not the memory budget even streamed,
    naming the smallest whole-GiB budget it would run in (within the machine's room)."""

    need = f"this run needs about {_gib(est['peak_bytes'] - BASE_BYTES)}"
    node = est["peak_node"]
    where = f" at node {node} ({wf.prompt[node].class_type})" if node else ""
    head = (f"not enough memory: {need}{where} even with model blocks streamed, over the memory "
            f"budget of {_gib(budget.nbytes)} ({budget.origin})")
    gib = _fitting_budget(wf, registry, env, precision, order, budget, room)
    length = _length_hint(wf, registry, env, precision, order, min(room, BASE_BYTES + budget.nbytes))
    if gib is not None:
        return f"{head}; --memory-budget {gib} would fit{length}"
    return (f"{head}; no budget this machine can give fits: use a smaller size or batch, or another "
            f"precision{length}")


def _fitting_budget(wf: Workflow, registry: Any, env: Any, precision: str | None,
                    order: Sequence[str] | None, budget: Any, room: int) -> int | None:
    """The smallest whole number of GiB whose budget the run fits in, streaming what does not
    fit (its peak less the process within the budget, and within the machine's `room`); None
    when none does."""
    from mixgraph.nodes.models import memory_budget

    peaks: dict[int, int] = {}

    def peak(gib: int) -> int:
        if gib not in peaks:
            trial = memory_budget.Budget(budget.device, gib * memory_budget.GIB, "trial", budget.mode)
            peaks[gib] = estimate(wf, registry, env, precision, order=order, budget=trial)["peak_bytes"]
        return peaks[gib]

    def within(gib: int) -> bool:   # the run's peak (less the process) within a budget of `gib`
        return peak(gib) - BASE_BYTES <= gib * memory_budget.GIB

    # A larger budget keeps more blocks resident but never more than its own allowance, so once
    # a budget holds the run every larger one does: a binary search (a few estimates, not one
    # per GiB), then the machine's room decides.
    top = int(room // memory_budget.GIB) + 1
    try:
        if not within(top):
            return None
        lo, hi = 0, top                 # within(hi); a budget of 0 holds nothing
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if within(mid) else (mid, hi)
        return hi if peak(hi) <= room else None
    except (PrecisionError, ValueError, OSError):
        return None


def _upper_bound(wf: Workflow, registry: Any, env: Any, order: Sequence[str] | None = None) -> float:
    """A quick bound above the estimate, from file sizes and pixel counts only: every model file
    held 4 times over (an fp8 file computing in f32) and 16 KiB per pixel of the largest
    latent or image (the traced peaks are below 4 KiB per pixel for SD1.5/SDXL VAEs and UNets).
    `order`: the nodes that will run (the valid ones); None: all."""
    from mixgraph.nodes.helpers import folders

    graph = _Graph(wf, registry, env)
    files = 0
    pixels = DEFAULT_SIDE * DEFAULT_SIDE
    for nid in (wf.prompt if order is None else order):
        call = wf.prompt[nid]
        if call.class_type in _LOADERS and _names_a_file(call):
            folder, names, _ = _LOADERS[call.class_type]
            for n in names:
                try:
                    path = folders.resolve(env, folder, call.inputs[n])
                    files += sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) \
                        if path.is_dir() else path.stat().st_size
                except (KeyError, ValueError, OSError, TypeError):
                    return float("inf")
        for name, value in call.inputs.items():
            if isinstance(value, Link) and graph.input_type(nid, name) in ("LATENT", "IMAGE"):
                b, h, w, _ = graph.size(value)
                pixels = max(pixels, b * h * w * (graph.frames(value) or 1))
    return BASE_BYTES + 4 * files + 16384 * 2 * pixels


def _gib(n: float) -> str:
    if abs(n) < 2**30 / 10:     # small budgets and runs: MiB, so two sizes never read alike
        return f"{n / 2**20:.1f} MiB"
    return f"{n / 2**30:.2f} GiB"


def format_estimate(est: dict, presets: dict[str, int] | None, available: int | None) -> str:
    """The human table of `mixgraph estimate`."""
    lines = [f"{'node':>6}  {'class':<24} {'weights+':>10} {'activations':>12} {'peak':>10}  policy"]
    for nid, e in est["nodes"].items():
        if not (e["weights_bytes"] or e["activation_bytes"]):
            continue
        pol = ", ".join(f"{k}={v}" for k, v in e.get("policy", {}).items())
        note = f"  ({e['assumed']})" if "assumed" in e else ""
        lines.append(f"{nid:>6}  {e['class_type'][:24]:<24} {_gib(e['weights_bytes']):>10} "
                     f"{_gib(e['activation_bytes']):>12} {_gib(e['peak_bytes']):>10}  {pol}{note}")
    lines.append(f"peak: {_gib(est['peak_bytes'])} (weights {_gib(est['weights_bytes'])}, "
                 f"process {_gib(est['base_bytes'])}) under {est['precision']}")
    if presets:
        lines.append("presets: " + ", ".join(f"{p} {_gib(b)}" for p, b in presets.items()))
    if available is not None:
        lines.append(f"available: {_gib(available)}")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# the size guard: one tensor alone over the budget, found from the graph in milliseconds

#: latent channels of the nodes that make a latent from a size (others: 4, an SD latent)
_LATENT_CHANNELS = {"EmptySD3LatentImage": 16, "EmptyHunyuanLatentVideo": 16}
#: nodes that take a VIDEO without decoding its frames (a file is copied packet by packet)
_VIDEO_KEEPERS = ("SaveVideo", "PreviewVideo")


def size_refusal(wf: Workflow, registry: Any, env: Any, order: Sequence[str] | None = None) -> str | None:
    """A message when one LATENT or IMAGE a node makes, or one video a node decodes, is alone
    over the memory budget (`nodes/models/memory_budget.py`), else None. From the sizes the graph
    states (`_Graph.size`: node inputs, image headers, scale factors, batches) and video headers,
    without tracing: it runs before the estimate, which would take a minute to trace an absurd
    size only to refuse it. Sizes stated by a node (EmptyLatentImage, EmptyImage, the video
    latents) and the ones that grow along links (ImageScaleBy, RepeatImageBatch, VAEDecode of a
    big latent) alike; LoadVideo's frames where a node decodes them. (LoadImage's file is
    refused by the node's own validation; the helpers that allocate check again when they run,
    for a size that comes through a link this cannot follow.)"""
    from mixgraph.nodes.media import memory_guards

    graph = _Graph(wf, registry, env)
    for nid in (wf.prompt if order is None else order):
        call = wf.prompt[nid]
        spec = registry.get(call.class_type)
        outs = getattr(spec, "outputs", None) or ()
        try:
            for slot, out in enumerate(outs):
                kind = getattr(out, "type", out)
                if kind not in ("LATENT", "IMAGE"):
                    continue
                link = Link(nid, slot)
                b, h, w, assumed = graph.size(link)
                if assumed:
                    continue
                if kind == "IMAGE":
                    shape = (b, h, w, 3)
                else:
                    frames = graph.frames(link)
                    channels = _LATENT_CHANNELS.get(call.class_type, 16 if _is_video_source(call.inputs) else 4)
                    shape = (b, channels, *(() if frames is None else (_latent_frames(frames),)), h // 8, w // 8)
                problem = memory_guards.over_budget(
                    memory_guards.tensor_bytes(shape), f"node {nid} ({call.class_type}) output {kind}",
                    f"a float32 tensor {list(shape)}")
                if problem:
                    return f"not enough memory: {problem}"
            problem = _video_refusal(wf, graph, nid, call)
        except (ValueError, OSError, KeyError, TypeError):
            continue    # what cannot be followed is the estimate's and the run's to say
        if problem:
            return f"not enough memory: {problem}"
    return None


def _video_refusal(wf: Workflow, graph: _Graph, nid: str, call: Any) -> str | None:
    """A node that decodes a LoadVideo's file (GetVideoComponents, Video Slice, ...): the frames
    from the file's header against the budget."""
    if call.class_type in _VIDEO_KEEPERS:
        return None
    from mixgraph.nodes.helpers.video.files import video_path
    from mixgraph.nodes.media import memory_guards, video_codec

    for name, value in call.inputs.items():
        if not (isinstance(value, Link) and graph.input_type(nid, name) == "VIDEO"):
            continue
        up = wf.prompt.get(value.node_id)
        if up is None or up.class_type != "LoadVideo" or not isinstance(up.inputs.get("file"), str):
            continue
        file = up.inputs["file"]
        try:
            info = video_codec.probe(video_path(graph.env, file), f"LoadVideo file {file!r}")
        except video_codec.VideoFileError:
            continue    # LoadVideo says what is wrong with the file when it runs
        problem = memory_guards.video_problem(info.width, info.height, info.frames,
                                              f"node {nid} ({call.class_type}) decoding LoadVideo "
                                              f"{value.node_id}'s file {file!r}")
        if problem:
            return problem
    return None


class InsufficientMemory(WorkflowError):
    """A prompt refused at validation because its estimated peak memory exceeds what is
    available; the message names the estimate and a preset that would fit."""

    error_type = "insufficient_memory"


def memory_section(wf: Workflow, registry: Any, env: Any, precision: str | None = None,
                   order: Sequence[str] | None = None) -> dict:
    """The estimate as `validate --json` and `POST /mixgraph/estimate` give it: `peak_bytes`
    at the top, per-node figures, each preset's peak and the available memory; an estimate that
    cannot be made is `{"error": ...}`."""
    problem = size_refusal(wf, registry, env, order)
    if problem:     # a tensor alone over the budget: answered without tracing anything
        return {"error": problem}
    try:
        est = estimate(wf, registry, env, precision, order=order)
        presets = estimate_presets(wf, registry, env, order=order)
    except (PrecisionError, ValueError, OSError) as e:
        return {"error": str(e)}
    available = available_bytes(env.device or "cpu")
    return {**est, "presets": presets, "available_bytes": available,
            "fits": None if available is None else est["peak_bytes"] <= available + BASE_BYTES}


def system_section(device: str = "cpu") -> dict:
    """`mixgraph nodes --system`: memory and what the device computes natively (the same
    `precision` section `/system_stats` gives each device)."""
    from mixgraph.graph.precision import hardware_section

    import sys
    return {"system": {"python_version": sys.version, "pytorch_version": torch.__version__,
                       "available_bytes": available_bytes(device)},
            "memory_budget": budget_section(device),
            "devices": [{"name": device, "mixgraph_precision": hardware_section(device)}]}


def budget_section(device: str = "cpu") -> dict:
    """The memory budget in force for `device` and where it comes from (`nodes --system`)."""
    from mixgraph.nodes.models import memory_budget
    b = memory_budget.budget(device)
    return {"device": b.device, "bytes": b.nbytes, "gib": round(b.gib, 2), "origin": b.origin, "mode": b.mode}


def cli_main(args: Any, registry: Any) -> int:
    """`mixgraph estimate WF.json [--precision SPEC] [--set ...] [--json]`: exit 0 when the run
    fits, 1 when it does not, 2 for a workflow or argument that is not valid."""
    import json
    import sys

    from mixgraph.graph.env import Env, check_device
    from mixgraph.graph.validate import format_problems
    from mixgraph.ui.api import set_inputs, validate_file

    problem = check_device(args.device)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    env = Env.from_args(models=args.models, input=args.input, device=args.device)
    try:
        parse_precision_arg(args.precision, env.device or "cpu")
        wf, v = validate_file(args.workflow, registry, env)
        if args.set:
            from mixgraph.graph.validate import validate
            wf = set_inputs(wf, args.set)
            v = validate(wf.prompt, registry, env)
    except (WorkflowError, PrecisionError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not v.clean:
        print(f"invalid workflow {args.workflow}:\n{format_problems(v)}", file=sys.stderr)
        return 2
    section = memory_section(wf, registry, env, args.precision, order=v.order)
    if "error" in section:
        print(f"error: {section['error']}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(section, indent=1, default=str))
    else:
        print(format_estimate(section, section["presets"], section["available_bytes"]))
    return 0 if section["fits"] is not False else 1
