"""CLIP loading for the DiT sets: CLIPLoader / DualCLIPLoader / TripleCLIPLoader with a family's
``clip_types``, checkpoint-bundled T5, the Flux / SD3 / Chroma joins against transformers' CLIP
and T5 on the same tiny weights, and CLIPTextEncodeFlux / CLIPTextEncodeSD3 through workflows.

The family is test-only (the toy flow transformer of ``tests/toy_family.py`` under another name,
whose text encoders are Flux's / SD3's / Chroma's sets), so these tests need no real family."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from mixgraph.nodes.encoders.dit_joins import CHROMA_RULES, FLUX_RULES, SD3_RULES
from mixgraph.nodes.encoders.encoder_set import get_tokenizer
from mixgraph.nodes.encoders.t5 import T5EncoderModel
from mixgraph.nodes.encoders.tokenizer import END_TOKEN, START_TOKEN
from mixgraph.nodes.families import registry as families
from mixgraph.nodes.families.base import Detection, TextEncoderSlot
from mixgraph.nodes.models import loader
from mixgraph.ui import api
from tests.fixtures.tiny_clip import tiny_clip_l_hf_config, tiny_clip_l_state_dict
from tests.fixtures.tiny_t5 import hf_t5, tiny_t5_state_dict
from tests.toy_family import ToyConfig, ToyFamily, toy_state_dict

transformers = pytest.importorskip("transformers")

T5_PREFIX = "text_encoders.t5xxl.transformer."
CLIP_L_PREFIX = "text_encoders.clip_l.transformer."
CLIP_G_PREFIX = "text_encoders.clip_g.transformer."
L_WIDTH, G_WIDTH, T5_WIDTH = 32, 48, 96
CFG = ToyConfig(context_dim=T5_WIDTH, pooled_dim=L_WIDTH)


def _slot(name, rule, encoding, optional=False):
    arch, tokenizer = ("t5", "t5") if name == "t5xxl" else ("clip", "clip")
    prefix = {"t5xxl": T5_PREFIX, "clip_l": CLIP_L_PREFIX, "clip_g": CLIP_G_PREFIX}[name]
    return TextEncoderSlot(name, tokenizer, "text", prefix=prefix, layout="hf_clip" if arch == "clip" else "",
                           encoding=encoding, rule=rule, arch=arch, optional=optional)


class DiTToy(ToyFamily):
    """The toy flow transformer with the DiT text-encoder sets: its checkpoints are "flux"
    (CLIP-L + T5 bundled under ComfyUI's prefixes), or "sd3" when they hold a CLIP-G."""

    name = "dit_toy"
    display = "DiT toy (tests)"
    clip_types = {"flux": "flux", "sd3": "sd3", "chroma": "chroma"}

    def detect(self, info, read=None, source=None):
        found = super().detect(info, read, source)
        variant = "sd3" if any(k.startswith(CLIP_G_PREFIX) for k in info) else "flux"
        return None if found is None else Detection(self.name, variant, found.config, found.fields)

    def text_encoders(self, variant):
        if variant == "flux":
            return tuple(_slot(n, FLUX_RULES[n], "flux") for n in ("clip_l", "t5xxl"))
        if variant == "sd3":
            return tuple(_slot(n, SD3_RULES[n], "sd3", optional=True) for n in ("clip_l", "clip_g", "t5xxl"))
        if variant == "chroma":
            return (_slot("t5xxl", CHROMA_RULES["t5xxl"], "chroma"),)
        raise ValueError(variant)


FAMILY = DiTToy()


@pytest.fixture(scope="module", autouse=True)
def registered():
    families.register(FAMILY)
    yield
    families.unregister(FAMILY.name)


def _save(path, sd):
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in sd.items()}, str(path))
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("dit_clip")
    te = root / "text_encoders"
    sds = {"clip_l": tiny_clip_l_state_dict(4, width=L_WIDTH, proj=L_WIDTH),
           "clip_g": tiny_clip_l_state_dict(5, width=G_WIDTH, proj=G_WIDTH),
           "t5": tiny_t5_state_dict(6, d_model=T5_WIDTH)}
    _save(te / "clip_l.safetensors", sds["clip_l"])
    _save(te / "clip_g.safetensors", sds["clip_g"])
    _save(te / "t5xxl.safetensors", sds["t5"])
    ckpt = {"model.diffusion_model." + k: v for k, v in toy_state_dict(CFG, seed=3).items()}
    ckpt |= {CLIP_L_PREFIX + k: v for k, v in sds["clip_l"].items()}
    ckpt |= {T5_PREFIX + k: v for k, v in sds["t5"].items()}
    _save(root / "checkpoints" / "dit_toy.safetensors", ckpt)
    sd3 = {k: v for k, v in ckpt.items() if not k.startswith(T5_PREFIX)}  # SD3 "incl. clips", no T5
    sd3 |= {CLIP_G_PREFIX + k: v for k, v in sds["clip_g"].items()}
    _save(root / "checkpoints" / "sd3_no_t5.safetensors", sd3)
    return root, sds


