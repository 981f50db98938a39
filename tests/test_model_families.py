"""Files of model families other than SD 1.x / 2.x / SDXL are refused with "model family X is not
supported", at validation (safetensors header / model_index.json only) and at load time; tiny fake
files carry the families' characteristic keys."""

import json

import pytest
import torch
from safetensors.torch import save_file

from mixgraph.graph.executor import ValidationFailed
from mixgraph.nodes.families import refused as families
from mixgraph.nodes.models import loader
from mixgraph.ui import api

T = torch.zeros(1)

FAKE = {  # family -> (folder, keys)
    "Flux": ("diffusion_models", ["double_blocks.0.img_attn.qkv.weight", "single_blocks.0.linear1.weight"]),
    "SD3 / SD3.5": ("checkpoints", ["model.diffusion_model.joint_blocks.0.context_block.attn.qkv.weight",
                                    "first_stage_model.decoder.conv_in.weight"]),
    "Hunyuan Video": ("diffusion_models", ["double_blocks.0.img_attn.qkv.weight",
                                           "txt_in.individual_token_refiner.blocks.0.norm1.weight"]),
    "AuraFlow": ("diffusion_models", ["double_layers.0.attn.w1q.weight"]),
    "HunyuanDiT": ("checkpoints", ["model.mlp_t5.0.weight"]),
    "Wan": ("diffusion_models", ["model.diffusion_model.head.modulation",
                                 "model.diffusion_model.patch_embedding.weight"]),
    "Mochi": ("diffusion_models", ["t5_yproj.weight"]),
    "Stable Audio": ("checkpoints", ["model.model.transformer.rotary_pos_emb.inv_freq"]),
    "Stable Cascade": ("diffusion_models", ["clf.1.weight"]),
    "PixArt": ("diffusion_models", ["t_block.1.weight"]),
    "LTX-Video": ("checkpoints", ["model.diffusion_model.adaln_single.emb.timestep_embedder.linear_1.bias",
                                  "model.diffusion_model.caption_projection.linear_1.weight"]),
    "Cosmos": ("diffusion_models", ["net.x_embedder.proj.1.weight"]),
}


def _write(path, keys, shapes=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: torch.zeros(*(shapes or {}).get(k, (1,))) for k in keys}, str(path))
    return path


@pytest.mark.parametrize("family", sorted(FAKE))
def test_detect_family_from_characteristic_keys(family, tmp_path):
    folder, keys = FAKE[family]
    path = _write(tmp_path / "f.safetensors", keys)
    assert families.family_of_file(path) == family


def test_sd_files_are_not_refused(tmp_path):
    from tests.fixtures.checkpoints import write_sd15, write_vae
    write_sd15(tmp_path / "sd15.safetensors", seed=0)
    write_vae(tmp_path / "vae.safetensors")
    assert families.family_of_file(tmp_path / "sd15.safetensors") is None
    assert families.family_of_file(tmp_path / "vae.safetensors") is None
    assert families.family_of_file(tmp_path / "missing.safetensors") is None


def test_refusal_message_names_the_family():
    assert families.refusal("Wan", "x.safetensors") == \
        f"x.safetensors: model family Wan is not supported (mixgraph runs {families.supported()})"
    assert "SD 1.x, SD 2.x and SDXL" in families.supported()


def test_vae_and_text_encoder_families(tmp_path):
    flux_vae = _write(tmp_path / "ae.safetensors", ["decoder.conv_in.weight", "encoder.conv_in.weight"],
                      {"decoder.conv_in.weight": (4, 16, 3, 3)})
    assert families.family_of_file(flux_vae) is None  # the Flux family runs it (its ``refusals``)
    video_vae = _write(tmp_path / "v.safetensors", ["decoder.conv_in.weight"], {"decoder.conv_in.weight": (4, 8, 3, 3, 3)})
    assert families.family_of_file(video_vae) == "video model (3-D VAE)"
    t5 = _write(tmp_path / "t5.safetensors", ["encoder.block.0.layer.0.SelfAttention.q.weight"])
    assert families.family_of_file(t5).startswith("T5 text encoder")
    llm = _write(tmp_path / "llm.safetensors", ["model.layers.0.self_attn.q_proj.weight"])
    assert families.family_of_file(llm).startswith("LLM text encoder")


def test_diffusers_folder_family(tmp_path):
    (tmp_path / "hv").mkdir()
    (tmp_path / "hv" / "model_index.json").write_text(json.dumps({"_class_name": "HunyuanVideoPipeline"}))
    assert families.family_of_file(tmp_path / "hv") == "Hunyuan Video"
    with pytest.raises(NotImplementedError, match="model family Hunyuan Video is not supported"):
        loader.load_checkpoint(tmp_path / "hv")
    (tmp_path / "flux").mkdir()  # a family that runs the row's files: the loader checks the model itself
    (tmp_path / "flux" / "model_index.json").write_text(json.dumps({"_class_name": "FluxPipeline"}))
    assert families.family_of_file(tmp_path / "flux") is None


