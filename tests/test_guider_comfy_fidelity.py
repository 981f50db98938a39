"""ComfyUI fidelity of DualModelGuider's negative pass (the first model's forward-time UNet
patches), PerpNegGuider's pre-CFG patches on ComfyUI's 3-item prediction list, and
model-as-LoRA hooks on an already LoRA-patched model."""

from __future__ import annotations

import pytest
import torch

from mixgraph.graph.precision import parse_spec
from mixgraph.nodes.models import loader
from mixgraph.nodes.payloads.conditioning import Cond
from mixgraph.nodes.payloads.sampling import Guidance
from mixgraph.nodes.sampling.cfg_patches import APG
from mixgraph.nodes.sampling.cfg_patches_extra import LatentOperationCFG
from mixgraph.nodes.sampling.guidance import build_denoiser, perp_neg
from mixgraph.nodes.sampling.parameterization import CondDenoiser, ModelSampling
from tests.test_custom_sampling import PromptModel, cond_value

F32 = parse_spec("f32")


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    from tests.fixtures.checkpoints import write_sd15
    root = tmp_path_factory.mktemp("fidelity_models")
    paths = []
    for seed in (4, 5):
        path = root / f"sd15_{seed}.safetensors"
        write_sd15(path, seed=seed)
        paths.append(path)
    return paths


def _negative_pred(runner, negative, x, sigma):
    den = CondDenoiser(runner, (negative,), (True,), x, None, ModelSampling.for_model(runner),
                       control_to_uncond=None)
    return den.calc_cond_batch(den.lists, x, sigma)[0]


def test_dual_model_guider_negative_pass_uses_the_first_models_unet_patches(ckpts):
    from mixgraph.nodes.declare.model_patches import model_patch_nodes as N
    first, _, _ = loader.load_checkpoint(ckpts[0])
    second, _, _ = loader.load_checkpoint(ckpts[1])
    first_freeu = N.FreeU(first, 1.3, 1.4, 0.5, 0.2)[0]
    assert first_freeu.unet_patches and not second.unet_patches
    g = torch.Generator().manual_seed(3)
    pos, neg = (Cond(torch.randn(1, 77, 32, generator=g)),), (Cond(torch.randn(1, 77, 32, generator=g)),)
    x = torch.randn(1, 4, 8, 8, generator=g)
    sigma = torch.tensor([2.0])
    main_runner, second_runner = first_freeu.runner(F32), second.runner(F32)
    den = build_denoiser(Guidance("dual_model", (pos, neg), (4.0,)), main_runner, x, None,
                         ModelSampling.for_model(main_runner), negative_model=second_runner)
    got = den.calc_cond_batch([den.negative], x, sigma)[0]
    # the second model's weights with the first model's FreeU, as ComfyUI's model_options
    want = _negative_pred(N.FreeU(second, 1.3, 1.4, 0.5, 0.2)[0].runner(F32), neg, x, sigma)
    plain = _negative_pred(second_runner, neg, x, sigma)
    assert torch.allclose(got, want, atol=1e-5)
    assert not torch.allclose(got, plain, atol=1e-3)
    # the second model's own forward patches are not used; its runner is left unchanged
    second_freeu = N.FreeU(second, 1.3, 1.4, 0.5, 0.2)[0].runner(F32)
    den2 = build_denoiser(Guidance("dual_model", (pos, neg), (4.0,)), first.runner(F32), x, None,
                          ModelSampling.for_model(main_runner), negative_model=second_freeu)
    assert torch.allclose(den2.calc_cond_batch([den2.negative], x, sigma)[0], plain, atol=1e-5)
    assert second_freeu.handle.unet_patches


def _preds(x, sigma):
    """PromptModel's (positive, negative, empty) x0 predictions, unpatched."""
    den = _perp_neg_den((), x)
    return den.calc_cond_batch([den.positive, den.negative, den.empty], x, sigma)


def _perp_neg_den(patches, x, cfg=3.0, neg_scale=0.7):
    model = PromptModel()
    model.sampler_patches = patches
    guidance = Guidance("perp_neg", (cond_value(2.0), cond_value(-1.0), cond_value(0.5)), (cfg, neg_scale))
    return build_denoiser(guidance, model, x, None, ModelSampling("x0"))