# ---------------------------------------------------------------------------------------------
# references: transformers' models on the same weights, tokens as ComfyUI makes them


def _hf_clip(sd, width, act):
    from transformers import CLIPTextModelWithProjection

    model = CLIPTextModelWithProjection(tiny_clip_l_hf_config(width=width, layers=3, proj=width, act=act))
    model.load_state_dict(sd, strict=False)
    return model.eval()


def _clip_ids(text, pad):
    ids = get_tokenizer("clip").encode(text)
    row = [START_TOKEN, *ids, END_TOKEN]
    return torch.tensor([row + [pad] * (77 - len(row))])


def _t5_ids(text, min_length):
    row = get_tokenizer("t5")(text)
    return torch.tensor([row + [0] * max(0, min_length - len(row))])


def _run(graph, models, *shown):
    """Run ``graph`` in f32 (the references are f32; T5's own `balanced` default stores bf16),
    each node of ``shown`` kept by a PreviewAny (an output node)."""
    for ref in shown:
        graph.add("PreviewAny", source=ref)
    return api.run(graph, models=models[0], output=models[0] / "out", precision="f32").outputs


# ---------------------------------------------------------------------------------------------
# loading


def test_dual_clip_loader_flux_assigns_by_architecture(models):
    root, _ = models
    te = root / "text_encoders"
    for order in ((te / "t5xxl.safetensors", te / "clip_l.safetensors"),
                  (te / "clip_l.safetensors", te / "t5xxl.safetensors")):
        clip = loader.load_clip(list(order), "flux")
        assert clip.kind == "flux" and clip.names == ("clip_l", "t5xxl")
        t5 = clip.encoder("t5xxl")
        assert t5.build is T5EncoderModel and t5.tokenizer == "t5" and t5.config.width == T5_WIDTH
        assert t5.source.prefix == "" and clip.encoder("clip_l").config.activation == "quick_gelu"


def test_triple_and_single_loaders_sd3_and_chroma(models):
    root, _ = models
    te = root / "text_encoders"
    triple = loader.load_clip([te / "t5xxl.safetensors", te / "clip_g.safetensors", te / "clip_l.safetensors"], "sd3")
    assert triple.kind == "sd3" and triple.names == ("clip_l", "clip_g", "t5xxl")
    assert triple.encoder("clip_g").config.width == G_WIDTH and triple.encoder("clip_g").config.activation == "gelu"
    only_t5 = loader.load_clip([te / "t5xxl.safetensors"], "sd3")
    assert only_t5.names == ("t5xxl",)
    assert loader.load_clip([te / "t5xxl.safetensors"], "chroma").kind == "chroma"


