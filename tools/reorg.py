#!/usr/bin/env python3
"""Sort mixgraph's folders by concept (issue 21, "Folders sorted by concept"; DESIGN §1, §11).

Run from the repository root, on a checkout whose other changes are committed:

    python tools/reorg.py            # move, rewrite, print a summary
    python tools/reorg.py --dry-run  # print what would move; change nothing

What it does, in order:

1. ``git mv`` every file of ``MOVES`` that exists (a folder entry moves every file under it),
   creating each destination package's ``__init__.py`` (``PACKAGES``: a one-line docstring saying
   what the folder holds). A source that is missing is reported and skipped; a source already at
   its destination is counted as done.
2. Rewrites every reference to a moved module or file in every text file of the repository (git's
   tracked and untracked-but-not-ignored files, this script and docs/layout-map.md excepted):
   ``mixgraph.nodes.models.unet`` and the shorter ``nodes.models.unet`` / ``models.unet`` forms
   (imports, ``importlib``/``-m``/monkeypatch/logger strings, prose), ``from P import a, b`` where a
   or b moved (split per new package), relative imports whose target moved (made absolute), and
   file paths (``nodes/models/unet.py``, ``models/unet.py``, ``"ui" / "web"`` joins).
3. Regenerates pyproject.toml's ``[tool.setuptools] packages`` from the folders and its
   ``package-data`` from ``PACKAGE_DATA`` (checked first: every data file the old entries packed
   must still be packed), regroups nodes/library.py's imports by package, applies ``PATCHES``
   (the few code lines that locate files by depth) and writes docs/layout-map.md.

Running it twice changes nothing the second time: a rule rewrites only old names, and no new name
contains an old one (checked at start). Merged code that still says the old names can be fixed by
running it again. The one old module that becomes a package, ``mixgraph.ui.server`` (now
``ui/server/server.py`` in package ``ui/server/``), is told apart by what follows it: a submodule
of the new package (``mixgraph.ui.server.ws``) is new, anything else (``mixgraph.ui.server
import create_app``, ``mixgraph.ui.server.serve``) is the old module.

Files in nodes/ or ui/ that ``MOVES`` does not name stay where they are and are listed at the end:
add a line to ``MOVES`` and run again.
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

# ------------------------------------------------------------------------------------------------
# The mapping: old path -> new path, relative to the repository root. A module's concept is what it
# is about (not where ComfyUI keeps the same code). Folder entries move everything under them.
# ------------------------------------------------------------------------------------------------

_D = "nodes/declare"


def _group(dest: str, names: str, src: str = "nodes") -> list[tuple[str, str]]:
    return [(f"{src}/{n}", f"{dest}/{n}") for n in names.split()]


MOVES: list[tuple[str, str]] = [
    # --- runtime: the SD family folder (the LDM UNet, its forward patches, its variants' models)
    *_group("nodes/families/sd", "unet.py unet_patches.py lotus.py x4_upscaler.py zero123.py "
                                 "unclip.py sdpose.py", "nodes/models"),
    ("nodes/models/data/lotus_null_prompt.safetensors", "nodes/families/sd/data/lotus_null_prompt.safetensors"),
    ("nodes/models/data/NOTICE-lotus-null-prompt.txt", "nodes/families/sd/data/NOTICE-lotus-null-prompt.txt"),
    # the refusal table of the families mixgraph does not run (not a family folder: shared)
    ("nodes/models/families.py", "nodes/families/refused.py"),
    # --- runtime: text encoders, tokenizers, CLIP vision (and the CLIP BPE vocabulary)
    *_group("nodes/encoders", "clip.py tokenizer.py text_encode.py clip_vision.py clip_vision_handle.py "
                              "encoder_set.py", "nodes/models"),
    ("nodes/models/data/bpe_simple_vocab_16e6.txt.gz", "nodes/encoders/data/bpe_simple_vocab_16e6.txt.gz"),
    ("nodes/models/data/LICENSE-clip-vocab.txt", "nodes/encoders/data/LICENSE-clip-vocab.txt"),
    # --- runtime: autoencoders and the latent formats between a VAE's and a model's latent space
    *_group("nodes/vae", "vae.py taesd.py latent_format.py", "nodes/models"),
    # --- runtime: what adapts a diffusion model without being one
    *_group("nodes/adapters", "lora.py lora_keys.py lora_bypass.py lora_extract.py controlnet.py "
                              "controlnet_union.py control_lora.py t2i_adapter.py gligen.py "
                              "style_model.py photomaker.py hypernetwork.py supir.py", "nodes/models"),
    # --- runtime: weight files in and out, the weight store, key layouts, storage precision, merges
    *_group("nodes/weights", "safetensors_io.py store.py layouts.py diffusers_names.py save.py "
                             "synthetic.py latent_file.py cond_file.py cast.py merge.py", "nodes/models"),
    # --- runtime: pixel-space models (upscalers, background removal)
    *_group("nodes/image_models", "esrgan.py upscale.py birefnet.py swin.py deform_conv.py", "nodes/models"),
    # --- node declarations, one folder per concept (nodes/library.py imports them all)
    *_group(f"{_D}/loaders", "loading.py extra_loader_nodes.py lora_stack_nodes.py lora_bypass_nodes.py "
                             "save_nodes.py multigpu_nodes.py"),
    *_group(f"{_D}/conditioning", "conditioning.py conditioning_extra_nodes.py cond_nodes.py "
                                  "clip_vision_nodes.py gligen_nodes.py ip2p_nodes.py controlnet_extra_nodes.py "
                                  "photomaker_nodes.py stable3d_nodes.py camera_angle_nodes.py "
                                  "upscale_diffusion_nodes.py lotus_nodes.py hook_nodes.py"),
    *_group(f"{_D}/sampling", "sampling_nodes.py custom_sampling_nodes.py sampler_extra_nodes.py"),
    *_group(f"{_D}/model_patches", "model_patch_nodes.py guidance_extra_nodes.py deep_shrink_nodes.py "
                                   "speed_patch_nodes.py token_patch_nodes.py attention_backend_nodes.py "
                                   "seamless_tiling_nodes.py context_window_nodes.py merge_nodes.py "
                                   "precision_nodes.py supir_nodes.py"),
    *_group(f"{_D}/latent", "latent_nodes.py latent_extra_nodes.py latent_io_nodes.py rebatch_nodes.py"),
    *_group(f"{_D}/image", "image_nodes.py image_extra_nodes.py image_filter_nodes.py mask_nodes.py "
                           "crop_nodes.py resize_nodes.py save_image_nodes.py color_transfer_nodes.py "
                           "batch_nodes.py tile_nodes.py text_overlay_nodes.py webcam_nodes.py "
                           "upscale_nodes.py bg_removal_nodes.py sdpose_nodes.py"),
    *_group(f"{_D}/logic", "logic_nodes.py loop_nodes.py primitive_nodes.py preview_any_nodes.py"),
    # --- node helpers: plain functions and tables the declarations call (nodes/library.py stays)
    *_group("nodes/helpers", "folders.py model_files.py persistable.py precision.py previews.py "
                             "device_options.py embeddings.py expression.py imaging.py image_codecs.py "
                             "image_ops.py image_filters.py image_save.py image_animation.py crop_ops.py "
                             "resize_ops.py mask_ops.py batch_ops.py rebatch_ops.py latent_ops.py "
                             "cond_ops.py hook_ops.py text_ops.py text_overlay.py color_transfer.py "
                             "pose_draw.py sdpose_ops.py sdpose_extract.py"),
    # --- the engine: workflow file formats (graph/ held 30 modules, one concept of five files)
    *_group("graph/formats", "workflow.py ui_format.py ui_graph.py ui_export.py ui_subgraph.py", "graph"),
    # --- ui: the server (and the editor extension it serves), ComfyUI compatibility, Ray, benchmarks.
    # ui/ keeps the CLI, the Python API, the demo, the memory estimate and terminal progress.
    *_group("ui/server", "server.py ws.py frontend.py editor.py files.py security.py queue.py jobs.py "
                         "jobstore.py templates.py", "ui"),
    ("ui/web", "ui/server/web"),
    *_group("ui/comfy", "comfy_adapter.py comfy_flags.py comfy_payloads.py comfy_runtime.py custom_nodes.py "
                        "client_messages.py", "ui"),
    ("ui/comfy_host", "ui/comfy/comfy_host"),
    *_group("ui/ray", "ray_pool.py ray_fanout.py ray_worker.py", "ui"),
    *_group("ui/bench", "bench_engine.py bench_precision.py", "ui"),
]

#: What stays where it is (the summary lists any other module left in nodes/, nodes/models/, ui/).
STAYS = ("nodes/__init__.py", "nodes/library.py",            # the one registration list
         "nodes/socket_types.py",                             # and the library's socket types
         *(f"nodes/models/{n}.py" for n in "__init__ handles loader attention hooks compile resize seamless "
                                           "token_patches shapes".split()),   # and data/models/
         "ui/__init__.py", "ui/cli.py", "ui/api.py", "ui/demo.py", "ui/estimate.py", "ui/progress.py")

#: Package docstrings: written into a package's ``__init__.py`` when it is missing or empty.
PACKAGES: dict[str, str] = {
    "graph/formats": "Workflow files: the accepted formats (API, envelope, ComfyUI UI-format) read into "
                     "graph.prompt's types, UI-format export and subgraph expansion.",
    "nodes/families/sd": "SD 1.x / 2.x / SDXL: the LDM UNet, its forward patches and the model files of its "
                         "variants (x4 upscaler, Zero123, unCLIP, Lotus, SDPose).",
    "nodes/encoders": "Text encoders, their tokenizers and CLIP vision (plain PyTorch; data/ holds the "
                      "CLIP BPE vocabulary).",
    "nodes/vae": "Autoencoders between pixels and latents (the KL VAE, TAESD) and the latent formats "
                 "that relate a VAE's latent to a model's.",
    "nodes/adapters": "What adapts a diffusion model without being one: LoRA (merged and bypass), "
                      "ControlNets, T2I-Adapters, GLIGEN, style models, PhotoMaker, hypernetworks, SUPIR.",
    "nodes/weights": "Weight files and the weight store: reading, key layouts, the process-wide store, "
                     "storage precision (cast), merges, and writing models, latents and conditionings.",
    "nodes/image_models": "Pixel-space models: ESRGAN-family upscalers and BiRefNet background removal.",
    "nodes/models": "Model handles and the loader that makes them, and what every family shares: "
                    "attention, resize, model-call patches, weight hooks, the embedded model.",
    "nodes/declare": "Node declarations, one folder per concept; nodes/library.py imports every module.",
    "nodes/declare/loaders": "Nodes that load, save and place model files: checkpoints, diffusion models, "
                             "text encoders, VAEs, LoRAs, ControlNets.",
    "nodes/declare/conditioning": "Conditioning nodes: text encoding, areas and masks, ControlNets, "
                                  "image and vision conditionings, weight hooks.",
    "nodes/declare/sampling": "Sampler nodes: KSampler and the custom-sampling group (samplers, sigmas, "
                              "guiders, noise).",
    "nodes/declare/model_patches": "Nodes that return a patched MODEL: guidance, attention, speed and "
                                   "context-window patches, merges, precision pins, SUPIR.",
    "nodes/declare/latent": "LATENT nodes: empty latents, batches, composites, transforms, latent files.",
    "nodes/declare/image": "IMAGE and MASK nodes: load, save, transform, filter, crop, upscale, "
                           "pose and background removal.",
    "nodes/declare/logic": "Value and control-flow nodes: primitives, switches, loops, preview as text.",
    "nodes/helpers": "Plain functions and tables behind the node declarations: model folders, "
                     "image/mask/latent/text operations, file codecs, precision and previews.",
    "ui": "Every way a person uses mixgraph: the CLI, the Python API, the demo and the memory estimate "
          "here; the server, ComfyUI compatibility, Ray and benchmarks in subpackages.",
    "ui/server": "The HTTP/WebSocket server: ComfyUI's API, the web editor and our extension (web/), "
                 "the prompt queue and the job store.",
    "ui/comfy": "ComfyUI compatibility: custom node packs, the host modules they import (comfy_host/, "
                "package data), ComfyUI's server flags and payloads.",
    "ui/ray": "Scale-out on Ray: the worker pool behind `mixgraph serve --ray`, its workers, fan-out.",
    "ui/bench": "`mixgraph bench`: the engine-overhead and precision benchmarks.",
}

#: pyproject.toml's [tool.setuptools.package-data], whole. Checked before anything moves: every
#: file the old entries packed must be packed by these.
PACKAGE_DATA = '''[tool.setuptools.package-data]
"mixgraph.nodes.encoders" = ["data/*"]      # the CLIP BPE vocabulary and its licence
"mixgraph.nodes.families.sd" = ["data/*"]   # Lotus' null-prompt embedding and its notice
"mixgraph.nodes.models" = ["data/models/*/*"]   # the embedded model and what was made for it
"mixgraph.ui.server" = ["web/*.js"]
# the ComfyUI host modules custom node packs import (folder_paths, comfy, server...): package
# data, put on sys.path only while packs load and run, never installed as top-level packages
"mixgraph.ui.comfy" = ["comfy_host/*.py", "comfy_host/**/*.py"]
'''

#: Text no rule can rewrite: code that finds files by its own depth, prose that names a folder, the
#: guard that keeps the folder-size test off until the move. (file after the move, old, new)
PATCHES: list[tuple[str, str, str]] = [
    ("ui/server/templates.py", 'Path(__file__).resolve().parents[1] / "workflows"',
     'Path(__file__).resolve().parents[2] / "workflows"'),
    ("nodes/__init__.py",
     '"""The node library (declarations) and the model runtime they call (mixgraph.nodes.models and\n'
     'mixgraph.nodes.sampling), with the edge payloads both use (mixgraph.nodes.payloads).\n',
     '"""The node library and the model runtime it calls, one folder per concept.\n\n'
     'Declarations: `declare/` (one subfolder per concept; `library.py` lists every module) and the\n'
     'plain functions they call, `helpers/`. Runtime (plain PyTorch, no import of graph/ or ui/):\n'
     '`families/` (the family seam and one folder per model family), `encoders/`, `vae/`, `adapters/`,\n'
     '`weights/`, `image_models/`, `models/` (handles, the loader, shared layers), `sampling/`, and the\n'
     'edge payloads both sides use, `payloads/`.\n'),
    ("nodes/families/sd/family.py", "files live in ``nodes/models`` (", "files live beside this one ("),
    ("tests/test_architecture.py",
     '@pytest.mark.skipif(not (ROOT / "nodes" / "declare").is_dir(), reason="the folders are sorted by '
     'tools/reorg.py")\n', ''),
]

