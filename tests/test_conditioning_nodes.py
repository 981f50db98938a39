"""Conditioning nodes (average, concat, percentage areas, masks, timestep ranges, inpaint-model
conditioning, SDXL encoders): specs as ComfyUI's, hand-derived values, and what the sampler does
with each field."""

import math
from dataclasses import dataclass, field

import pytest
import torch

from mixgraph.nodes.helpers import cond_ops
from mixgraph.nodes.payloads.conditioning import Cond, SizeCond
from mixgraph.nodes.sampling.parameterization import CFGDenoiser, ModelSampling, resolve_area_and_mask
from mixgraph.ui import api
from tests.fixtures.sampler_models import UNetSeam

INFO = api.default_registry().object_info()
POS = torch.full((1, 2, 3), 1.0)


@dataclass
class ContextModel(UNetSeam):
    """x0-predicting model: the prediction is the cond's first context value everywhere."""

    prediction: str = "x0"
    zsnr: bool = False
    latent_scale: float = 0.5
    in_channels: int = 4
    calls: list = field(default_factory=list)

    def unet(self, x, timesteps, context, y=None, control=None):
        self.calls.append({"x": x.clone(), "context": context.clone()})
        return context[:, 0, 0].reshape(-1, 1, 1, 1).expand(x.shape[0], 4, *x.shape[2:]).clone()

    def adm(self, cond, latent_hw, negative=False):
        return None


def test_conditioning_specs_match_comfyui():
    req = lambda n: INFO[n]["input"]["required"]  # noqa: E731
    order = lambda n: INFO[n]["input_order"]["required"]  # noqa: E731
    assert order("ConditioningAverage") == ["conditioning_to", "conditioning_from", "conditioning_to_strength"]
    assert req("ConditioningAverage")["conditioning_to_strength"] == [
        "FLOAT", {"default": 1.0, "min": 0.0, "max": 1.0, "step": 0.01}]
    assert order("ConditioningConcat") == ["conditioning_to", "conditioning_from"]
    assert order("ConditioningSetAreaPercentage") == ["conditioning", "width", "height", "x", "y", "strength"]
    assert req("ConditioningSetAreaPercentage")["width"] == ["FLOAT", {"default": 1.0, "min": 0, "max": 1.0,
                                                                        "step": 0.01}]
    assert req("ConditioningSetAreaPercentage")["x"] == ["FLOAT", {"default": 0, "min": 0, "max": 1.0, "step": 0.01}]
    assert order("ConditioningSetAreaStrength") == ["conditioning", "strength"]
    assert order("ConditioningSetMask") == ["conditioning", "mask", "strength", "set_cond_area"]
    assert req("ConditioningSetMask")["set_cond_area"][0] == ["default", "mask bounds"]
    assert req("ConditioningSetMask")["strength"] == ["FLOAT", {"default": 1.0, "min": 0.0, "max": 10.0,
                                                                "step": 0.01}]
    assert req("ConditioningSetTimestepRange")["end"] == ["FLOAT", {"default": 1.0, "min": 0.0, "max": 1.0,
                                                                    "step": 0.001}]
    assert INFO["ConditioningSetTimestepRange"]["category"] == "advanced/conditioning"
    assert order("InpaintModelConditioning") == ["positive", "negative", "vae", "pixels", "mask", "noise_mask"]
    assert req("InpaintModelConditioning")["noise_mask"][1]["default"] is True
    assert INFO["InpaintModelConditioning"]["output"] == ["CONDITIONING", "CONDITIONING", "LATENT"]
    assert INFO["InpaintModelConditioning"]["output_name"] == ["positive", "negative", "latent"]
    assert order("CLIPTextEncodeSDXL") == ["clip", "width", "height", "crop_w", "crop_h", "target_width",
                                           "target_height", "text_g", "text_l"]
    assert req("CLIPTextEncodeSDXL")["width"] == ["INT", {"default": 1024, "min": 0, "max": 16384}]
    assert req("CLIPTextEncodeSDXL")["text_g"][1]["multiline"] is True
    assert order("CLIPTextEncodeSDXLRefiner") == ["ascore", "width", "height", "text", "clip"]
    assert req("CLIPTextEncodeSDXLRefiner")["ascore"] == ["FLOAT", {"default": 6.0, "min": 0.0, "max": 1000.0,
                                                                    "step": 0.01}]