def test_perp_neg_latent_operation_cfg_acts_on_the_positive_of_the_three_item_list():
    x = torch.linspace(-1, 1, 64).reshape(1, 4, 4, 4)
    sigma = torch.tensor([1.0])
    op = LatentOperationCFG(lambda latent: latent * 2.0)
    out = _perp_neg_den((op,), x)(x, sigma)
    p, n, e = _preds(x, sigma)
    # ComfyUI: a conds_out of length 3 -> cond <- op(cond), not op(cond - uncond) + uncond
    assert torch.allclose(out, perp_neg(2.0 * p, n, e, 0.7, 3.0), atol=1e-5)
    assert not torch.allclose(out, perp_neg(2.0 * (p - n) + n, n, e, 0.7, 3.0), atol=1e-3)


def test_perp_neg_apg_rewrites_positive_and_passes_the_empty_prediction_through():
    x = torch.linspace(-1, 1, 64).reshape(1, 4, 4, 4)
    sigma = torch.tensor([1.0])
    apg = APG(eta=0.5, norm_threshold=0.0, momentum=0.0)
    out = _perp_neg_den((apg,), x)(x, sigma)
    p, n, e = _preds(x, sigma)
    g = p - n
    unit = p / p.norm()
    parallel = (g * unit).sum() * unit
    new_p = n + (g - parallel) + 0.5 * parallel + (p - n) / 3.0
    assert torch.allclose(out, perp_neg(new_p, n, e, 0.7, 3.0), atol=1e-5)


def test_hooks_model_as_lora_adds_the_difference_to_lora_patched_weights(ckpts, tmp_path):
    from mixgraph.nodes.models.hooks import clip_patches, unet_patches
    from mixgraph.nodes.adapters.lora import load_lora_patches
    from mixgraph.nodes.payloads.hooks import ModelWeights, WeightHook
    from tests.fixtures.workflow_models import write_lora
    lora_path = write_lora(tmp_path / "lora.safetensors", ckpts[0], seed=5)
    base, base_clip, _ = loader.load_checkpoint(ckpts[0])
    other, other_clip, _ = loader.load_checkpoint(ckpts[1])
    model, clip = load_lora_patches(lora_path, base, base_clip, 1.0, 1.0)  # LoraLoader first
    s = 0.4
    hook = WeightHook("h", ModelWeights(other, other_clip), strength_model=s, strength_clip=s)
    hooked = model.with_patches(unet_patches(hook, 1.0, model)).runner(F32).model.state_dict()
    orig, cur = base.runner(F32).model.state_dict(), model.runner(F32).model.state_dict()
    oth = other.runner(F32).model.state_dict()
    lora_changed = [k for k in orig if not torch.allclose(cur[k], orig[k])]
    assert lora_changed  # the LoRA patched some UNet weights before the hook
    for k in orig:  # ComfyUI's model_as_lora: W_current + s·(W_other − W_original)
        torch.testing.assert_close(hooked[k], cur[k] + s * (oth[k] - orig[k]), atol=1e-5, rtol=1e-5)
    k = lora_changed[0]  # not the blend (1 − s)·W_current + s·W_other
    assert not torch.allclose(hooked[k], (1 - s) * cur[k] + s * oth[k], atol=1e-5)
    # CLIP too: the text encoder's weights follow the same rule
    name = clip.names[0]
    hooked_clip = clip.with_patches(clip_patches(hook, 1.0, clip))

    def enc(c):
        from mixgraph.nodes.weights import store
        from mixgraph.nodes.encoders.clip import CLIPTextModel
        patches = tuple(p for p in c.patches if getattr(p, "target", name) == name)
        return store.materialize(name, c.encoder(name).source, c.encoder(name).config, F32.storage,
                               patches, CLIPTextModel).state_dict()
    h, c, o, b = enc(hooked_clip), enc(clip), enc(other_clip), enc(base_clip)
    for key in b:
        if key.endswith(("position_ids", "logit_scale")):
            continue
        torch.testing.assert_close(h[key], c[key] + s * (o[key] - b[key]), atol=1e-5, rtol=1e-5)