#: Moved modules that build paths from ``__file__``, read and found right: their data travels with
#: them (data/, web/, comfy_host/ beside them) or PATCHES fixes the depth. Any other is reported.
FILE_USERS_CHECKED = ("nodes/families/sd/lotus.py", "nodes/encoders/tokenizer.py", "ui/server/server.py",
                      "ui/server/templates.py", "ui/comfy/comfy_runtime.py", "ui/comfy/custom_nodes.py")

#: Modules whose imports are regrouped by package after the rewrite (the one registration list).
REGROUP = ("nodes/library.py",)

#: Source folders and the import names they install as (pyproject.toml's package-dir).
ROOTS = {"mixgraph": "mixgraph", "graph": "mixgraph.graph", "nodes": "mixgraph.nodes", "ui": "mixgraph.ui"}
LAYOUT_MAP = "docs/layout-map.md"
SELF = "tools/reorg.py"
WRAP = 110

# ------------------------------------------------------------------------------------------------


def module_of(path: str) -> str | None:
    """The import name of a .py file (or a folder) under one of ROOTS, else None."""
    p = PurePosixPath(path)
    if not p.parts or p.parts[0] not in ROOTS:
        return None
    parts = list(p.parts[1:])
    if p.suffix == ".py":
        parts[-1] = p.stem
        if parts[-1] == "__init__":
            parts.pop()
    elif p.suffix:
        return None
    return ".".join([ROOTS[p.parts[0]], *parts])