def test_conditioning_average_mixes_tokens_and_pooled():
    to = (Cond(torch.ones(1, 3, 2), pooled=torch.full((1, 2), 4.0)),)
    frm = (Cond(torch.full((1, 2, 2), 3.0), pooled=torch.zeros(1, 2)),)
    (out,) = cond_ops.average(to, frm, 0.25)
    # tokens 0-1: 0.25·1 + 0.75·3 = 2.5; token 2: from is zero-padded -> 0.25
    assert torch.allclose(out.cross_attn[0, :, 0], torch.tensor([2.5, 2.5, 0.25]))
    assert torch.allclose(out.pooled, torch.full((1, 2), 1.0))
    # a `to` without pooled takes from's pooled
    (out2,) = cond_ops.average((Cond(torch.ones(1, 1, 2)),), frm, 0.5)
    assert torch.equal(out2.pooled, frm[0].pooled)


def test_conditioning_concat_appends_first_from_cond_tokens():
    to = (Cond(torch.ones(1, 2, 3), strength=2.0), Cond(torch.zeros(1, 1, 3)))
    frm = (Cond(torch.full((1, 4, 3), 5.0)), Cond(torch.ones(1, 1, 3)))
    out = cond_ops.concat(to, frm)
    assert out[0].cross_attn.shape == (1, 6, 3) and out[0].strength == 2.0
    assert torch.equal(out[1].cross_attn[0, 1:, 0], torch.full((4,), 5.0))
    with pytest.raises(ValueError, match="token widths differ"):
        cond_ops.concat(to, (Cond(torch.ones(1, 1, 4)),))


def test_area_percentage_resolves_to_latent_pixels():
    (c,) = cond_ops.set_area_percentage((Cond(POS),), width=0.5, height=0.25, x=0.5, y=0.3, strength=2.0)
    r = resolve_area_and_mask(c, (20, 30))
    # h = round(0.25·20) = 5, w = round(0.5·30) = 15, y = round(0.3·20) = 6, x = round(0.5·30) = 15
    assert r.area == (5, 15, 6, 15) and r.area_fraction is None and r.strength == 2.0
    tiny = resolve_area_and_mask(cond_ops.set_area_percentage((Cond(POS),), 0.0, 0.0, 0, 0, 1.0)[0], (8, 8))
    assert tiny.area[:2] == (1, 1)


def test_set_mask_bounds_area_is_mask_bounding_box_at_least_8():
    mask = torch.zeros(32, 32)
    mask[4:6, 10:30] = 1.0
    (c,) = cond_ops.set_mask((Cond(POS),), mask, 1.0, "mask bounds")
    r = resolve_area_and_mask(c, (32, 32))
    assert r.area == (8, 20, 4, 10)
    (empty,) = cond_ops.set_mask((Cond(POS),), torch.zeros(32, 32), 1.0, "mask bounds")
    assert resolve_area_and_mask(empty, (32, 32)).area == (8, 8, 0, 0)
    (plain,) = cond_ops.set_mask((Cond(POS),), mask, 1.0, "default")
    assert resolve_area_and_mask(plain, (32, 32)).area is None


def test_cfg_full_mask_strength_one_equals_no_mask():
    x = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(0))
    sigma = torch.tensor([2.0])
    a = (Cond(POS), Cond(torch.full((1, 2, 3), 3.0)))
    b = (Cond(POS), cond_ops.set_mask((Cond(torch.full((1, 2, 3), 3.0)),), torch.ones(16, 16), 1.0,
                                      "default")[0])
    out_a = CFGDenoiser(ContextModel(), a, (), 1.0, x)(x, sigma)
    out_b = CFGDenoiser(ContextModel(), b, (), 1.0, x)(x, sigma)
    assert torch.allclose(out_a, out_b) and float(out_a[0, 0, 0, 0]) == pytest.approx(2.0)


