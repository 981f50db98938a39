"""ComfyUI's RebatchLatents and RebatchImages (``comfy_extras/nodes_rebatch.py``): take a list of
batches (INPUT_IS_LIST) and give a list of batches of `batch_size` (OUTPUT_IS_LIST)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mixgraph.graph.node import Int, Output, Socket, node
from mixgraph.nodes.payloads.latent import Latent

_BATCH = dict(min=1, max=4096)


def _mask_for(latent: Latent) -> torch.Tensor:
    """[B, 1, 8h, 8w]: the latent's noise mask at pixel size (ones when it has none)."""
    s = latent.samples
    b, size = s.shape[0], (s.shape[-2] * 8, s.shape[-1] * 8)
    if latent.noise_mask is None:
        return torch.ones(b, 1, *size)
    m = latent.noise_mask.to(torch.float32)
    m = m.reshape(-1, 1, m.shape[-2], m.shape[-1])
    if tuple(m.shape[-2:]) != size:
        m = F.interpolate(m, size=size, mode="bilinear")
    if m.shape[0] < b:
        m = m.repeat((b - 1) // m.shape[0] + 1, 1, 1, 1)[:b]
    return m


def rebatch_latents(latents: list[Latent], batch_size: int) -> list[Latent]:
    """Concatenate consecutive latents of one spatial size and cut them into batches of
    `batch_size`; a size change closes the batch being filled. Each output keeps its images'
    batch indices (their own, else their position in the whole input), and a noise mask only
    where some image is masked (ComfyUI drops masks whose mean is 1)."""
    out: list[tuple[torch.Tensor, torch.Tensor, tuple[int, ...]]] = []
    cur = None
    seen = 0
    for lat in latents:
        n = lat.samples.shape[0]
        idx = tuple(lat.batch_index) if lat.batch_index is not None else tuple(range(seen, seen + n))
        seen += n
        nxt = (lat.samples, _mask_for(lat), idx)
        if cur is None:
            cur = nxt
        elif tuple(nxt[0].shape[-2:]) != tuple(cur[0].shape[-2:]):
            out.append(cur)
            cur = nxt
        else:
            cur = (torch.cat((cur[0], nxt[0])), torch.cat((cur[1], nxt[1])), cur[2] + nxt[2])
        if cur[0].shape[0] > batch_size:
            full = cur[0].shape[0] // batch_size
            for i in range(full):
                sl = slice(i * batch_size, (i + 1) * batch_size)
                out.append((cur[0][sl], cur[1][sl], cur[2][sl]))
            rest = full * batch_size
            cur = (cur[0][rest:], cur[1][rest:], cur[2][rest:]) if rest < cur[0].shape[0] else None
    if cur is not None:
        out.append(cur)
    return [Latent(s, None if float(m.mean()) == 1.0 else m, tuple(i)) for s, m, i in out]


def rebatch_images(images: list[torch.Tensor], batch_size: int) -> list[torch.Tensor]:
    """All images of all batches in order, cut into batches of `batch_size` (the last shorter)."""
    frames = [img[i:i + 1] for img in images for i in range(img.shape[0])]
    sizes = {tuple(f.shape[1:]) for f in frames}
    out = []
    for i in range(0, len(frames), batch_size):
        chunk = frames[i:i + batch_size]
        if len({tuple(f.shape[1:]) for f in chunk}) > 1:
            raise ValueError(f"input 'images': images of different sizes "
                             f"({', '.join(f'{s[1]}x{s[0]}' for s in sorted(sizes))}) cannot share "
                             f"a batch; resize them first or use batch_size 1")
        out.append(torch.cat(chunk, dim=0))
    return out


@node(category="latent/batch", display_name="Rebatch Latents", input_is_list=True,
      outputs=[Output("LATENT", "LATENT", is_list=True)])
def RebatchLatents(latents=Socket("LATENT"), batch_size=Int(1, **_BATCH)):
    return (rebatch_latents(list(latents), int(batch_size[0])),)


@node(category="image/batch", display_name="Rebatch Images", input_is_list=True,
      outputs=[Output("IMAGE", "IMAGE", is_list=True)])
def RebatchImages(images=Socket("IMAGE"), batch_size=Int(1, **_BATCH)):
    return (rebatch_images(list(images), int(batch_size[0])),)
