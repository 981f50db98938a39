"""Pre-CFG patches when the negative is skipped, as ComfyUI runs them: CFG at cfg = 1 and
Perp-Neg at neg_scale = 0 call every pre-CFG function with zeros for the negative's prediction
(``comfy/samplers.py`` ``sampling_function``; ``nodes_perpneg.py`` ``Guider_PerpNeg``). APG has
no guard and works on the zeros; FreSca and TCFG return their input when ``None in conds[:2]``.
DualModelGuider calls ``cfg_function`` alone: no pre-CFG patch. References are computed by hand
from the model's raw predictions."""

from __future__ import annotations

import torch

from mixgraph.nodes.payloads.sampling import Guidance
from mixgraph.nodes.sampling.cfg_patches import APG, TangentialDampingCFG
from mixgraph.nodes.sampling.cfg_patches_extra import FreSca
from mixgraph.nodes.sampling.guidance import build_denoiser
from mixgraph.nodes.sampling.parameterization import ModelSampling
from tests.test_custom_sampling import PromptModel, cond_value

SIGMA = torch.tensor([1.0])


def _x():
    return torch.linspace(-1, 1, 64).reshape(1, 4, 4, 4)


def _model(patches=()):
    m = PromptModel()
    m.sampler_patches = tuple(patches)
    return m


def _cfg_den(patches, cfg, model=None):
    model = _model(patches) if model is None else model
    return build_denoiser(Guidance("cfg", (cond_value(2.0), cond_value(-1.0)), (cfg,)), model, _x(), None, ModelSampling("x0"))


def _raw(x, value, k=1.0, sigma=SIGMA):
    """PromptModel's unpatched x0 prediction at ``x``, ``sigma`` for a cond holding ``value``."""
    model = PromptModel(k=k)
    den = build_denoiser(Guidance("cfg", (cond_value(value), cond_value(value)), (1.0,)), model, x, None,
                         ModelSampling("x0"))
    return den.calc_cond_batch([den.positive], x, sigma)[0]


def _apg_cfg1(cond, eta, norm_threshold, scale=1.0):
    """ComfyUI's APG on conds_out = [cond, 0]: g = cond, shrunk to the norm threshold; all of it
    is parallel to cond; modified cond = eta·g + cond / scale."""
    g = cond
    if norm_threshold > 0:
        g = g * min(1.0, norm_threshold / float(g.norm()))
    return eta * g + cond / scale


def test_pre_cfg_apg_runs_at_cfg_one_on_a_zero_negative():
    x = _x()
    model = _model((APG(eta=0.5, norm_threshold=2.0, momentum=0.0),))
    out = _cfg_den(None, 1.0, model)(x, SIGMA)
    p = _raw(x, 2.0)
    assert float(p.norm()) > 2.0  # the threshold shrinks g
    assert torch.allclose(out, _apg_cfg1(p, 0.5, 2.0), atol=1e-5)
    assert not torch.allclose(out, p, atol=1e-3)  # not skipped
    assert model.calls == [1]  # the negative is still not evaluated


def test_pre_cfg_apg_momentum_runs_at_cfg_one():
    x = _x()
    den = _cfg_den((APG(eta=1.0, norm_threshold=0.0, momentum=0.5),), 1.0)
    first = den(x, torch.tensor([2.0]))
    second = den(x, torch.tensor([1.0]))
    p1, p2 = _raw(x, 2.0, sigma=torch.tensor([2.0])), _raw(x, 2.0)
    assert torch.allclose(first, p1 + p1, atol=1e-5)
    avg = 0.5 * p1 + p2  # the running average over the two steps (sigma fell)
    assert torch.allclose(second, avg + p2, atol=1e-5)


def test_pre_cfg_fresca_and_tcfg_leave_cfg_one_unchanged():
    x = _x()
    p = _raw(x, 2.0)
    for patch in (FreSca(1.0, 3.0, 1), TangentialDampingCFG()):
        out = _cfg_den((patch,), 1.0)(x, SIGMA)
        assert torch.allclose(out, p, atol=1e-6), patch


def test_pre_cfg_fresca_acts_with_a_negative():
    x = _x()
    out = _cfg_den((FreSca(1.0, 3.0, 1),), 1.5)(x, SIGMA)
    p, n = _raw(x, 2.0), _raw(x, -1.0)
    assert not torch.allclose(out, n + 1.5 * (p - n), atol=1e-3)


def test_pre_cfg_apg_then_fresca_at_cfg_one_in_patch_order():
    x = _x()
    out = _cfg_den((APG(1.0, 0.0, 0.0), FreSca(1.0, 3.0, 1)), 1.0)(x, SIGMA)
    assert torch.allclose(out, 2.0 * _raw(x, 2.0), atol=1e-5)


def _perp_neg_den(patches, cfg, neg_scale):
    guidance = Guidance("perp_neg", (cond_value(2.0), cond_value(-1.0), cond_value(0.5)), (cfg, neg_scale))
    return build_denoiser(guidance, _model(patches), _x(), None, ModelSampling("x0"))


def test_pre_cfg_apg_runs_under_perp_neg_with_neg_scale_zero():
    x = _x()
    p, e = _raw(x, 2.0), _raw(x, 0.5)
    out = _perp_neg_den((APG(0.5, 2.0, 0.0),), 3.0, 0.0)(x, SIGMA)
    # ComfyUI: conds_out = [P, 0, E], APG rewrites P with cond_scale = cfg, then Perp-Neg with
    # neg_scale 0 is E + cfg·(P' − E)
    new_p = _apg_cfg1(p, 0.5, 2.0, scale=3.0)
    assert torch.allclose(out, e + 3.0 * (new_p - e), atol=1e-5)
    # cfg 1 as well: the empty prompt is skipped too (zeros), the result is P'
    out1 = _perp_neg_den((APG(0.5, 2.0, 0.0),), 1.0, 0.0)(x, SIGMA)
    assert torch.allclose(out1, _apg_cfg1(p, 0.5, 2.0), atol=1e-5)


def test_pre_cfg_fresca_skipped_under_perp_neg_with_neg_scale_zero():
    x = _x()
    p, e = _raw(x, 2.0), _raw(x, 0.5)
    out = _perp_neg_den((FreSca(1.0, 3.0, 1),), 3.0, 0.0)(x, SIGMA)
    assert torch.allclose(out, e + 3.0 * (p - e), atol=1e-5)


def test_dual_model_guider_runs_no_pre_cfg_patch():
    x = _x()
    main, second = _model((APG(0.0, 0.0, 0.0),)), PromptModel(k=3.0)
    den = build_denoiser(Guidance("dual_model", (cond_value(2.0), cond_value(-1.0)), (2.5,)), main, x, None,
                         ModelSampling("x0"), negative_model=second)
    p, n = _raw(x, 2.0), _raw(x, -1.0, k=3.0)
    # ComfyUI's Guider_DualModel calls cfg_function: plain CFG, APG (eta 0) not applied
    assert torch.allclose(den(x, SIGMA), n + 2.5 * (p - n), atol=1e-5)