def git(*args: str, check: bool = True) -> str:
    return subprocess.run(["git", *args], check=check, capture_output=True, text=True).stdout


def repo_files() -> list[str]:
    """Tracked files plus untracked files git does not ignore."""
    out = git("ls-files", "-z", "--cached", "--others", "--exclude-standard")
    return sorted({f for f in out.split("\0") if f and Path(f).is_file()})


def tracked(path: str) -> bool:
    return bool(git("ls-files", "--", path).strip())


@dataclass
class Plan:
    moves: list[tuple[str, str]] = field(default_factory=list)     # file moves to do now
    done: list[tuple[str, str]] = field(default_factory=list)      # table entries already at their place
    missing: list[str] = field(default_factory=list)               # sources that exist nowhere
    table: list[tuple[str, str]] = field(default_factory=list)     # table entries present after the run


def plan_moves(files: list[str]) -> Plan:
    plan = Plan()
    fileset = set(files)
    for old, new in MOVES:
        under = [f for f in files if f.startswith(old + "/")]
        if old in fileset:
            pairs = [(old, new)]
        elif under:
            pairs = [(f, new + f[len(old):]) for f in under]
        elif new in fileset or any(f.startswith(new + "/") for f in files):
            plan.done.append((old, new))
            plan.table.append((old, new))
            continue
        else:
            plan.missing.append(old)
            continue
        for src, dst in pairs:
            if Path(dst).exists():
                sys.exit(f"reorg: cannot move {src} to {dst}: {dst} exists already (a file of the "
                         f"same name was added there); resolve by hand, then run again")
        plan.moves += pairs
        plan.table.append((old, new))
    return plan


