"""Lumina 2 and Z-Image sampled on conds from their own text encoders (tiny Gemma 2 / Qwen3 in the
real key layouts, ``nodes/encoders/llm_sets.py``): the join's ``attention_mask`` reaches the
model, and a positive and a negative prompt of different token counts are evaluated apart (the
denoiser never stretches one caption to the other's length)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

llm_sets = pytest.importorskip("mixgraph.nodes.encoders.llm_sets")  # the text-encoder work of issue 22

from mixgraph.graph.precision import parse_spec  # noqa: E402
from mixgraph.nodes.declare.conditioning.lumina2_nodes import lumina2_prompt  # noqa: E402
from mixgraph.nodes.families.lumina.family import LUMINA2, Z_IMAGE  # noqa: E402
from mixgraph.nodes.models import loader  # noqa: E402
from mixgraph.nodes.models.handles import ClipHandle  # noqa: E402
from mixgraph.nodes.sampling.parameterization import CFGDenoiser  # noqa: E402
from mixgraph.nodes.weights.safetensors_io import WeightSource  # noqa: E402
from tests.fixtures.tiny_llm import write_gemma2, write_qwen3  # noqa: E402
from tests.fixtures.tiny_nextdit import LUMINA2_TINY, Z_IMAGE_TINY, nextdit_state_dict  # noqa: E402

F32 = parse_spec("f32")


def _clip(family, path) -> ClipHandle:
    slot, = family.text_encoders(family.name)
    entry = llm_sets.llm_entry(slot.arch, WeightSource.from_file(path), slot.name, slot.tokenizer, slot.rule)
    return ClipHandle(slot.encoding, (entry,))


@pytest.mark.parametrize("family,cfg,write", [(LUMINA2, LUMINA2_TINY, write_gemma2),
                                              (Z_IMAGE, Z_IMAGE_TINY, write_qwen3)])
def test_nextdit_samples_on_its_encoders_conds(tmp_path, family, cfg, write):
    clip = _clip(family, write(tmp_path / "te.safetensors"))
    unet = tmp_path / "model.safetensors"
    save_file(nextdit_state_dict(cfg, seed=2), str(unet))
    model = loader.load_unet(unet)
    assert model.family == family.name
    text = lumina2_prompt("superior", "a red cat") if family is LUMINA2 else "a red cat under the sky"
    (pos,) = clip.encode(text, F32)
    (neg,) = clip.encode("blurry", F32)
    assert pos.model_inputs["attention_mask"].shape == (1, pos.cross_attn.shape[1])
    assert pos.cross_attn.shape[1] != neg.cross_attn.shape[1]
    runner = model.runner(F32)
    x = torch.randn(1, 16, 6, 8, generator=torch.Generator().manual_seed(3))
    sigma = torch.tensor([0.7])
    guided = CFGDenoiser(runner, (pos,), (neg,), 3.0, torch.zeros_like(x))(x, sigma)
    with torch.no_grad():
        c = x - 0.7 * runner.model(x, sigma, pos.cross_attn)
        u = x - 0.7 * runner.model(x, sigma, neg.cross_attn)
    torch.testing.assert_close(guided, u + 3.0 * (c - u), atol=1e-5, rtol=1e-5)
