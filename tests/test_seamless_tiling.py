"""comfy_extras/nodes_seamless_tiling.py: ModelPatchSeamlessTiling (shifted-and-blended model calls)
and VAEDecodeSeamlessTiling (periodic context), against ComfyUI's definitions on tiny models."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from mixgraph.graph.precision import parse_spec
from mixgraph.nodes.declare.model_patches import seamless_tiling_nodes as N
from mixgraph.nodes.models import loader, seamless
from mixgraph.nodes.adapters.controlnet import ControlNetChain
from mixgraph.nodes.payloads.conditioning import Cond
from mixgraph.nodes.sampling.parameterization import CFGDenoiser
from mixgraph.ui import api
from tests.fixtures.checkpoints import write_sd15
from tests.test_cond_nodes import rand_tensor
from tests.fixtures.workflow_models import write_controlnet

F32, BF16 = parse_spec("f32"), parse_spec("bf16")
INFO = api.default_registry().object_info()


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("models")
    write_sd15(root / "checkpoints" / "sd15.safetensors", seed=4)
    return root


@pytest.fixture(scope="module")
def handles(models):
    return loader.load_checkpoint(models / "checkpoints" / "sd15.safetensors")


def test_seamless_tiling_specs_match_comfyui():
    mp = INFO["ModelPatchSeamlessTiling"]
    assert mp["input_order"] == {"required": ["model", "tiling", "context_size"]}
    assert mp["input"]["required"]["tiling"] == [["x", "y", "x and y"], {"default": "x and y"}]
    ctx = mp["input"]["required"]["context_size"]
    assert ctx[0] == "INT" and {k: ctx[1][k] for k in ("default", "min", "max", "step")} == \
        {"default": 8, "min": 1, "max": 256, "step": 1}
    assert mp["output"] == ["MODEL"] and mp["category"] == "model/patch" and mp["display_name"] == "Seamless Tiling"
    vd = INFO["VAEDecodeSeamlessTiling"]
    assert vd["input_order"] == {"required": ["samples", "vae", "tiling", "context_size"]}
    assert vd["output"] == ["IMAGE"] and vd["category"] == "model/latent"
    assert vd["display_name"] == "Seamless Tiling VAE Decode"


def test_periodic_pad_and_seam_blend_reference_values():
    x = torch.tensor([[[[1, 2, 3], [4, 5, 6]]]])
    assert seamless.periodic_pad(x, 1, 1).tolist() == [[[[6, 4, 5, 6, 4], [3, 1, 2, 3, 1],
                                                         [6, 4, 5, 6, 4], [3, 1, 2, 3, 1]]]]
    assert seamless.periodic_pad(x, 0, 1).tolist() == [[[[3, 1, 2, 3, 1], [6, 4, 5, 6, 4]]]]
    assert seamless.seam_blend(8, 2, torch.zeros(1)).tolist() == [1.0, 0.5, 0.0, 0.0, 0.0, 0.0, 0.5, 1.0]
    assert seamless.padding("x", 5) == (0, 5) and seamless.padding("y", 5) == (5, 0)
    assert seamless.padding("x and y", 5) == (5, 5)


def _numpy_wrap(f, x: np.ndarray, by: int, bx: int) -> np.ndarray:
    """ComfyUI's blend written out: every (shift_y, shift_x) evaluation, shifted back, weighted by
    the outer product of the per-axis seam weights."""
    h, w = x.shape[-2:]

    def blend(n, width):
        i = np.arange(n, dtype=np.float64)
        return 1.0 - np.minimum(np.minimum(i, n - 1 - i) / width, 1.0)

    out = 0.0
    for sy in ((0, h // 2) if by else (0,)):
        wy = (blend(h, by) if sy else 1.0 - blend(h, by)) if by else np.ones(h)
        for sx in ((0, w // 2) if bx else (0,)):
            wx = (blend(w, bx) if sx else 1.0 - blend(w, bx)) if bx else np.ones(w)
            y = np.roll(f(np.roll(x, (sy, sx), axis=(-2, -1))), (-sy, -sx), axis=(-2, -1))
            out += y * (wy[:, None] * wx[None, :])
    return out


@pytest.mark.parametrize("mode, calls", [("x", 2), ("y", 2), ("x and y", 4)])
def test_seamless_wrap_matches_numpy_blend(mode, calls):
    x = rand_tensor(2, 5, 6, 10, seed=1)  # 4 latent + 1 concat channel: they shift together
    ramp = torch.linspace(0.5, 2.0, 60).reshape(6, 10)  # position-dependent, so shifts matter

    seen = []

    def call(z):
        seen.append(z)
        return torch.tanh(z[:, :4] * ramp) + z[:, 4:] * 0.1

    patch = seamless.SeamlessTiling(*seamless.padding(mode, 3))
    got = patch.wrap_unet(call, x, control=None)
    ref = _numpy_wrap(lambda z: np.tanh(z[:, :4] * ramp.numpy()) + z[:, 4:] * 0.1, x.numpy().astype(np.float64),
                      patch.blend_y, patch.blend_x)
    assert len(seen) == calls and got.shape == (2, 4, 6, 10)
    np.testing.assert_allclose(got.numpy(), ref, atol=1e-5)
    # an identity model stays the identity: the weights sum to 1 at every pixel
    torch.testing.assert_close(patch.wrap_unet(lambda z: z, x, control=None), x, rtol=0, atol=1e-6)


def test_seamless_denoiser_is_the_blend_of_shifted_denoised_predictions(handles):
    """ComfyUI wraps the whole model call (x0 out); mixgraph wraps the UNet call. Equal, because
    the blend weights sum to 1 and c_in/c_out act per pixel."""
    model = handles[0]
    patched = N.ModelPatchSeamlessTiling(model, "x and y", 2)[0]
    pos, neg = (Cond(rand_tensor(1, 77, 32, seed=2)),), (Cond(rand_tensor(1, 77, 32, seed=3)),)
    x, sigma = rand_tensor(1, 4, 8, 12, seed=4) * 4.0, torch.tensor([4.0])
    lat = torch.zeros(1, 4, 8, 12)
    plain = CFGDenoiser(model.runner(F32), pos, neg, 5.0, lat)
    with torch.no_grad():
        got = CFGDenoiser(patched.runner(F32), pos, neg, 5.0, lat)(x, sigma)
        ref = _numpy_wrap(lambda z: plain(torch.from_numpy(z).float(), sigma).double().numpy(),
                          x.double().numpy(), 2, 2)
        base = plain(x, sigma)
    np.testing.assert_allclose(got.numpy(), ref, atol=2e-5)
    assert (got - base).abs().max() > 1e-3


def test_seamless_patch_refuses_a_controlnet(handles, tmp_path):
    model = handles[0]
    write_controlnet(tmp_path / "cn.safetensors")
    net = loader.load_controlnet(tmp_path / "cn.safetensors").runner(F32)
    chain = ControlNetChain(net, torch.rand(1, 64, 64, 3))
    patched = N.ModelPatchSeamlessTiling(model, "x", 8)[0]
    den = CFGDenoiser(patched.runner(F32), (Cond(rand_tensor(1, 77, 32), control=chain),), (Cond(rand_tensor(1, 77, 32)),),
                      3.0, torch.zeros(1, 4, 8, 8))
    with pytest.raises(ValueError, match="cannot be used with ControlNet"):
        den(rand_tensor(1, 4, 8, 8), torch.tensor([2.0]))


def test_seamless_patch_under_bf16_is_close_to_f32(handles):
    patched = N.ModelPatchSeamlessTiling(handles[0], "x and y", 4)[0]
    pos, neg = (Cond(rand_tensor(1, 77, 32, seed=2)),), (Cond(rand_tensor(1, 77, 32, seed=3)),)
    x, sigma = rand_tensor(1, 4, 8, 8, seed=4) * 4.0, torch.tensor([4.0])
    lat = torch.zeros(1, 4, 8, 8)
    with torch.no_grad():
        f32 = CFGDenoiser(patched.runner(F32), pos, neg, 5.0, lat)(x, sigma)
        bf16 = CFGDenoiser(patched.runner(BF16), pos, neg, 5.0, lat)(x, sigma)
    assert bf16.dtype == torch.float32 and torch.isfinite(bf16).all()
    assert (bf16 - f32).abs().max() < 0.1 * f32.abs().max()


def _seam_error(decode, latent: torch.Tensor) -> float:
    """How far the image's right edge is from continuing into its left edge: the image of the
    latent rolled by half its width (the decoder sees the two edges side by side, inside) against
    the image rolled by as many pixels, over the 16 pixel columns around the former edges."""
    half = latent.shape[-1] // 2
    image = decode(latent)
    scale = image.shape[-2] // latent.shape[-1]
    inside = decode(torch.roll(latent, half, dims=-1))
    moved = torch.roll(image, half * scale, dims=-2)
    cols = slice(half * scale - 8, half * scale + 8)
    return (inside[:, :, cols] - moved[:, :, cols]).abs().max().item()


def test_seamless_decode_wraps_left_and_right_edges(handles):
    vae = handles[2]
    latent = rand_tensor(1, 4, 8, 16, seed=7)
    plain = vae.decode(latent, F32)  # [1, 64, 128, 3]
    tiled = seamless.decode_periodic(lambda z: vae.decode(z, F32), latent, "x", 8)
    assert tiled.shape == plain.shape
    def seam(mode, context):
        return _seam_error(lambda z: seamless.decode_periodic(lambda p: vae.decode(p, F32), z, mode, context), latent)

    seam_plain = _seam_error(lambda z: vae.decode(z, F32), latent)
    # the tiled image's right edge continues into its left edge nearly as the decoder draws
    # neighbouring columns inside the image, and more closely the more context it has (not
    # exactly: the decoder's mid-block attention is global and sees the padded borders); the
    # plain decode has a seam there
    assert seam("x", 8) < 0.15 * seam_plain
    assert seam("x", 8) < seam("x", 2) < seam_plain
    # tiling "y" pads the rows only: the left/right seam stays
    assert seam("y", 8) > 0.5 * seam_plain
    # the edge columns are what changed; the image keeps its size and range
    assert (tiled[:, :, :8] - plain[:, :, :8]).abs().max() > 1e-3


def _graph(models, *, patched: bool, plain_branch: bool, precision="f32"):
    g = api.Graph(precision=precision)
    ck = g.add("CheckpointLoaderSimple", ckpt_name="sd15.safetensors")
    pos = g.add("CLIPTextEncode", text="bricks", clip=ck[1])
    neg = g.add("CLIPTextEncode", text="", clip=ck[1])
    lat = g.add("EmptyLatentImage", width=64, height=64, batch_size=1)
    refs = {}

    def ksampler(model):
        return g.add("KSampler", model=model, seed=2, steps=2, cfg=4.0, sampler_name="euler", scheduler="normal",
                     positive=pos, negative=neg, latent_image=lat, denoise=1.0)
    if patched:
        m = g.add("ModelPatchSeamlessTiling", model=ck[0], tiling="x and y", context_size=2)
        refs["tiled"] = ksampler(m)
        refs["image"] = g.add("VAEDecodeSeamlessTiling", samples=refs["tiled"], vae=ck[2], tiling="x and y",
                              context_size=4)
        g.add("PreviewImage", images=refs["image"])
    if plain_branch:
        refs["plain"] = ksampler(ck[0])
        g.add("PreviewImage", images=g.add("VAEDecode", samples=refs["plain"], vae=ck[2]))
    return g, refs


def test_seamless_nodes_end_to_end_without_leaking_into_the_plain_model(models, tmp_path):
    ex = api.default_executor()
    g, refs = _graph(models, patched=True, plain_branch=True)
    out = api.run(g, models=models, output=tmp_path, executor=ex)
    tiled, plain = out[refs["tiled"].node_id][0].samples, out[refs["plain"].node_id][0].samples
    image = out[refs["image"].node_id][0]
    assert image.shape == (1, 64, 64, 3) and torch.isfinite(image).all()
    assert (tiled - plain).abs().max() > 1e-3
    # the plain branch is what a graph without the patch gives, on the same executor (whose caches
    # hold the patched run's model) and on a fresh one
    g2, refs2 = _graph(models, patched=False, plain_branch=True)
    for executor in (ex, api.default_executor()):
        again = api.run(g2, models=models, output=tmp_path, executor=executor)[refs2["plain"].node_id][0].samples
        assert torch.equal(again, plain)


def test_seamless_nodes_run_under_bf16(models, tmp_path):
    g, refs = _graph(models, patched=True, plain_branch=False, precision="bf16")
    out = api.run(g, models=models, output=tmp_path)
    assert torch.isfinite(out[refs["image"].node_id][0]).all()
    g32, refs32 = _graph(models, patched=True, plain_branch=False)
    ref = api.run(g32, models=models, output=tmp_path)[refs32["tiled"].node_id][0].samples
    got = out[refs["tiled"].node_id][0].samples
    assert (got - ref).abs().max() < 0.1 * ref.abs().max()