def test_cfg_mask_strength_scales_weight_and_bounds_crop_the_input():
    mask = torch.zeros(8, 8)
    mask[:, :4] = 0.5
    (masked,) = cond_ops.set_mask((Cond(torch.full((1, 2, 3), 5.0)),), mask, 4.0, "mask bounds")
    (masked,) = cond_ops.set_strength((masked,), 0.5)
    x = torch.zeros(1, 4, 8, 8)
    m = ContextModel()
    out = CFGDenoiser(m, (Cond(POS), masked), (), 1.0, x)(x, torch.tensor([1.0]))
    # weight = mask·mask_strength·strength = 0.5·4·0.5 = 1 on the left half, 0 on the right
    assert float(out[0, 0, 3, 0]) == pytest.approx((1 + 5) / 2)
    assert float(out[0, 0, 3, 7]) == pytest.approx(1.0)
    # bounds = columns 0-3, widened to 8: the masked cond runs on the whole 8x8 crop
    assert sorted(c["x"].shape[-1] for c in m.calls) == [8]


def test_timestep_ranges_split_sampling_between_two_conds():
    ms = ModelSampling("x0")
    (early,) = cond_ops.set_timestep_range((Cond(POS),), 0.0, 0.5)
    (late,) = cond_ops.set_timestep_range((Cond(torch.full((1, 2, 3), 7.0)),), 0.5, 1.0)
    x = torch.zeros(1, 4, 4, 4)
    den = CFGDenoiser(ContextModel(), (early, late), (), 1.0, x)
    s_half = ms.percent_to_sigma(0.5)
    assert float(den(x, torch.tensor([s_half * 1.5]))[0, 0, 0, 0]) == pytest.approx(1.0)
    assert float(den(x, torch.tensor([s_half / 1.5]))[0, 0, 0, 0]) == pytest.approx(7.0)
    # at exactly the boundary both are active: their average
    assert float(den(x, torch.tensor([s_half]))[0, 0, 0, 0]) == pytest.approx(4.0)


def test_inpaint_pixels_grey_masked_region_and_crop():
    px = torch.rand(1, 18, 17, 3, generator=torch.Generator().manual_seed(1))
    mask = torch.zeros(1, 18, 17)
    mask[:, :9] = 1.0
    grey, m = cond_ops.inpaint_pixels(px, mask)
    assert grey.shape == (1, 16, 16, 3) and m.shape == (1, 1, 16, 16)
    # crop offsets (18 % 8) // 2 = 1 and (17 % 8) // 2 = 0
    assert torch.equal(grey[0, 9:], px[0, 10:17, 0:16])
    assert torch.all(grey[0, :8] == 0.5)


def test_inpaint_model_uses_cond_concat_latent_and_mask():
    m = ContextModel(in_channels=9)
    lat = torch.full((1, 4, 4, 4), 2.0)
    concat_latent = torch.full((1, 4, 4, 4), 3.0)
    cmask = torch.zeros(1, 1, 32, 32)
    cmask[..., :16, :] = 1.0
    (c,) = cond_ops.set_concat((Cond(POS),), concat_latent, cmask)
    den = CFGDenoiser(m, (c,), (), 1.0, lat * 0.5)
    den(lat, torch.tensor([1.0]))
    x = m.calls[0]["x"]
    assert torch.equal(x[0, 4, :2], torch.ones(2, 4)) and torch.equal(x[0, 4, 2:], torch.zeros(2, 4))
    assert torch.equal(x[:, 5:], concat_latent * 0.5)  # scaled like the sampled latent