def test_loaders_refuse_at_load_time(tmp_path):
    hv = _write(tmp_path / "hv.safetensors", FAKE["Hunyuan Video"][1])
    sd3 = _write(tmp_path / "sd3.safetensors", FAKE["SD3 / SD3.5"][1])
    with pytest.raises(NotImplementedError, match=r"hv.safetensors: model family Hunyuan Video is not supported \("):
        loader.load_unet(hv)
    with pytest.raises(NotImplementedError, match="model family SD3 / SD3.5 is not supported"):
        loader.load_checkpoint(sd3)
    t5 = _write(tmp_path / "t5.safetensors", ["encoder.block.0.layer.0.SelfAttention.q.weight"])
    with pytest.raises(NotImplementedError, match="model family T5 text encoder"):
        loader.load_clip([t5])
    ae = _write(tmp_path / "ae.safetensors", ["decoder.conv_in.weight"], {"decoder.conv_in.weight": (4, 8, 3, 3, 3)})
    with pytest.raises(NotImplementedError, match="3-D VAE"):
        loader.load_vae(ae)


def _validation_error(graph, models):
    with pytest.raises(ValidationFailed) as e:
        api.run(graph, models=models)
    return str(e.value) + "\n" + "\n".join(str(p) for p in getattr(e.value.report, "problems", ()))


def _sampling_graph(model, clip, vae):
    """model/clip/vae: (class, inputs, output slot)."""
    g = api.Graph()
    m = g.add(model[0], **model[1])[model[2]]
    c = g.add(clip[0], **clip[1])[clip[2]]
    v = g.add(vae[0], **vae[1])[vae[2]]
    cond = g.add("CLIPTextEncode", text="a", clip=c)
    lat = g.add("EmptyLatentImage", width=64, height=64, batch_size=1)
    ks = g.add("KSampler", model=m, seed=0, steps=1, cfg=1.0, sampler_name="euler", scheduler="normal",
               positive=cond, negative=cond, latent_image=lat, denoise=1.0)
    g.add("PreviewImage", images=g.add("VAEDecode", samples=ks, vae=v))
    return g


CKPT = ("CheckpointLoaderSimple", {"ckpt_name": "none.safetensors"})


@pytest.mark.parametrize("family", ["Hunyuan Video", "SD3 / SD3.5", "Wan", "Stable Audio"])
def test_loader_nodes_refuse_at_validation(family, tmp_path):
    folder, keys = FAKE[family]
    _write(tmp_path / folder / "other.safetensors", keys)
    if folder == "checkpoints":
        model = ("CheckpointLoaderSimple", {"ckpt_name": "other.safetensors"}, 0)
    else:
        model = ("UNETLoader", {"unet_name": "other.safetensors", "weight_dtype": "default"}, 0)
    text = _validation_error(_sampling_graph(model, CKPT + (1,), CKPT + (2,)), tmp_path)
    assert f"model family {family} is not supported (mixgraph runs {families.supported()})" in text


def test_vae_loader_refuses_at_validation(tmp_path):
    _write(tmp_path / "vae" / "ae.safetensors", ["decoder.conv_in.weight"], {"decoder.conv_in.weight": (4, 8, 3, 3, 3)})
    text = _validation_error(_sampling_graph(CKPT + (0,), CKPT + (1,), ("VAELoader", {"vae_name": "ae.safetensors"}, 0)),
                             tmp_path)
    assert "model family video model (3-D VAE) is not supported" in text


def test_clip_loaders_refuse_other_family_types_and_files(tmp_path):
    _write(tmp_path / "text_encoders" / "umt5.safetensors", ["encoder.blocks.0.attn.q.weight"])
    _write(tmp_path / "text_encoders" / "l.safetensors", ["text_model.embeddings.token_embedding.weight"])
    for cls, inputs, needle in (
        ("CLIPLoader", {"clip_name": "l.safetensors", "type": "ltxv"},
         "CLIP type 'ltxv': model family LTX-Video is not supported"),
        ("DualCLIPLoader", {"clip_name1": "l.safetensors", "clip_name2": "umt5.safetensors", "type": "hunyuan_video"},
         "CLIP type 'hunyuan_video': model family Hunyuan Video is not supported"),
        ("CLIPLoader", {"clip_name": "umt5.safetensors", "type": "stable_diffusion"},
         "model family T5 text encoder"),
        ("DualCLIPLoader", {"clip_name1": "l.safetensors", "clip_name2": "umt5.safetensors", "type": "sdxl"},
         "clip_name2 'umt5.safetensors': model family T5 text encoder"),
    ):
        text = _validation_error(_sampling_graph(CKPT + (0,), (cls, inputs, 0), CKPT + (2,)), tmp_path)
        assert needle in text, text
