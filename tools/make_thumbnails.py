"""Make the template browser's thumbnails: workflows/thumbnails/NAME.png for each workflow listed
in workflows/README.md.

A workflow that runs on what ships with mixgraph (the embedded model, no input images) is run, and
its first output picture is the thumbnail. Any other (it needs an SD 1.5 or SDXL checkpoint, a LoRA,
an input image) gets a drawing of its graph: the editor's layout of it (graph.formats.ui_export), nodes as
boxes coloured by kind, links as lines, so the thumbnail shows what the workflow does.

    PYTHONPATH=. python tools/make_thumbnails.py            # all
    PYTHONPATH=. python tools/make_thumbnails.py txt2img_shapes
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

from mixgraph.graph.env import Env
from mixgraph.graph.formats.ui_export import to_ui
from mixgraph.nodes.models.shapes import EMBEDDED_MODELS
from mixgraph.ui import api
from mixgraph.ui.server.templates import read_index

ROOT = Path(__file__).resolve().parent.parent
FOLDER = ROOT / "workflows"
SIZE = 256
COLORS = {"MODEL": (124, 92, 191), "CLIP": (200, 170, 40), "VAE": (200, 70, 70), "LATENT": (220, 110, 180),
          "CONDITIONING": (220, 140, 40), "IMAGE": (80, 150, 210), "MASK": (90, 170, 90),
          "CONTROL_NET": (60, 170, 150)}


FILE_INPUTS = {"ckpt_name": "checkpoints", "lora_name": "loras", "control_net_name": "controlnet",
               "vae_name": "vae", "unet_name": "diffusion_models", "clip_name": "text_encoders",
               "clip_name1": "text_encoders", "clip_name2": "text_encoders"}


def runnable(wf) -> bool:
    """Every model file it names ships with mixgraph, and it reads no input image."""
    for call in wf.prompt.values():
        if call.class_type in ("LoadImage", "LoadImageMask"):
            return False
        for name, folder in FILE_INPUTS.items():
            value = call.inputs.get(name)
            if isinstance(value, str) and not (EMBEDDED_MODELS / folder / value).is_file():
                return False
    return True


def rendered(path: Path, registry) -> Image.Image:
    with tempfile.TemporaryDirectory() as tmp:
        result = api.run(path, models=Path(tmp) / "models", output=Path(tmp) / "out",
                         executor=api.default_executor())
        with Image.open(result.files[0]) as im:
            return im.convert("RGB").resize((SIZE, SIZE), Image.Resampling.LANCZOS)


def drawing(wf, registry) -> Image.Image:
    ui = to_ui(wf, registry, Env.from_args())
    nodes = {str(n["id"]): n for n in ui["nodes"]}
    right = max(n["pos"][0] + n["size"][0] for n in nodes.values()) + 40
    bottom = max(n["pos"][1] + n["size"][1] for n in nodes.values()) + 40
    scale = min(SIZE / right, SIZE / bottom)
    ox, oy = (SIZE - right * scale) / 2, (SIZE - bottom * scale) / 2
    img = Image.new("RGB", (SIZE, SIZE), (32, 33, 36))
    d = ImageDraw.Draw(img)

    def box(n):
        x, y = n["pos"]
        w, h = n["size"]
        return [ox + x * scale, oy + y * scale, ox + (x + w) * scale, oy + (y + h) * scale]

    for _, origin, slot, target, tslot, kind in ui["links"]:
        a, b = box(nodes[str(origin)]), box(nodes[str(target)])
        d.line([(a[2], (a[1] + a[3]) / 2), (b[0], (b[1] + b[3]) / 2)], fill=COLORS.get(kind, (150, 150, 150)), width=2)
    font = ImageFont.load_default()
    for n in nodes.values():
        b = box(n)
        out = n["outputs"][0]["type"] if n["outputs"] else "IMAGE"
        d.rounded_rectangle(b, radius=3, fill=(53, 53, 58), outline=COLORS.get(out, (150, 150, 150)), width=2)
        label = "".join(c for c in n["type"] if c.isupper())[:6]
        d.text((b[0] + 3, b[1] + 2), label, fill=(220, 220, 220), font=font)
    return img


def main(argv: list[str]) -> int:
    registry = api.default_registry()
    rows = [r for r in read_index(FOLDER) if not argv or r["name"] in argv]
    (FOLDER / "thumbnails").mkdir(exist_ok=True)
    for row in rows:
        path = FOLDER / f"{row['name']}.json"
        wf = api.load(path, registry)
        img = rendered(path, registry) if runnable(wf) else drawing(wf, registry)
        out = FOLDER / "thumbnails" / f"{row['name']}.png"
        img.save(out, optimize=True)
        print(f"{out.relative_to(ROOT)}: {'rendered' if runnable(wf) else 'graph drawing'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