# --- rewrite rules -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Rules:
    modules: dict[str, str]          # old module name -> new (full, mixgraph.*)
    short: dict[str, str]            # old nodes-relative name under nodes.models -> new nodes-relative
    paths: dict[str, str]            # old repo path (file or folder) -> new
    short_paths: dict[str, str]      # old nodes-relative path (models/x.py) -> new nodes-relative
    ambiguous: dict[str, set[str]]   # old module that is a new package -> that package's children
    full_re: re.Pattern              # mixgraph.nodes.models.unet, nodes.models.unet, ui.server, ...
    short_re: re.Pattern             # models.unet (nodes-relative, in prose)
    path_re: re.Pattern              # nodes/models/unet.py, ui/web, ...
    short_path_re: re.Pattern        # models/unet.py (nodes-relative, in prose)


def _alternation(names) -> str:
    names = sorted(names, key=len, reverse=True)
    return "|".join(re.escape(n) for n in names) if names else "(?!x)x"    # nothing: match nothing


def build_rules(files: list[str]) -> Rules:
    modules, short, paths, short_paths = {}, {}, {}, {}
    for old, new in MOVES:
        paths[old] = new
        if old.startswith("nodes/models/") and new.startswith("nodes/"):
            short_paths[old[len("nodes/"):]] = new[len("nodes/"):]
        if old.endswith(".py"):
            mo, mn = module_of(old), module_of(new)
            if mo and mn:
                modules[mo] = mn
                if mo.startswith("mixgraph.nodes.models."):
                    short[mo[len("mixgraph.nodes."):]] = mn[len("mixgraph.nodes."):]
    new_packages = {module_of(str(PurePosixPath(n).parent)) for n in modules.values()}
    new_packages |= {module_of(p) for p in PACKAGES}
    ambiguous: dict[str, set[str]] = {}
    for mo in modules:
        if mo in modules.values():
            sys.exit(f"reorg: {mo} is both an old and a new module name; the table cannot swap names")
        if mo in new_packages:      # ui/server.py -> ui/server/server.py: told apart by what follows
            folder = _package_dir(mo)
            kids = {mn.rpartition(".")[2] for mn in modules.values() if mn.rpartition(".")[0] == mo}
            kids |= {PurePosixPath(p).relative_to(folder).parts[0].removesuffix(".py")
                     for p in [*files, *paths.values()] if p.startswith(folder + "/")}
            ambiguous[mo] = kids
    unprefixed = [m[len("mixgraph."):] for m in modules]
    return Rules(
        modules, short, paths, short_paths, ambiguous,
        full_re=re.compile(rf"(?<![\w.])(?:mixgraph\.)?(?P<name>{_alternation(unprefixed)})(?!\w)"),
        short_re=re.compile(rf"(?<![\w.])(?P<name>{_alternation(short)})(?!\w)"),
        path_re=re.compile(rf"(?<![\w.-])(?P<name>{_alternation(paths)})(?![\w-])"),
        short_path_re=re.compile(rf"(?<![\w./-])(?P<name>{_alternation(short_paths)})(?![\w-])"))


def _ambiguous_old(rules: Rules, name: str, text: str, end: int) -> bool:
    """For an old module that is now a package: whether this occurrence means the old module."""
    kids = rules.ambiguous[name]
    m = re.match(r"\.(\w+)", text[end:])
    if m and m.group(1) in kids:
        return False                       # mixgraph.ui.server.ws: the new package's submodule
    if re.match(r"\s+import\b", text[end:]):
        return False                       # `from mixgraph.ui.server import`: left to rewrite_from
    return True


