"""DualCFGGuider and PerpNegGuider run the MODEL's sampler patches as ComfyUI's guiders do:
Dual CFG through ``cfg_function`` (cfg + post-CFG patches, no pre-CFG), Perp-Neg with the pre-CFG
and post-CFG patches around ``perp_neg`` (no cfg patch)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mixgraph.nodes.payloads.sampling import Guidance
from mixgraph.nodes.sampling.cfg_patches import GuidanceArgs, RescaleCFG
from mixgraph.nodes.sampling.cfg_patches_extra import CFGNorm, LatentOperationCFG
from mixgraph.nodes.sampling.guidance import build_denoiser, perp_neg
from mixgraph.nodes.sampling.parameterization import ModelSampling
from tests.test_custom_sampling import PromptModel, cond_value

SIGMA = torch.tensor([1.0])


@dataclass
class PatchedModel(PromptModel):
    sampler_patches: tuple = ()


def _x():
    return torch.linspace(-1, 1, 64).reshape(1, 4, 4, 4)


def _den(guidance, patches):
    x = _x()
    return build_denoiser(guidance, PatchedModel(sampler_patches=patches), x, None, ModelSampling("x0"))


def _preds(den, *lists):
    return [den.calc_cond_batch([lst], _x(), SIGMA)[0] for lst in lists]


def _cfg_norm(guided, cond, strength):
    scale = cond.norm(dim=1, keepdim=True) / (guided.norm(dim=1, keepdim=True) + 1e-8)
    return guided * scale.clamp(0.0, 1.0) * strength


def _double(latent):
    return 2.0 * latent


PERP = Guidance("perp_neg", (cond_value(2.0), cond_value(1.0), cond_value(0.5)), (3.0, 0.7))
DUAL = Guidance("dual_cfg", (cond_value(3.0), cond_value(2.0), cond_value(-1.0)), (1.5, 4.0))
NESTED = Guidance("dual_cfg", (cond_value(3.0), cond_value(2.0), cond_value(-1.0)), (1.5, 4.0), nested=True)


def test_perp_neg_guider_runs_post_cfg_patch_on_its_result():
    den = _den(PERP, (CFGNorm(0.8),))
    p, n, e = _preds(den, den.positive, den.negative, den.empty)
    out = den(_x(), SIGMA)
    ref = _cfg_norm(perp_neg(p, n, e, 0.7, 3.0), p, 0.8)  # post-CFG sees cond_denoised = P
    assert torch.allclose(out, ref, atol=1e-6)
    assert not torch.allclose(out, perp_neg(p, n, e, 0.7, 3.0), atol=1e-3)


def test_perp_neg_guider_runs_pre_cfg_patch_on_the_three_item_list():
    den = _den(PERP, (LatentOperationCFG(_double),))
    p, n, e = _preds(den, den.positive, den.negative, den.empty)
    out = den(_x(), SIGMA)
    # ComfyUI's LatentApplyOperationCFG on a conds_out of length 3 ([P, N, E]): P <- op(P)
    assert torch.allclose(out, perp_neg(2.0 * p, n, e, 0.7, 3.0), atol=1e-6)
    assert not torch.allclose(out, perp_neg(2.0 * (p - n) + n, n, e, 0.7, 3.0), atol=1e-3)


def test_perp_neg_guider_ignores_cfg_function_patch():
    plain = _den(PERP, ())(_x(), SIGMA)
    assert torch.allclose(_den(PERP, (RescaleCFG(0.7),))(_x(), SIGMA), plain, atol=1e-6)


def test_dual_cfg_guider_regular_runs_post_cfg_patch_on_cond2_negative_cfg():
    den = _den(DUAL, (CFGNorm(0.8),))
    p, m, n = _preds(den, den.positive, den.middle, den.negative)
    out = den(_x(), SIGMA)
    ref = _cfg_norm(n + (m - n) * 4.0, m, 0.8) + (p - m) * 1.5  # cfg_function(cond2, negative)
    assert torch.allclose(out, ref, atol=1e-6)
    assert not torch.allclose(out, n + (m - n) * 4.0 + (p - m) * 1.5, atol=1e-3)


def test_dual_cfg_guider_nested_runs_cfg_and_post_cfg_patches_on_the_text_prediction():
    den = _den(NESTED, (RescaleCFG(0.7), CFGNorm(0.9)))
    p, m, n = _preds(den, den.positive, den.middle, den.negative)
    out = den(_x(), SIGMA)
    args = GuidanceArgs(_x(), SIGMA, 1.5, p, m, evaluate=None)
    text = _cfg_norm(RescaleCFG(0.7).combine(args), p, 0.9)
    assert torch.allclose(out, n + 4.0 * (text - n), atol=1e-5)


def test_dual_cfg_guider_runs_no_pre_cfg_patch():
    plain = _den(DUAL, ())(_x(), SIGMA)
    assert torch.allclose(_den(DUAL, (LatentOperationCFG(_double),))(_x(), SIGMA), plain, atol=1e-6)


def test_guiders_report_the_skipped_negative_as_cond_for_cfgpp_ud10_ab():
    """At neg_scale 0 / cfg2 1 the negative is skipped unless a CFG++ sampler asks for it; with
    ``skip_cfg1`` (cfgpp_ud10_ab) the hook's uncond is then its cond, as in ComfyUI."""
    perp = _den(Guidance("perp_neg", (cond_value(2.0), cond_value(1.0), cond_value(0.5)), (3.0, 0.0)), ())
    p, n = _preds(perp, perp.positive, perp.negative)
    assert torch.allclose(perp.with_uncond(_x(), SIGMA, skip_cfg1=True)[1], p)
    assert torch.allclose(perp.with_uncond(_x(), SIGMA)[1], n)
    dual = _den(Guidance("dual_cfg", (cond_value(3.0), cond_value(2.0), cond_value(-1.0)), (1.5, 1.0)), ())
    m, n = _preds(dual, dual.middle, dual.negative)
    assert torch.allclose(dual.with_uncond(_x(), SIGMA, skip_cfg1=True)[1], m)
    assert torch.allclose(dual.with_uncond(_x(), SIGMA)[1], n)