def test_clip_loading_errors_name_the_file_and_what_the_type_expects(models):
    root, _ = models
    te = root / "text_encoders"
    with pytest.raises(ValueError, match=r"CLIP type 'flux' needs t5xxl \(t5\), which the files given "
                                         r"\(clip_l.safetensors\) do not hold; CLIP type 'flux' takes clip_l"):
        loader.load_clip([te / "clip_l.safetensors"], "flux")
    with pytest.raises(ValueError, match=r"clip_g.safetensors: a clip text encoder that fits no slot"):
        loader.load_clip([te / "clip_l.safetensors", te / "clip_g.safetensors"], "flux")
    with pytest.raises(ValueError, match=r"clip_l.safetensors: a clip text encoder that fits no slot; "
                                         r"CLIP type 'chroma' takes t5xxl \(t5\)"):
        loader.load_clip([te / "clip_l.safetensors"], "chroma")
    with pytest.raises(NotImplementedError, match="CLIP type 'ltxv': not supported yet"):
        loader.load_clip([te / "t5xxl.safetensors"], "ltxv")


def test_sd_types_keep_their_behaviour(models):
    root, _ = models
    te = root / "text_encoders"
    sd1 = loader.load_clip([te / "clip_l.safetensors"], "stable_diffusion")
    assert (sd1.kind, sd1.names) == ("sd1", ("clip_l",))
    with pytest.raises(ValueError, match="not a CLIP text encoder"):
        loader.load_clip([te / "t5xxl.safetensors"], "stable_diffusion")


def test_t5_files_are_refused_until_a_family_runs_them(models):
    from mixgraph.nodes.families import refused

    t5 = models[0] / "text_encoders" / "t5xxl.safetensors"
    assert refused.family_of_file(t5) is None
    with_t5 = [f for f in list(families.FAMILIES.values())
               if any(s.arch == "t5" for v in (getattr(f, "clip_types", None) or {}).values()
                      for s in f.text_encoders(v))]
    assert FAMILY in with_t5
    saved = dict(families.FAMILIES)
    for f in with_t5:
        families.unregister(f.name)
    try:
        assert refused.family_of_file(t5).startswith("T5 text encoder")
    finally:
        families.FAMILIES.clear()
        families.FAMILIES.update(saved)


def test_checkpoint_bundled_t5(models):
    root, _ = models
    model, clip, vae = loader.load_checkpoint(root / "checkpoints" / "dit_toy.safetensors")
    assert model.family == "dit_toy" and vae is None
    assert clip.kind == "flux" and clip.names == ("clip_l", "t5xxl")
    assert clip.encoder("t5xxl").source.prefix == T5_PREFIX and clip.encoder("t5xxl").config.width == T5_WIDTH
    # SD3's encoders are optional: a checkpoint without T5 gives a CLIP of the two CLIPs
    _, sd3, _ = loader.load_checkpoint(root / "checkpoints" / "sd3_no_t5.safetensors")
    assert sd3.kind == "sd3" and sd3.names == ("clip_l", "clip_g")
    assert sd3.encoder("clip_g").source.prefix == CLIP_G_PREFIX and sd3.encoder("clip_g").config.width == G_WIDTH


# ---------------------------------------------------------------------------------------------
# joins and nodes, against transformers


def test_flux_join_and_clip_text_encode_flux(models):
    root, sds = models
    g = api.Graph()
    clip = g.add("DualCLIPLoader", clip_name1="t5xxl.safetensors", clip_name2="clip_l.safetensors", type="flux")[0]
    enc = g.add("CLIPTextEncodeFlux", clip=clip, clip_l="a red cube", t5xxl="a red cube on a table", guidance=2.5)
    plain = g.add("CLIPTextEncode", clip=clip, text="a red cube")
    out = _run(g, models, enc, plain)
    (cond,), (plain_cond,) = out[enc.node_id][0], out[plain.node_id][0]
    with torch.no_grad():
        t5 = hf_t5(sds["t5"])(input_ids=_t5_ids("a red cube on a table", 256)).last_hidden_state
        clip_l = _hf_clip(sds["clip_l"], L_WIDTH, "quick_gelu")(input_ids=_clip_ids("a red cube", END_TOKEN),
                                                                 output_hidden_states=True)
    assert cond.cross_attn.shape == (1, 256, T5_WIDTH) and cond.pooled.shape == (1, L_WIDTH)
    assert torch.allclose(cond.cross_attn, t5, atol=1e-5, rtol=1e-4)
    # Flux's CLIP-L: the unprojected pooled output of its last, normed layer
    pooled = clip_l.last_hidden_state[0, (_clip_ids("a red cube", END_TOKEN)[0] == END_TOKEN).nonzero()[0, 0]]
    assert torch.allclose(cond.pooled[0], pooled, atol=1e-5, rtol=1e-4)
    assert cond.model_inputs == {"guidance": 2.5}
    assert plain_cond.model_inputs == {} and plain_cond.cross_attn.shape == (1, 256, T5_WIDTH)