def rewrite_dotted(rules: Rules, text: str) -> str:
    def full(m: re.Match) -> str:
        old = "mixgraph." + m.group("name")
        if old in rules.ambiguous and not _ambiguous_old(rules, old, m.string, m.end()):
            return m.group(0)
        new = rules.modules[old]
        return m.group(0)[: m.start("name") - m.start()] + new[len("mixgraph."):]

    text = rules.full_re.sub(full, text)
    return rules.short_re.sub(lambda m: rules.short[m.group("name")], text)


def rewrite_paths(rules: Rules, text: str, python: bool) -> str:
    text = rules.path_re.sub(lambda m: rules.paths[m.group("name")], text)
    text = rules.short_path_re.sub(lambda m: rules.short_paths[m.group("name")], text)
    if python:   # "nodes" / "models" / "data" / ... joins
        def join(m: re.Match) -> str:
            q = m.group("q")
            segs = re.findall(rf"{q}([\w.-]+){q}", m.group(0))
            joined = "/".join(segs)
            new = rules.path_re.sub(lambda n: rules.paths[n.group("name")], joined)
            if new == joined:
                return m.group(0)
            return " / ".join(f"{q}{s}{q}" for s in new.split("/"))
        text = re.sub(r"""(?P<q>["'])[\w.-]+(?P=q)(?:\s*/\s*(?P=q)[\w.-]+(?P=q))+""", join, text)
    return text


# --- from-imports --------------------------------------------------------------------------------

_NAME = r"\w+(?:[ \t]+as[ \t]+\w+)?"
FROM_RE = re.compile(
    rf"(?P<lead>^[ \t]*|(?<![\w.]))from[ \t]+(?P<dots>\.*)(?P<mod>[\w.]*)[ \t]+import[ \t]+"
    rf"(?:\((?P<paren>[^)]*)\)|(?P<plain>{_NAME}(?:[ \t]*,[ \t]*{_NAME})*))"
    r"(?P<comment>[ \t]*#[^\n]*)?", re.M)


def _names(m: re.Match) -> tuple[list[tuple[str, str | None]], list[str]] | None:
    """((name, alias) ..., comments) of a from-import, or None if it cannot be read."""
    body, comments = m.group("paren") or m.group("plain") or "", []
    if m.group("paren") is not None:
        lines = []
        for line in body.split("\n"):
            code, _, comment = line.partition("#")
            lines.append(code)
            if comment.strip():
                comments.append("#" + comment.rstrip())
        body = " ".join(lines)
    out = []
    for item in body.split(","):
        item = item.strip()
        if not item:
            continue
        mm = re.fullmatch(r"(\w+)(?:\s+as\s+(\w+))?", item)
        if not mm:
            return None
        out.append((mm.group(1), mm.group(2)))
    if m.group("paren") is not None and "#" in m.group("paren").split("\n")[-1]:
        return None                          # the ")" that ended the match sat in a comment
    if m.group("comment"):
        comments.append(m.group("comment").strip())
    return out, comments


def _emit(groups: list[tuple[str, list[tuple[str, str | None]]]], comments: list[str], indent: str,
          at_line_start: bool) -> str:
    comment = ("  " + "  ".join(dict.fromkeys(comments))) if comments else ""
    stmts = []
    for mod, names in groups:
        items = [n if a is None else f"{n} as {a}" for n, a in names]
        head = f"from {mod} import "
        one = head + ", ".join(items)
        if not at_line_start or len(indent + one + comment) <= WRAP:
            stmts.append(one + comment)
            continue
        lines, cur = [], indent + head + "("
        pad = " " * len(cur)
        for i, item in enumerate(items):
            piece = item + ("," if i < len(items) - 1 else ")")
            budget = WRAP - (len(comment) if not lines else 0)     # the comment rides on line one
            if not cur.endswith("(") and len(cur) + 1 + len(piece) > budget:
                lines.append(cur.rstrip())
                cur = pad + piece
            else:
                cur += ("" if cur.endswith("(") else " ") + piece
        lines.append(cur)
        lines[0] = lines[0] + comment if comment else lines[0]
        stmts.append("\n".join(lines)[len(indent):])
    return ("\n" + indent if at_line_start else "; ").join(stmts)


def _replace(m: re.Match, groups: list, comments: list[str]) -> str:
    """The statement(s) that replace from-import `m`: one per line at its indentation when it
    starts a line, else joined by "; " (an import quoted in prose)."""
    lead = m.group("lead") or ""
    at_line_start = m.start() == 0 or m.string[m.start() - 1] == "\n"
    return lead + _emit(groups, comments, lead, at_line_start)


