"""SigLIP vision towers (Flux Redux's image encoder): recognised by CLIPVisionLoader beside the CLIP
ViTs, sizes from shapes, ComfyUI's preprocessing (mean / std 0.5), and the tower against
transformers' ``SiglipVisionModel`` on tiny seeded files in the real key layout."""

from __future__ import annotations

import pytest
import torch

from mixgraph.graph.precision import parse_spec
from mixgraph.nodes.encoders.clip_vision import clip_preprocess
from mixgraph.nodes.encoders.clip_vision_handle import load_clip_vision
from mixgraph.nodes.encoders.siglip_vision import SiglipVisionConfig, SiglipVisionModel, siglip_vision_rename
from mixgraph.ui import api
from tests.fixtures.tiny_vision import (
    SIGLIP_WIDTH, hf_siglip_config, siglip_vision_shapes, write_clip_vision, write_siglip_vision,
)

F32 = parse_spec("f32")


def _image(h: int, w: int, seed: int = 0, batch: int = 1) -> torch.Tensor:
    return torch.rand(batch, h, w, 3, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("siglip_models")
    write_siglip_vision(root / "clip_vision" / "siglip_tiny.safetensors", seed=1)
    # the so400m-patch14-384 geometry (27 x 27 patches of 14 px fed 384-px images), narrow and shallow
    write_siglip_vision(root / "clip_vision" / "siglip_384.safetensors", seed=2, width=32, layers=2, patch=14,
                        grid=27)
    write_clip_vision(root / "clip_vision" / "vit_tiny.safetensors", seed=3)
    return root


@pytest.mark.parametrize("patch, grid, image", [(14, 27, 384), (16, 32, 512)])
def test_siglip_config_of_the_real_towers_from_shapes(patch, grid, image):
    """ComfyUI's clip_vision_siglip_384.json / _512.json: width 1152, 27 layers, MLP 4304, 16 heads."""
    shapes = siglip_vision_shapes(width=1152, layers=27, patch=patch, grid=grid, mlp=4304)
    kept = {n: s for k, s in shapes.items() if (n := siglip_vision_rename(k)) is not None}
    cfg = SiglipVisionConfig.from_shapes(kept)
    assert (cfg.width, cfg.layers, cfg.intermediate, cfg.heads) == (1152, 27, 4304, 16)
    assert (cfg.patch_size, cfg.grid, cfg.image_size, cfg.num_positions) == (patch, grid, image, grid * grid)
    assert not any(".head." in k for k in kept)


def test_clip_vision_loader_tells_siglip_from_clip(models):
    sig = load_clip_vision(models / "clip_vision" / "siglip_tiny.safetensors")
    vit = load_clip_vision(models / "clip_vision" / "vit_tiny.safetensors")
    assert isinstance(sig.config, SiglipVisionConfig) and sig.source.layout == "hf_siglip_vision"
    assert (sig.config.width, sig.config.layers, sig.config.image_size) == (SIGLIP_WIDTH, 3, 32)
    assert vit.source.layout == "hf_clip_vision" and not isinstance(vit.config, SiglipVisionConfig)


def test_siglip_preprocess_uses_mean_and_std_one_half():
    image = _image(32, 32, seed=4)
    expected = ((image.movedim(-1, 1) * 255).round() / 255 - 0.5) / 0.5
    got = clip_preprocess(image, 32, True, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("name, size", [("siglip_tiny", 32), ("siglip_384", 384)])
def test_siglip_tower_matches_transformers(models, name, size):
    from safetensors.torch import load_file
    from transformers import SiglipVisionModel as Reference

    path = models / "clip_vision" / f"{name}.safetensors"
    sd = load_file(str(path))
    handle = load_clip_vision(path)
    c = handle.config
    assert c.image_size == size
    # transformers is told the 384 input too (384 // 14 = 27 patches a side, the last 6 px unread)
    ref = Reference(hf_siglip_config(c.width, c.layers, c.patch_size, c.grid, image=size)).eval()
    # transformers 5 keeps the tower at the top level (its from_pretrained strips the files' prefix)
    missing, unexpected = ref.load_state_dict({k.removeprefix("vision_model."): v for k, v in sd.items()},
                                              strict=False)
    assert not unexpected and not missing  # the file is exactly transformers' layout, head included
    image = _image(size + 7, size - 5, seed=5, batch=2)  # not square: CLIPVisionEncode's centre crop
    out = handle.encode(image, F32, crop=True)
    with torch.no_grad():
        r = ref(pixel_values=clip_preprocess(image, size, True, (0.5,) * 3, (0.5,) * 3), output_hidden_states=True)
    n = c.grid * c.grid
    assert out.last_hidden_state.shape == (2, n, c.width)  # no class token
    torch.testing.assert_close(out.last_hidden_state, r.last_hidden_state, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out.penultimate_hidden_states, r.hidden_states[-2], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out.all_hidden_states, torch.stack(r.hidden_states[1:], dim=1), rtol=1e-4, atol=1e-4)
    assert torch.equal(out.image_embeds, out.last_hidden_state)  # ComfyUI: no projection, no pooling
    assert set(SiglipVisionModel(c).state_dict()) == {k for k in sd if ".head." not in k}


def test_siglip_through_the_clip_vision_nodes(models, tmp_path):
    from PIL import Image
    import numpy as np

    (tmp_path / "in").mkdir()
    arr = (_image(40, 30, seed=6)[0].numpy() * 255).round().astype(np.uint8)
    Image.fromarray(arr).save(tmp_path / "in" / "ref.png")
    g = api.Graph(precision="f32")
    cv = g.add("CLIPVisionLoader", clip_name="siglip_tiny.safetensors")
    enc = g.add("CLIPVisionEncode", clip_vision=cv, image=g.add("LoadImage", image="ref.png"), crop="none")
    g.add("PreviewAny", source=enc)
    out = api.run(g, models=models, input=tmp_path / "in", output=tmp_path / "out")
    got = out[enc.node_id][0]
    image = torch.from_numpy(arr.astype(np.float32) / 255.0)[None]
    want = load_clip_vision(models / "clip_vision" / "siglip_tiny.safetensors").encode(image, F32, crop=False)
    torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state, rtol=1e-5, atol=1e-5)
    assert got["all_hidden_states"].shape == (1, 3, 16, SIGLIP_WIDTH)