def test_refiner_aesthetic_default_depends_on_prompt_side():
    from mixgraph.nodes.families.sd.runner import UNetRunner
    from tests.fixtures.tiny_unet import tiny_unet_config

    cfg = tiny_unet_config("sdxl_refiner")

    class _H:
        config = cfg
        kind = "sdxl_refiner"

    runner = UNetRunner.__new__(UNetRunner)
    runner.handle, runner.kind = _H, "sdxl_refiner"
    pooled = torch.zeros(1, cfg.adm_in_channels - 5 * 256)
    sized = Cond(POS, pooled=pooled, size=SizeCond(width=64, height=64))
    y_neg = runner.adm(sized, (8, 8), negative=True)
    y_pos = runner.adm(sized, (8, 8))
    y_set = runner.adm(Cond(POS, pooled=pooled, size=SizeCond(aesthetic_score=2.5)), (8, 8))
    assert not torch.equal(y_neg, y_pos) and torch.equal(y_neg, y_set)
    # the last 256 numbers embed the score: cos(2.5·1) at frequency index 0
    assert float(y_neg[0, -256]) == pytest.approx(math.cos(2.5))


# --- end to end on tiny generated checkpoints ---------------------------------------------------

@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from tests.fixtures.checkpoints import write_sd15, write_sdxl
    root = tmp_path_factory.mktemp("cond_models")
    (root / "checkpoints").mkdir()
    write_sd15(root / "checkpoints" / "sd15.safetensors", seed=1)
    write_sdxl(root / "checkpoints" / "sdxl.safetensors", seed=2)
    return root


def _sample_graph(g, ckpt, positive, negative, size=32, steps=3):
    lat = g.add("EmptyLatentImage", width=size, height=size, batch_size=1)
    ks = g.add("KSampler", model=ckpt[0], seed=3, steps=steps, cfg=4.0, sampler_name="euler",
               scheduler="normal", positive=positive, negative=negative, latent_image=lat, denoise=1.0)
    dec = g.add("VAEDecode", samples=ks, vae=ckpt[2])
    g.add("PreviewImage", images=dec)
    return ks, dec


def test_conditioning_nodes_run_end_to_end_sd15(models, tmp_path):
    g = api.Graph(precision="f32")
    ckpt = g.add("CheckpointLoaderSimple", ckpt_name="sd15.safetensors")
    a = g.add("CLIPTextEncode", text="a red cube", clip=ckpt[1])
    b = g.add("CLIPTextEncode", text="a blue sphere", clip=ckpt[1])
    neg = g.add("CLIPTextEncode", text="", clip=ckpt[1])
    early = g.add("ConditioningSetTimestepRange", conditioning=a, start=0.0, end=0.5)
    late = g.add("ConditioningSetTimestepRange", conditioning=b, start=0.5, end=1.0)
    both = g.add("ConditioningCombine", conditioning_1=early, conditioning_2=late)
    avg = g.add("ConditioningAverage", conditioning_to=a, conditioning_from=b, conditioning_to_strength=0.3)
    cat = g.add("ConditioningConcat", conditioning_to=avg, conditioning_from=b)
    area = g.add("ConditioningSetAreaPercentage", conditioning=cat, width=0.5, height=0.5, x=0.25, y=0.25,
                 strength=1.5)
    solid = g.add("SolidMask", value=1.0, width=32, height=32)
    masked = g.add("ConditioningSetMask", conditioning=area, mask=solid, strength=0.7,
                   set_cond_area="mask bounds")
    pos = g.add("ConditioningCombine", conditioning_1=both, conditioning_2=masked)
    strong = g.add("ConditioningSetAreaStrength", conditioning=pos, strength=1.0)
    ks, dec = _sample_graph(g, ckpt, strong, neg)
    out = api.run(g, models=models, output=tmp_path)
    img = out[dec.node_id][0]
    assert img.shape == (1, 32, 32, 3) and torch.isfinite(img).all()
    assert out[cat.node_id][0][0].cross_attn.shape[1] == 154


def test_full_mask_strength_one_equals_no_mask_end_to_end(models, tmp_path):
    def run(with_mask):
        g = api.Graph(precision="f32")
        ckpt = g.add("CheckpointLoaderSimple", ckpt_name="sd15.safetensors")
        pos = g.add("CLIPTextEncode", text="a red cube", clip=ckpt[1])
        if with_mask:
            pos = g.add("ConditioningSetMask", conditioning=pos,
                        mask=g.add("SolidMask", value=1.0, width=32, height=32), strength=1.0,
                        set_cond_area="default")
        neg = g.add("CLIPTextEncode", text="", clip=ckpt[1])
        ks, _ = _sample_graph(g, ckpt, pos, neg)
        return api.run(g, models=models, output=tmp_path)[ks.node_id][0].samples

    assert torch.allclose(run(True), run(False), atol=1e-5)