def rewrite_from(rules: Rules, text: str) -> str:
    """Absolute ``from P import a, b``: names that are moved modules go to their new packages."""
    def one(m: re.Match) -> str:
        if m.group("dots") or not m.group("mod").startswith("mixgraph"):
            return m.group(0)
        mod = m.group("mod")
        parsed = _names(m)
        if parsed is None:
            return m.group(0)
        names, comments = parsed
        if mod in rules.ambiguous:
            kids = rules.ambiguous[mod]
            if all(n in kids for n, _ in names):
                return m.group(0)            # the new package's submodules
            base = rules.modules[mod]
            if any(n in kids for n, _ in names):
                print(f"reorg: warning: `{m.group(0).strip()}` mixes old and new names; left as is")
                return m.group(0)
            mod = base                        # names of the old module, now one level down
        elif mod in rules.modules:
            mod = rules.modules[mod]          # a moved module: the statement is rewrapped too
        groups: dict[str, list] = {}
        changed = mod != m.group("mod")
        for n, a in names:
            target = rules.modules.get(f"{mod}.{n}")
            if target:
                pkg, _, leaf = target.rpartition(".")
                changed = True
                if leaf != n and a is None:
                    a = n
                groups.setdefault(pkg, []).append((leaf, None if a == leaf else a))
            else:
                groups.setdefault(mod, []).append((n, a))
        if not changed:
            return m.group(0)
        return _replace(m, list(groups.items()), comments)

    return FROM_RE.sub(one, text)


# --- relative imports ------------------------------------------------------------------------------

def rewrite_relative(text: str, old_path: str, new_path: str, old_names: set[str],
                     file_map: dict[str, str]) -> str:
    """Relative imports of a module that moved, or whose targets moved: left as they are when they
    still name the same module from the new place, else made absolute."""
    old_mod, new_mod = module_of(old_path), module_of(new_path)
    if not old_mod or not new_mod:
        return text
    old_pkg = old_mod if old_path.endswith("__init__.py") else old_mod.rpartition(".")[0]
    new_pkg = new_mod if new_path.endswith("__init__.py") else new_mod.rpartition(".")[0]
    mod_map = {module_of(o): module_of(n) for o, n in file_map.items() if o.endswith(".py")}

    def resolve(pkg: str, level: int, mod: str) -> str:
        base = pkg.split(".")[: len(pkg.split(".")) - (level - 1)]
        return ".".join([*base, *([mod] if mod else [])])

    def mapped(name: str) -> str:
        return mod_map.get(name, name)

    def one(m: re.Match) -> str:
        if not m.group("dots"):
            return m.group(0)
        parsed = _names(m)
        if parsed is None:
            return m.group(0)
        names, comments = parsed
        level, mod = len(m.group("dots")), m.group("mod")
        base_old = resolve(old_pkg, level, mod)
        base_now = resolve(new_pkg, level, mod)
        groups: dict[str, list] = {}
        same = True
        for n, a in names:
            sub = f"{base_old}.{n}"
            if sub in old_names:              # `from . import x`: x is a module
                target = mapped(sub)
                same &= target == f"{base_now}.{n}"
                pkg, _, leaf = target.rpartition(".")
                groups.setdefault(pkg, []).append((leaf, a if a else (n if leaf != n else None)))
            else:
                target = mapped(base_old)
                same &= target == base_now
                groups.setdefault(target, []).append((n, a))
        if same:
            return m.group(0)
        return _replace(m, list(groups.items()), comments)

    return FROM_RE.sub(one, text)


# --- library.py: one registration list, grouped by package ------------------------------------------

def regroup_imports(text: str) -> str:
    """Module-level ``from mixgraph... import`` statements regrouped by package, both sorted;
    statements whose comment says more than ``noqa`` keep it on a line of their own, first if they
    came first. The registry does not depend on import order (each module registers its own nodes).
    """
    tree = ast.parse(text)
    stmts = [n for n in tree.body if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("mixgraph")
             and not n.level]
    if not stmts:
        return text
    lines = text.split("\n")
    if any(lines[s.lineno - 1][: s.col_offset].strip() for s in stmts):
        return text
    groups: dict[str, list[tuple[str, str | None]]] = {}
    special: list[tuple[str, str, str | None, str]] = []
    leading = 0                      # specials before any plain import stay first ("first: ...")
    for s in stmts:
        src = "\n".join(lines[s.lineno - 1: s.end_lineno])
        notes = [c.strip() for c in re.findall(r"#([^\n]*)", src)]
        extra = [c for c in notes if c and not re.fullmatch(r"noqa(: ?F401)?", c)]
        for a in s.names:
            if extra and len(s.names) == 1:
                special.append((s.module, a.name, a.asname, "# " + extra[0]))
                leading += not groups and len(special) == leading + 1
            else:
                groups.setdefault(s.module, []).append((a.name, a.asname))
    body = [_emit([(mod, [(name, alias)])], [note], "", True) for mod, name, alias, note in special[:leading]]
    for mod in sorted(groups):
        body.append(_emit([(mod, sorted(set(groups[mod])))], ["# noqa: F401"], "", True))
    for mod, name, alias, note in special[leading:]:
        body.append(_emit([(mod, [(name, alias)])], [note], "", True))
    first, last = stmts[0].lineno - 1, stmts[-1].end_lineno
    between = [ln for ln in lines[first:last] if ln.strip() and not ln.lstrip().startswith(("from", "#"))
               and not re.match(r"^\s", ln)]
    if between:           # other code among the imports: leave the file as it is
        return text
    return "\n".join([*lines[:first], *body, *lines[last:]])


# --- pyproject.toml ------------------------------------------------------------------------------------

def _glob_match(pattern: str, path: str) -> bool:
    def rec(p: list[str], s: list[str]) -> bool:
        if not p:
            return not s
        if p[0] == "**":
            return any(rec(p[1:], s[i:]) for i in range(len(s) + 1))
        return bool(s) and fnmatch.fnmatchcase(s[0], p[0]) and rec(p[1:], s[1:])
    return rec(pattern.split("/"), path.split("/"))