def test_sd3_join_and_clip_text_encode_sd3(models):
    root, sds = models
    g = api.Graph()
    clip = g.add("TripleCLIPLoader", clip_name1="clip_g.safetensors", clip_name2="t5xxl.safetensors",
                 clip_name3="clip_l.safetensors")[0]
    enc = g.add("CLIPTextEncodeSD3", clip=clip, clip_l="a cat", clip_g="a dog", t5xxl="a bird",
                empty_padding="none")
    no_t5 = g.add("CLIPTextEncodeSD3", clip=clip, clip_l="a cat", clip_g="a dog", t5xxl="", empty_padding="none")
    no_clip = g.add("CLIPTextEncodeSD3", clip=clip, clip_l="", clip_g="", t5xxl="a bird", empty_padding="none")
    padded = g.add("CLIPTextEncodeSD3", clip=clip, clip_l="", clip_g="", t5xxl="", empty_padding="empty_prompt")
    out = _run(g, models, enc, no_t5, no_clip, padded)
    with torch.no_grad():
        l = _hf_clip(sds["clip_l"], L_WIDTH, "quick_gelu")(input_ids=_clip_ids("a cat", END_TOKEN),
                                                            output_hidden_states=True)
        g_ = _hf_clip(sds["clip_g"], G_WIDTH, "gelu")(input_ids=_clip_ids("a dog", 0), output_hidden_states=True)
        t5 = hf_t5(sds["t5"])(input_ids=_t5_ids("a bird", 77)).last_hidden_state
    l_end = (_clip_ids("a cat", END_TOKEN)[0] == END_TOKEN).nonzero()[0, 0]
    l_pooled = l.last_hidden_state[0, l_end]  # unprojected
    g_pooled = g_.text_embeds[0]  # projected
    lg = torch.cat([l.hidden_states[-2], g_.hidden_states[-2]], dim=-1)  # [1, 77, 32 + 48]
    lg = torch.nn.functional.pad(lg, (0, T5_WIDTH - lg.shape[-1]))  # zeros up to the T5 width
    (cond,) = out[enc.node_id][0]
    assert cond.cross_attn.shape == (1, 77 + 77, T5_WIDTH) and cond.pooled.shape == (1, L_WIDTH + G_WIDTH)
    assert torch.allclose(cond.cross_attn, torch.cat([lg, t5], dim=1), atol=1e-5, rtol=1e-4)
    assert torch.equal(cond.cross_attn[0, :77, L_WIDTH + G_WIDTH:], torch.zeros(77, T5_WIDTH - L_WIDTH - G_WIDTH))
    assert torch.allclose(cond.pooled[0], torch.cat([l_pooled, g_pooled]), atol=1e-5, rtol=1e-4)
    with torch.no_grad():
        t5_end = hf_t5(sds["t5"])(input_ids=torch.tensor([[1]])).last_hidden_state  # [1, 1, W]
    (c_no_t5,) = out[no_t5.node_id][0]  # "none": T5 encodes the end token alone (ComfyUI)
    assert torch.allclose(c_no_t5.cross_attn, torch.cat([lg, t5_end], dim=1), atol=1e-5, rtol=1e-4)
    (c_no_clip,) = out[no_clip.node_id][0]  # "none" with both CLIP prompts empty: T5's tokens alone
    assert torch.allclose(c_no_clip.cross_attn, t5, atol=1e-5, rtol=1e-4)
    assert torch.equal(c_no_clip.pooled, torch.zeros(1, 768 + 1280))  # ComfyUI's zeros
    (c_pad,) = out[padded.node_id][0]
    assert c_pad.cross_attn.shape == (1, 77 + 77, T5_WIDTH)


