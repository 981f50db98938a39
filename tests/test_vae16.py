"""The 16-channel autoencoder of Flux / SD3 (and Chroma, Z-Image, Lumina 2) is the KL VAE with a
16-channel latent, sized from shapes: Flux's ``ae.safetensors`` (bare ``encoder.*`` / ``decoder.*``
keys, no quant convs) and a 16-channel VAE with quant convs inside a checkpoint
(``first_stage_model.*``) against diffusers' AutoencoderKL on the same weights; VAELoader on the
file and on a diffusers ``vae/`` folder; VAEEncode / VAEDecode through ``mixgraph.ui.api``."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from mixgraph.graph.precision import parse_spec
from mixgraph.nodes.families.refused import detect_family
from mixgraph.nodes.models import loader
from mixgraph.nodes.vae.vae import AutoencoderKL, VAEConfig
from mixgraph.nodes.weights.safetensors_io import inspect_file
from mixgraph.nodes.weights.store import WeightStore
from mixgraph.nodes.weights.synthetic import module_shapes, random_state_dict
from mixgraph.ui import api
from tests.fixtures.checkpoints import vae_diffusers_config, vae_to_diffusers

F32 = parse_spec("f32")
# Flux's AE: z 16, no quant convs (ch 128, ch_mult 1 2 4 4, 2 ResBlocks at full size)
FLUX_AE = VAEConfig(ch=32, ch_mult=(1, 1, 2, 2), num_res_blocks=1, z_channels=16, embed_dim=16, use_quant_conv=False)
# a 16-channel VAE with quant convs, as a checkpoint's first_stage_model may keep one
QUANT_AE = VAEConfig(ch=32, ch_mult=(1, 1, 2, 2), num_res_blocks=1, z_channels=16, embed_dim=16, use_quant_conv=True)


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _ldm(config: VAEConfig, seed: int) -> dict[str, torch.Tensor]:
    return random_state_dict(module_shapes(lambda: AutoencoderKL(config)), seed)


def _diffusers_sd(sd: dict, config: VAEConfig) -> dict[str, torch.Tensor]:
    """diffusers' own LDM -> diffusers conversion (an independent key map); it always maps the
    quant convs, so a VAE without them passes through with placeholders that are dropped after."""
    filled = dict(sd)
    if not config.use_quant_conv:
        c = 2 * config.z_channels
        filled |= {"quant_conv.weight": torch.zeros(c, c, 1, 1), "quant_conv.bias": torch.zeros(c),
                   "post_quant_conv.weight": torch.zeros(config.z_channels, config.z_channels, 1, 1),
                   "post_quant_conv.bias": torch.zeros(config.z_channels)}
    out = vae_to_diffusers(filled, config)
    if not config.use_quant_conv:
        out = {k: v for k, v in out.items() if "quant_conv" not in k}
    return {k: v.contiguous() for k, v in out.items()}


def _diffusers_config(config: VAEConfig) -> dict:
    return {**vae_diffusers_config(config), "latent_channels": 16, "use_quant_conv": config.use_quant_conv,
            "use_post_quant_conv": config.use_quant_conv}


def _reference(sd: dict, config: VAEConfig):
    from diffusers import AutoencoderKL as DiffusersAE

    m = DiffusersAE(**{k: v for k, v in _diffusers_config(config).items() if not k.startswith("_")})
    m.load_state_dict(_diffusers_sd(sd, config), strict=True)
    return m.eval()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("vae16")
    (root / "vae").mkdir()
    flux = _ldm(FLUX_AE, 11)
    save_file({k: v.contiguous() for k, v in flux.items()}, str(root / "vae" / "ae.safetensors"))
    quant = _ldm(QUANT_AE, 12)
    save_file({"first_stage_model." + k: v.contiguous() for k, v in quant.items()},
              str(root / "vae" / "sd3_like_vae.safetensors"))
    folder = root / "vae" / "flux_vae_diffusers"
    (folder / "vae").mkdir(parents=True)
    save_file(_diffusers_sd(flux, FLUX_AE), str(folder / "vae" / "diffusion_pytorch_model.safetensors"))
    (folder / "vae" / "config.json").write_text(json.dumps(_diffusers_config(FLUX_AE)))
    return {"root": root, "flux": flux, "quant": quant}


@pytest.mark.parametrize("name,config", [("flux", FLUX_AE), ("quant", QUANT_AE)])
def test_16_channel_vae_matches_diffusers(files, name, config):
    sd = files[name]
    assert VAEConfig.from_state_dict(sd) == config and config.latent_channels == 16
    ours = AutoencoderKL(config)
    ours.load_state_dict(sd, strict=True)
    ours.eval()
    ref = _reference(sd, config)
    g = torch.Generator().manual_seed(3)
    x = torch.rand(2, 3, 64, 48, generator=g) * 2 - 1
    z = torch.randn(2, 16, 8, 6, generator=g)
    with torch.no_grad():
        got_z, want_z = ours.encode(x), ref.encode(x).latent_dist.mean
        got_x, want_x = ours.decode(z), ref.decode(z).sample
    assert got_z.shape == (2, 16, 8, 6) and got_x.shape == (2, 3, 64, 48)
    torch.testing.assert_close(got_z, want_z, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got_x, want_x, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("path,config", [("ae.safetensors", FLUX_AE), ("sd3_like_vae.safetensors", QUANT_AE),
                                         ("flux_vae_diffusers", FLUX_AE)])
def test_vaeloader_loads_16_channel_files(files, path, config):
    p = files["root"] / "vae" / path
    if p.is_file():
        assert detect_family(inspect_file(p)) is None  # not refused: the KL VAE runs it
    vae = loader.load_vae(p)
    assert vae.config == config and vae.latent_channels == 16
    want = files["flux" if config is FLUX_AE else "quant"]
    got = WeightStore().materialize("vae", vae.source, vae.config, torch.float32, (), AutoencoderKL).state_dict()
    assert set(got) == set(want)
    for k, v in want.items():
        assert torch.equal(got[k].reshape(v.shape), v), k


def test_standalone_16_channel_vae_latent_format_is_channel_width_only(files):
    """A VAE file alone does not say whether it is Flux's or SD3's (ComfyUI's VAE detection in
    comfy/sd.py takes both through one branch, 16 latent channels from ``decoder.conv_in``, and
    keeps no latent format on a VAE: the model's format scales latents in the sampler and drives
    previews). So a standalone 16-channel VAE gets a 16-channel format without preview factors."""
    vae = loader.load_vae(files["root"] / "vae" / "ae.safetensors")
    fmt = vae.latent_format
    assert fmt.channels == 16 and fmt.latent_rgb_factors is None and fmt.taesd_decoder_name is None


def _workflow(vae_name: str) -> dict:
    return {
        "1": {"class_type": "VAELoader", "inputs": {"vae_name": vae_name}},
        "2": {"class_type": "LoadImage", "inputs": {"image": "noise.png"}},
        "3": {"class_type": "VAEEncode", "inputs": {"pixels": ["2", 0], "vae": ["1", 0]}},
        "4": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["1", 0]}},
        "5": {"class_type": "PreviewImage", "inputs": {"images": ["4", 0]}},
    }


@pytest.mark.parametrize("name,config", [("ae.safetensors", FLUX_AE), ("sd3_like_vae.safetensors", QUANT_AE)])
def test_vae_encode_decode_16_channel_latents_through_the_api(files, name, config):
    """LATENT samples are raw VAE space (ComfyUI: the model's latent format is the sampler's):
    VAEEncode gives the posterior mean of the 16-channel latent, VAEDecode its image."""
    from PIL import Image

    g = torch.Generator().manual_seed(9)
    rgb = (torch.rand(48, 64, 3, generator=g) * 255).round().to(torch.uint8)  # a textured image: a flat
    (files["root"] / "input").mkdir(exist_ok=True)  # one would feed GroupNorm near-zero variances
    Image.fromarray(rgb.numpy()).save(files["root"] / "input" / "noise.png")
    res = api.run(_workflow(name), models=files["root"], input=files["root"] / "input",
                  output=files["root"] / "out", precision="f32")
    latent = res.outputs["3"][0].samples
    image = res.outputs["4"][0]
    assert latent.shape == (1, 16, 6, 8) and image.shape == (1, 48, 64, 3)
    sd = files["flux" if config is FLUX_AE else "quant"]
    ref = _reference(sd, config)
    pixels = (rgb.float() / 255.0).unsqueeze(0).permute(0, 3, 1, 2) * 2 - 1  # [1,H,W,3] -> [1,3,H,W]
    with torch.no_grad():
        want_z = ref.encode(pixels).latent_dist.mean
        want_x = ((ref.decode(want_z).sample + 1) / 2).clamp(0, 1).permute(0, 2, 3, 1)
    torch.testing.assert_close(latent, want_z, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(image, want_x, atol=1e-4, rtol=1e-4)
