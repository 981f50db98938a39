"""Chroma (``nodes/families/flux/chroma.py``): against diffusers' ``ChromaTransformer2DModel`` on a
tiny config, weights converted by our key map; detection in both layouts; its conditioning (no
pooled vector, guidance 0, a T5 padding mask); sampling end to end."""

from __future__ import annotations

import torch

from mixgraph.nodes.families.flux import diffusers_keys
from mixgraph.nodes.families.flux.chroma import Chroma
from mixgraph.nodes.families.flux.model import image_ids, patchify, unpatchify
from tests.flux_fixtures import chroma_state_dict, chroma_tiny_config, diffusers_chroma

CFG = chroma_tiny_config()


def test_chroma_matches_diffusers():
    sd = chroma_state_dict(CFG, seed=1)
    ours = Chroma(CFG).eval()
    ours.load_state_dict(sd, strict=True)
    ref = diffusers_chroma(CFG).eval()
    converted = diffusers_keys.to_diffusers(sd, ref.state_dict().keys(), diffusers_keys.chroma_plan)
    ref.load_state_dict(converted, strict=True)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 16, 6, 8, generator=g)
    ctx = torch.randn(2, 5, CFG.context_in_dim, generator=g)
    t = torch.tensor([0.9, 0.3])
    with torch.no_grad():
        got = ours(x, t, ctx, guidance=torch.zeros(2))
        want = ref(hidden_states=patchify(x), encoder_hidden_states=ctx, timestep=t, img_ids=image_ids(3, 4, 1)[0],
                   txt_ids=torch.zeros(5, 3), return_dict=False)[0]
    want = unpatchify(want, 6, 8)
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()
    back = diffusers_keys.to_bfl(ref.state_dict(), diffusers_keys.chroma_plan)
    assert set(back) == set(sd) and all(torch.equal(back[k], sd[k]) for k in sd)


def test_text_mask_equals_dropping_the_padding():
    """A padded text token masked out (T5 padding, ``model_inputs["attention_mask"]``) changes
    nothing for the image: the same as not having it (text tokens all sit at position 0)."""
    sd = chroma_state_dict(CFG, seed=3)
    model = Chroma(CFG).eval()
    model.load_state_dict(sd)
    g = torch.Generator().manual_seed(4)
    x, ctx = torch.randn(1, 16, 4, 4, generator=g), torch.randn(1, 6, 32, generator=g)
    mask = torch.tensor([[1.0, 1, 1, 1, 0, 0]])
    t = torch.tensor([0.5])
    with torch.no_grad():
        masked = model(x, t, ctx, txt_mask=mask)
        dropped = model(x, t, ctx[:, :4])
        unmasked = model(x, t, ctx)
    assert torch.allclose(masked, dropped, atol=1e-5) and not torch.allclose(masked, unmasked, atol=1e-4)


# ---------------------------------------------------------------------------------------------
# detection and sampling

import pytest  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

from mixgraph.graph.cache import OutputCache  # noqa: E402
from mixgraph.graph.env import Env  # noqa: E402
from mixgraph.graph.executor import Executor  # noqa: E402
from mixgraph.graph.precision import parse_spec  # noqa: E402
from mixgraph.nodes.families import refused  # noqa: E402
from mixgraph.nodes.models import loader  # noqa: E402
from mixgraph.nodes.payloads.conditioning import Cond  # noqa: E402
from mixgraph.ui import api  # noqa: E402
from tests.fixtures.checkpoints import write_clip_l  # noqa: E402


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("chroma_family")
    (root / "diffusion_models").mkdir()
    (root / "text_encoders").mkdir()
    sd = chroma_state_dict(CFG, seed=5)
    save_file(sd, str(root / "diffusion_models" / "chroma_tiny.safetensors"))
    with torch.device("meta"):
        keys = diffusers_chroma(CFG).state_dict().keys()
    diff = {k: v.contiguous() for k, v in diffusers_keys.to_diffusers(sd, keys, diffusers_keys.chroma_plan).items()}
    save_file(diff, str(root / "diffusion_models" / "chroma_tiny_diffusers.safetensors"))
    write_clip_l(root / "text_encoders" / "clip_l_tiny.safetensors", seed=4)
    return root


def test_chroma_is_detected_in_both_layouts(models):
    a = loader.load_unet(models / "diffusion_models" / "chroma_tiny.safetensors")
    b = loader.load_unet(models / "diffusion_models" / "chroma_tiny_diffusers.safetensors")
    assert (a.family, a.kind, a.config) == (b.family, b.kind, b.config) == ("flux", "chroma", CFG)
    assert b.source.layout == "diffusers_flux"
    assert a.sampling.shift_kind == "exponential" and a.sampling.shift == 1.15
    assert refused.detect_family({"double_blocks.0.img_attn.qkv.weight": (3, 1),
                                  "distilled_guidance_layer.in_proj.weight": (3, 1)}) == "Chroma"
    f32 = parse_spec("f32")
    ra, rb = a.runner(f32), b.runner(f32)
    text = torch.randn(1, 5, 32, generator=torch.Generator().manual_seed(1))
    inputs = ra.cond_inputs(Cond(text, pooled=torch.ones(1, 32)), (1, 16, 4, 4))
    assert set(inputs) == {"guidance"} and float(inputs["guidance"]) == 0.0  # no pooled vector; guidance 0
    masked = ra.cond_inputs(Cond(text, model_inputs={"attention_mask": torch.tensor([[1, 1, 1, 0, 0]])}),
                            (1, 16, 4, 4))
    assert masked["txt_mask"].tolist() == [[1, 1, 1, 0, 0]]
    x = torch.randn(1, 16, 4, 4)
    assert torch.allclose(ra(x, torch.tensor([0.5]), text, inputs), rb(x, torch.tensor([0.5]), text, inputs),
                          atol=1e-6)
    with pytest.raises(NotImplementedError, match="text-token mask"):
        ra.cond_inputs(Cond(text, model_inputs={"attention_mask": torch.ones(1, 4, 4)}), (1, 16, 4, 4))


def test_chroma_samples_with_a_negative(models):
    executor = Executor(api.default_registry(), Env.from_args(models=models), cache=OutputCache(max_bytes=1 << 30))
    prompt = {
        "1": {"class_type": "UNETLoader", "inputs": {"unet_name": "chroma_tiny.safetensors", "weight_dtype": "default"}},
        "2": {"class_type": "CLIPLoader", "inputs": {"clip_name": "clip_l_tiny.safetensors", "type": "stable_diffusion"}},
        "3": {"class_type": "CLIPTextEncode", "inputs": {"text": "a red cube", "clip": ["2", 0]}},
        "4": {"class_type": "CLIPTextEncode", "inputs": {"text": "blurry", "clip": ["2", 0]}},
        "6": {"class_type": "EmptySD3LatentImage", "inputs": {"width": 32, "height": 32, "batch_size": 1}},
        "7": {"class_type": "KSampler", "inputs": {
            "model": ["1", 0], "seed": 3, "steps": 2, "cfg": 3.0, "sampler_name": "euler",
            "scheduler": "simple", "positive": ["3", 0], "negative": ["4", 0], "latent_image": ["6", 0],
            "denoise": 1.0}},
        "s7": {"class_type": "SaveLatent", "inputs": {"samples": ["7", 0], "filename_prefix": "chroma/ks"}},
    }
    res = api.run(prompt, executor=executor, models=models, output=models / "out")
    ks = res.outputs["7"][0].samples
    assert ks.shape == (1, 16, 4, 4) and torch.isfinite(ks).all() and ks.abs().max() > 0