def test_inpaint_model_conditioning_end_to_end(models, tmp_path):
    g = api.Graph(precision="f32")
    ckpt = g.add("CheckpointLoaderSimple", ckpt_name="sd15.safetensors")
    img = g.add("EmptyImage", width=32, height=32, batch_size=1, color=0x808080)
    mask = g.add("SolidMask", value=1.0, width=16, height=16)
    pos = g.add("CLIPTextEncode", text="a cat", clip=ckpt[1])
    neg = g.add("CLIPTextEncode", text="", clip=ckpt[1])
    inp = g.add("InpaintModelConditioning", positive=pos, negative=neg, vae=ckpt[2], pixels=img, mask=mask,
                noise_mask=True)
    ks = g.add("KSampler", model=ckpt[0], seed=3, steps=2, cfg=2.0, sampler_name="euler",
               scheduler="normal", positive=inp[0], negative=inp[1], latent_image=inp[2], denoise=1.0)
    g.add("PreviewImage", images=g.add("VAEDecode", samples=ks, vae=ckpt[2]))
    out = api.run(g, models=models, output=tmp_path)
    p, n, lat = out[inp.node_id]
    assert lat.samples.shape == (1, 4, 4, 4) and lat.noise_mask.shape == (1, 1, 32, 32)
    assert p[0].concat_latent.shape == (1, 4, 4, 4) and p[0].concat_mask is n[0].concat_mask
    assert torch.isfinite(out[ks.node_id][0].samples).all()


def test_clip_text_encode_sdxl_pads_chunks_and_sets_size(models, tmp_path):
    g = api.Graph(precision="f32")
    ckpt = g.add("CheckpointLoaderSimple", ckpt_name="sdxl.safetensors")
    long_l = " ".join(["word"] * 100)  # two chunks for clip_l, one for clip_g -> g padded
    pos = g.add("CLIPTextEncodeSDXL", clip=ckpt[1], width=640, height=512, crop_w=8, crop_h=16,
                target_width=320, target_height=256, text_g="a cube", text_l=long_l)
    same = g.add("CLIPTextEncodeSDXL", clip=ckpt[1], width=640, height=512, crop_w=8, crop_h=16,
                 target_width=320, target_height=256, text_g="a cube", text_l="a cube")
    plain = g.add("CLIPTextEncode", text="a cube", clip=ckpt[1])
    neg = g.add("CLIPTextEncodeSDXLRefiner", clip=ckpt[1], ascore=2.5, width=64, height=64, text="")
    extra = g.add("ConditioningCombine", conditioning_1=same, conditioning_2=plain)
    neg = g.add("ConditioningCombine", conditioning_1=neg, conditioning_2=extra)
    ks, dec = _sample_graph(g, ckpt, pos, neg)
    out = api.run(g, models=models, output=tmp_path)
    (c,) = out[pos.node_id][0]
    assert c.cross_attn.shape[1] == 154
    assert c.size == SizeCond(640, 512, 8, 16, 320, 256)
    # equal texts: exactly CLIPTextEncode's tokens and pooled output
    (s,) = out[same.node_id][0]
    (p,) = out[plain.node_id][0]
    assert torch.allclose(s.cross_attn, p.cross_attn) and torch.allclose(s.pooled, p.pooled)
    # clip_g's half of the features: chunk 2 is the encoded empty prompt, chunk 1 equals "a cube"
    g_width = c.cross_attn.shape[-1] - 32
    assert torch.allclose(c.cross_attn[:, :77, -g_width:], p.cross_attn[:, :, -g_width:], atol=1e-6)
    assert torch.isfinite(out[dec.node_id][0]).all()