def test_sd3_missing_encoders_are_zeros(models):
    root, sds = models
    te = root / "text_encoders"
    from mixgraph.graph.precision import parse_spec

    f32 = parse_spec("f32")
    only_l = loader.load_clip([te / "clip_l.safetensors", te / "t5xxl.safetensors"], "sd3")
    assert only_l.names == ("clip_l", "t5xxl")
    with torch.inference_mode():  # as the executor runs nodes (the store may hold its inference tensors)
        (cond,) = only_l.encode("a cat", f32)
    with torch.no_grad():
        l = _hf_clip(sds["clip_l"], L_WIDTH, "quick_gelu")(input_ids=_clip_ids("a cat", END_TOKEN),
                                                            output_hidden_states=True)
    assert cond.pooled.shape == (1, L_WIDTH + 1280) and torch.equal(cond.pooled[0, L_WIDTH:], torch.zeros(1280))
    assert torch.allclose(cond.cross_attn[0, :77, :L_WIDTH], l.hidden_states[-2][0], atol=1e-5, rtol=1e-4)
    assert torch.equal(cond.cross_attn[0, :77, L_WIDTH:], torch.zeros(77, T5_WIDTH - L_WIDTH))


def test_chroma_join(models):
    root, sds = models
    g = api.Graph()
    clip = g.add("CLIPLoader", clip_name="t5xxl.safetensors", type="chroma")[0]
    enc = g.add("CLIPTextEncode", clip=clip, text="a (red:1.5) fox")
    (cond,) = _run(g, models, enc)[enc.node_id][0]
    ids = get_tokenizer("t5").tokenize_with_weights("a (red:1.5) fox", pad_token=0, min_length=1)[0]
    assert cond.pooled is None and cond.model_inputs == {}
    assert cond.cross_attn.shape == (1, len(ids), T5_WIDTH)  # no padding
    with torch.no_grad():
        ref = hf_t5(sds["t5"])
        z = ref(input_ids=torch.tensor([[t for t, _ in ids]])).last_hidden_state[0]
        z_empty = ref(input_ids=torch.zeros(1, len(ids), dtype=torch.long)).last_hidden_state[0]  # all pad
    w = torch.tensor([w for _, w in ids])[:, None]
    want = torch.where(w != 1.0, (z - z_empty) * w + z_empty, z)
    assert (w != 1.0).any() and torch.allclose(cond.cross_attn[0], want, atol=1e-5, rtol=1e-4)


def test_validation_accepts_declared_types_and_refuses_others(models):
    g = api.Graph()
    clip = g.add("CLIPLoader", clip_name="t5xxl.safetensors", type="ltxv")[0]
    enc = g.add("CLIPTextEncode", clip=clip, text="x")
    with pytest.raises(Exception, match="CLIP type 'ltxv': model family LTX-Video is not supported"):
        _run(g, models, enc)


def test_flux_checkpoint_samples_with_clip_text_encode_flux(models):
    g = api.Graph()
    ckpt = g.add("CheckpointLoaderSimple", ckpt_name="dit_toy.safetensors")
    pos = g.add("CLIPTextEncodeFlux", clip=ckpt[1], clip_l="a red cube", t5xxl="a red cube", guidance=4.0)
    neg = g.add("CLIPTextEncodeFlux", clip=ckpt[1], clip_l="", t5xxl="", guidance=4.0)
    lat = g.add("EmptyLatentImage", width=32, height=32, batch_size=1)
    ks = g.add("KSampler", model=ckpt[0], seed=1, steps=2, cfg=2.0, sampler_name="euler", scheduler="simple",
               positive=pos, negative=neg, latent_image=lat, denoise=1.0)
    out = _run(g, models, ks)
    samples = out[ks.node_id][0].samples
    assert samples.shape == (1, CFG.channels, 4, 4) and torch.isfinite(samples).all()