def _package_dir(pkg: str) -> str:
    for folder, name in ROOTS.items():
        if pkg == name or pkg.startswith(name + "."):
            return "/".join([folder, *pkg[len(name):].strip(".").split(".")]).rstrip("/")
    raise ValueError(pkg)


def _data_entries(section: str) -> list[tuple[str, str]]:
    out = []
    for pkg, pats in re.findall(r'^"([\w.]+)"\s*=\s*\[([^\]]*)\]', section, re.M):
        out += [(pkg, p) for p in re.findall(r'"([^"]+)"', pats)]
    return out


def data_section(toml: str) -> str:
    m = re.search(r"^\[tool\.setuptools\.package-data\]\n(?:(?!\[).*\n?)*", toml, re.M)
    return m.group(0) if m else ""


def check_package_data(toml: str, files: list[str], file_map: dict[str, str]) -> list[str]:
    """Data files the current package-data packs that PACKAGE_DATA would not pack after the move."""
    def covered(entries, path):
        return any(_glob_match(f"{_package_dir(pkg)}/{pat}", path) for pkg, pat in entries)
    before = [f for f in files if not f.endswith(".pyc") and covered(_data_entries(data_section(toml)), f)]
    after = _data_entries(PACKAGE_DATA)
    return [f"{f} (now {file_map.get(f, f)})" for f in before if not covered(after, file_map.get(f, f))]


def packages_now() -> list[str]:
    """Every package of the source folders: a folder with __init__.py whose parents are packages
    (ui/comfy/comfy_host holds none: it has no __init__.py, its modules are package data)."""
    found = []
    for folder, name in ROOTS.items():
        def walk(d: Path, mod: str) -> None:
            if not (d / "__init__.py").is_file():
                return
            found.append(mod)
            for sub in sorted(p for p in d.iterdir() if p.is_dir() and p.name != "__pycache__"):
                walk(sub, f"{mod}.{sub.name}")
        walk(Path(folder), name)
    return sorted(found, key=lambda m: (m.count(".") > 0, m))


def rewrite_pyproject(toml: str) -> str:
    pkgs = packages_now()
    items = [f'"{p}"' for p in pkgs]
    lines, cur = [], "packages = ["
    for i, it in enumerate(items):
        piece = it + ("," if i < len(items) - 1 else "]")
        if len(cur) + 1 + len(piece) > 100 and not cur.endswith("["):
            lines.append(cur)
            cur = " " * len("packages = [") + piece
        else:
            cur += ("" if cur.endswith("[") else " ") + piece
    lines.append(cur)
    toml = re.sub(r"^packages = \[[^\]]*\]", lambda _: "\n".join(lines), toml, count=1, flags=re.M)
    section = data_section(toml)
    if section:
        toml = toml.replace(section, PACKAGE_DATA + ("\n" if section.endswith("\n\n") else ""), 1)
    return toml


# --- the run ----------------------------------------------------------------------------------------------

def is_text(path: str) -> str | None:
    try:
        data = Path(path).read_bytes()
    except OSError:
        return None
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def rewrite_file(path: str, rules: Rules, old_path: str, old_names: set[str], file_map: dict[str, str],
                 long_lines: list[str]) -> bool:
    text = is_text(path)
    if text is None:
        return False
    new = text
    python = path.endswith(".py")
    if python:
        new = rewrite_relative(new, old_path, path, old_names, file_map)
    if path != "pyproject.toml":      # its module names are regenerated (rewrite_pyproject)
        new = rewrite_from(rules, new)
        new = rewrite_dotted(rules, new)
    new = rewrite_paths(rules, new, python)
    if path in REGROUP:
        new = regroup_imports(new)
    if new != text:
        Path(path).write_text(new)
        before = set(text.split("\n"))
        long_lines += [f"{path}:{i}" for i, ln in enumerate(new.split("\n"), 1)
                       if len(ln) > 120 and ln not in before and python]
        return True
    return False


def self_check(rules: Rules) -> None:
    """No new name or path contains an old one, so a second run finds nothing to change."""
    forms = []
    for mn in rules.modules.values():
        forms += [mn, mn[len("mixgraph."):]]
    forms += list(rules.short.values()) + list(rules.paths.values()) + list(rules.short_paths.values())
    bad = []
    for f in forms:
        for rx in (rules.short_re, rules.path_re, rules.short_path_re):
            if rx.search(f):
                bad.append(f)
        for m in rules.full_re.finditer(f):
            name = "mixgraph." + m.group("name")
            if name not in rules.ambiguous or _ambiguous_old(rules, name, f, m.end()):
                bad.append(f)
    if bad:
        sys.exit(f"reorg: the table is not idempotent; new names that contain old ones: {sorted(set(bad))}")


def unmapped(files: list[str]) -> list[str]:
    """Modules left directly in nodes/, nodes/models/ or ui/ that the table does not name."""
    named = {o for o, _ in MOVES}
    out = []
    for f in files:
        p = PurePosixPath(f)
        if p.suffix == ".py" and str(p.parent) in ("nodes", "nodes/models", "ui") and f not in STAYS \
                and f not in named:
            out.append(f)
    return out


def write_layout_map(table: list[tuple[str, str]]) -> None:
    rows = sorted(table, key=lambda t: (t[1].rsplit("/", 1)[0], t[1]))
    out = ["# Layout map (issue 21: folders sorted by concept)", "",
           "Generated by `tools/reorg.py`: where each moved file or folder went. Modules not listed",
           "kept their place.", "", "| old path | new path |", "|---|---|"]
    out += [f"| `{o}` | `{n}` |" for o, n in rows]
    Path(LAYOUT_MAP).parent.mkdir(parents=True, exist_ok=True)
    Path(LAYOUT_MAP).write_text("\n".join(out) + "\n")


def ensure_packages(dirs: set[str]) -> list[str]:
    made = []
    for d, doc in PACKAGES.items():
        if not Path(d).is_dir():
            continue
        init = Path(d) / "__init__.py"
        if init.is_file() and init.read_text().strip():
            continue
        init.write_text(f'"""{doc}"""\n')
        made.append(str(init))
    # every other new folder that holds modules must be a package too
    for d in sorted(dirs):
        p = Path(d)
        if p.is_dir() and any(p.glob("*.py")) and not (p / "__init__.py").exists() \
                and module_of(d) and "comfy_host" not in p.parts:
            sys.exit(f"reorg: {d} holds modules but has no docstring in PACKAGES; add one")
    if made:
        git("add", "--", *made)
    return made


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    args = ap.parse_args()
    if not (Path("pyproject.toml").is_file() and Path("graph").is_dir() and Path(".git").exists()):
        sys.exit("reorg: run from the root of a mixgraph checkout")
    files = repo_files()
    plan = plan_moves(files)
    rules = build_rules(files)
    self_check(rules)
    file_map = dict(plan.moves)
    lost = check_package_data(Path("pyproject.toml").read_text(), files, file_map)
    if lost:
        sys.exit("reorg: PACKAGE_DATA would drop data files the wheel carries now:\n  " + "\n  ".join(lost))
    if args.dry_run:
        for o, n in plan.moves:
            print(f"move {o} -> {n}")
        print(f"{len(plan.moves)} files to move, {len(plan.done)} entries done already, "
              f"{len(plan.missing)} missing: {plan.missing}")
        return 0

    # 1. move
    vacated = set()
    for src, dst in plan.moves:
        Path(dst).parent.mkdir(parents=True, exist_ok=True)
        if tracked(src):
            git("mv", src, dst)
        else:
            shutil.move(src, dst)
        vacated.add(str(PurePosixPath(src).parent))
    for d in sorted(vacated, key=lambda s: -s.count("/")):       # leave no empty folder behind
        for cache in sorted(Path(d).rglob("__pycache__"), reverse=True) if Path(d).is_dir() else []:
            if not any(p.suffix == ".py" for p in cache.parent.iterdir()):
                shutil.rmtree(cache)
        p = Path(d)
        while p != Path(".") and p.is_dir() and not any(p.iterdir()):
            p.rmdir()
            p = p.parent
    made = ensure_packages({str(PurePosixPath(n).parent) for _, n in plan.moves})

    # 2. rewrite references
    files = repo_files()
    reverse = {n: o for o, n in plan.moves}
    old_names = {module_of(reverse.get(f, f)) for f in files if f.endswith(".py")}
    old_names |= {module_of(str(PurePosixPath(reverse.get(f, f)).parent)) for f in files if f.endswith(".py")}
    old_names.discard(None)
    long_lines: list[str] = []
    changed = [f for f in files if f not in (SELF, LAYOUT_MAP)
               and rewrite_file(f, rules, reverse.get(f, f), old_names, file_map, long_lines)]

    # 3. pyproject, patches, layout map
    toml = Path("pyproject.toml").read_text()
    new_toml = rewrite_pyproject(toml)
    if new_toml != toml:
        Path("pyproject.toml").write_text(new_toml)
        changed.append("pyproject.toml")
    for path, old, new in PATCHES:
        p = Path(path)
        if p.is_file() and old in p.read_text():
            p.write_text(p.read_text().replace(old, new))
            changed.append(path)
    write_layout_map(plan.table)
    git("add", "-A", "--", *sorted({*changed, LAYOUT_MAP, *made}), check=False)

    # 4. check and report
    broken = []
    for f in repo_files():
        if f.endswith(".py"):
            try:
                ast.parse(Path(f).read_text(), f)
            except SyntaxError as e:
                broken.append(f"{f}:{e.lineno}: {e.msg}")
    moved_py = [n for _, n in plan.moves if n.endswith(".py") and n not in FILE_USERS_CHECKED
                and "__file__" in (is_text(n) or "")]
    print(f"reorg: moved {len(plan.moves)} files ({len(plan.table) - len(plan.done)} table entries), "
          f"{len(plan.done)} entries were in place already, created {len(made)} __init__.py, "
          f"rewrote {len(set(changed))} files")
    for m in plan.missing:
        print(f"reorg: warning: {m} is in the table but exists nowhere; skipped")
    for f in unmapped(repo_files()):
        print(f"reorg: warning: {f} is not in the table and stays where it is; add a line to MOVES")
    for f in moved_py:
        print(f"reorg: note: {f} moved and uses __file__; check the paths it builds")
    if long_lines:
        print(f"reorg: note: code lines the rewrite took past 120 characters: {', '.join(long_lines)}")
    if broken:
        print("reorg: ERROR: files that no longer parse:\n  " + "\n  ".join(broken))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
