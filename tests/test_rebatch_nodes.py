"""RebatchLatents / RebatchImages: ComfyUI's (newest V3) spec, the rebatching rules (batch indices,
masks, size changes, overlaps and their merge modes, against hand-computed values) and the
engine's list and UI-format handling around them."""

from __future__ import annotations

import pytest
import torch

from mixgraph.graph.prompt import Link
from mixgraph.graph.formats.ui_export import to_ui
from mixgraph.graph.validate import validate
from mixgraph.graph.formats.workflow import load_workflow
from mixgraph.nodes.payloads.latent import Latent
from mixgraph.nodes.declare.latent.rebatch_nodes import rebatch_images, rebatch_latents
from mixgraph.ui import api

REG = api.default_registry()
INFO = REG.object_info()
MODES = ["truncate start", "truncate end", "fade smooth", "fade linear"]
NEW = dict(dimension="b", overlap=0, merge_overlap_mode="truncate start")


def test_rebatch_specs_match_comfyui():
    # the V3 copy declares dimension/overlap/merge_overlap_mode required; they are optional here
    # (same defaults, same order, same widgets) so that API prompts saved before they existed,
    # [latents, batch_size] only, still validate
    for name, sock, cat, extra in (("RebatchLatents", "latents", "model/latent/batch", ["dimension"]),
                                   ("RebatchImages", "images", "image/batch", [])):
        info = INFO[name]
        req, opt = info["input"]["required"], info["input"]["optional"]
        assert list(req) == [sock, "batch_size"]
        assert list(opt) == [*extra, "overlap", "merge_overlap_mode"]
        size = dict(req["batch_size"][1])
        assert size.pop("tooltip") and size == {"default": 1, "min": 1, "max": 4096}
        assert req["batch_size"][0] == "INT"
        overlap = dict(opt["overlap"][1])
        assert overlap.pop("tooltip") and overlap == {"default": 0, "min": 0, "max": 4096, "advanced": True}
        assert opt["merge_overlap_mode"][0] == MODES
        assert opt["merge_overlap_mode"][1]["advanced"] is True and opt["merge_overlap_mode"][1]["tooltip"]
        assert REG.get(name).input_map["merge_overlap_mode"].default == "truncate start"
        assert info["category"] == cat and info["output_is_list"] == [True]
    dim = INFO["RebatchLatents"]["input"]["optional"]["dimension"]
    assert dim[0] == ["b", "t (video only)", "t (audio only)"] and "advanced" not in dim[1]
    assert REG.get("RebatchLatents").input_map["dimension"].default == "b"
    assert INFO["RebatchLatents"]["output"] == ["LATENT"]
    assert INFO["RebatchImages"]["output"] == ["IMAGE"]
    assert INFO["RebatchLatents"]["display_name"] == "Rebatch Latents"
    assert INFO["RebatchImages"]["display_name"] == "Rebatch Images"


def test_rebatch_api_prompt_without_the_new_inputs_runs(tmp_path):
    prompt = {"1": {"class_type": "EmptyLatentImage", "inputs": {"width": 16, "height": 16, "batch_size": 3}},
              "2": {"class_type": "RebatchLatents", "inputs": {"latents": ["1", 0], "batch_size": 2}},
              "3": {"class_type": "SaveLatent", "inputs": {"samples": ["2", 0], "filename_prefix": "rb"}}}
    assert validate(load_workflow(prompt, REG).prompt, REG).clean
    out = api.run(prompt, output=tmp_path)
    assert [lat.samples.shape[0] for lat in out["2"][0]] == [2, 1]


def _lat(n, hw, start, mask=None):
    s = torch.arange(start, start + n, dtype=torch.float32).reshape(n, 1, 1, 1).expand(n, 4, *hw)
    return Latent(s.clone(), mask)


def _frames(*values):
    """An IMAGE batch [n, 1, 1, 1] holding `values`, one per frame."""
    return torch.tensor(values, dtype=torch.float32).reshape(-1, 1, 1, 1)


def _vals(batches):
    return [b.reshape(b.shape[0], -1)[:, 0].tolist() for b in batches]


def test_rebatch_latents_cuts_batches_and_keeps_indices_and_masks():
    a, b = _lat(3, (2, 2), 0), _lat(2, (2, 2), 3, mask=torch.zeros(1, 1, 16, 16))
    c = Latent(torch.full((1, 4, 3, 3), 5.0), batch_index=(9,))
    out = rebatch_latents([a, b, c], 2)
    # a: 3 > 2 -> [0,1], keep [2]; b: [2,3,4] -> [2,3], keep [4]; c has another size -> [4], then [c]
    assert [o.batch_index for o in out] == [(0, 1), (2, 3), (4,), (9,)]
    assert [o.samples[:, 0, 0, 0].tolist() for o in out] == [[0, 1], [2, 3], [4], [5]]
    assert out[0].noise_mask is None and out[3].noise_mask is None     # all ones: dropped
    assert out[1].noise_mask.shape == (2, 1, 2, 2)                      # at the samples' size
    assert out[1].noise_mask[:, 0, 0, 0].tolist() == [1.0, 0.0]          # a unmasked, b masked
    assert out[2].noise_mask.abs().sum() == 0


def test_rebatch_latents_resizes_masks_to_the_samples():
    # a [1, h, w] mask is resized (bilinear) to the latent's size and repeated over its batch
    lat = Latent(torch.zeros(2, 4, 2, 2), noise_mask=torch.tensor([[[0.0, 1.0], [1.0, 1.0]]]))
    (out,) = rebatch_latents([lat], 4)
    assert out.noise_mask.shape == (2, 1, 2, 2) and out.batch_index == (0, 1)
    assert out.noise_mask[1, 0, 0, 0] == 0.0 and out.noise_mask[0, 0, 1, 1] == 1.0
    pix = torch.zeros(1, 16, 16)
    pix[:, :, 8:] = 1.0                       # right half at pixel size -> right column of the latent
    (out,) = rebatch_latents([Latent(torch.zeros(1, 4, 2, 2), noise_mask=pix)], 1)
    assert out.noise_mask[0, 0].tolist() == [[0.0, 1.0], [0.0, 1.0]]


def test_rebatch_images_flattens_and_regroups():
    imgs = [torch.full((3, 4, 4, 3), 1.0), torch.full((2, 4, 4, 3), 2.0)]
    out = rebatch_images(imgs, 2)
    assert [o.shape[0] for o in out] == [2, 2, 1]
    assert out[1][:, 0, 0, 0].tolist() == [1.0, 2.0]
    assert len(rebatch_images([torch.zeros(1, 4, 4, 3), torch.zeros(1, 8, 8, 3)], 1)) == 2


def test_rebatch_images_size_change_closes_the_batch():
    # the V3 rule (the V1 node failed here): another size starts a new output batch
    out = rebatch_images([torch.zeros(1, 4, 4, 3), torch.ones(2, 8, 8, 3), torch.ones(1, 8, 8, 3)], 2)
    assert [tuple(o.shape) for o in out] == [(1, 4, 4, 3), (2, 8, 8, 3), (1, 8, 8, 3)]


@pytest.mark.parametrize("mode, want", [
    ("truncate start", [0, 1, 2, 3, 4, 14]),
    ("truncate end", [0, 10, 11, 12, 13, 14]),
    # weights for the later batch: linspace(0, 1, 4) = 0, 1/3, 2/3, 1
    ("fade linear", [0, 1, (2 * 2 + 11) / 3, (3 + 12 * 2) / 3, 13, 14]),
    # smoothstep of those: 0, 7/27, 20/27, 1
    ("fade smooth", [0, 1, (2 * 20 + 11 * 7) / 27, (3 * 7 + 12 * 20) / 27, 13, 14]),
])
def test_rebatch_images_merge_modes_on_the_overlap(mode, want):
    (out,) = rebatch_images([_frames(0, 1, 2, 3, 4), _frames(10, 11, 12, 13, 14)], 6, overlap=4, mode=mode)
    assert out.shape == (6, 1, 1, 1)
    assert out.flatten().tolist() == pytest.approx(want, abs=1e-5)


def test_rebatch_images_overlap_repeats_samples_between_outputs():
    # one batch of 5, size 3, overlap 1: [0,1,2], then the rest from 3 - 1 = 2: [2,3,4]
    assert _vals(rebatch_images([_frames(0, 1, 2, 3, 4)], 3, overlap=1)) == [[0, 1, 2], [2, 3, 4]]
    # the pushed-back rest overlaps the next input as well (here its later sample wins)
    out = rebatch_images([_frames(0, 1, 2, 3), _frames(10, 11)], 3, overlap=1, mode="truncate end")
    assert _vals(out) == [[0, 1, 2], [2, 10, 11]]
    # overlap 0 leaves the values and the order as they are
    assert _vals(rebatch_images([_frames(0, 1), _frames(2, 3, 4)], 4)) == [[0, 1, 2, 3], [4]]


def test_rebatch_overlap_errors():
    with pytest.raises(ValueError, match="input 'overlap': 3 must be smaller than batch_size"):
        rebatch_images([_frames(0, 1, 2, 3)], 3, overlap=3)
    with pytest.raises(ValueError, match="input 'overlap': 2 is more than an input batch holds"):
        rebatch_images([_frames(0), _frames(1, 2, 3)], 4, overlap=2)
    with pytest.raises(ValueError, match="input 'overlap'"):
        rebatch_latents([_lat(1, (2, 2), 0), _lat(3, (2, 2), 1)], 4, overlap=2)
    with pytest.raises(ValueError, match="input 'merge_overlap_mode'"):
        rebatch_images([_frames(0)], 2, mode="blend")


def test_rebatch_latents_overlap_merges_masks_and_batch_indices():
    a = _lat(4, (1, 1), 0)                                       # no mask: ones
    b = _lat(4, (1, 1), 10, mask=torch.zeros(1, 1, 8, 8))        # masked out
    (out,) = rebatch_latents([a, b], 5, overlap=3, mode="fade linear")   # weights 0, .5, 1
    assert out.samples[:, 0, 0, 0].tolist() == pytest.approx([0, 1, 6.5, 12, 13])
    assert out.noise_mask[:, 0, 0, 0].tolist() == pytest.approx([1, 1, 0.5, 0, 0])
    assert out.batch_index == (0, 1, 2, 3, 7)                    # the earlier input's indices
    (out,) = rebatch_latents([a, b], 5, overlap=3, mode="truncate end")
    assert out.samples[:, 0, 0, 0].tolist() == [0, 10, 11, 12, 13]
    assert out.noise_mask[:, 0, 0, 0].tolist() == [1, 0, 0, 0, 0]
    assert out.batch_index == (0, 4, 5, 6, 7)                    # the later input's indices
    # given indices are carried; a split's rest keeps its own
    c = Latent(_lat(3, (1, 1), 0).samples, batch_index=(9, 8, 7))
    out = rebatch_latents([c], 2, overlap=1)
    assert [o.batch_index for o in out] == [(9, 8), (8, 7)]
    assert all(o.noise_mask is None for o in out)
    # a mask that is all ones after merging is dropped
    ones = _lat(2, (1, 1), 0, mask=torch.ones(1, 1, 8, 8))
    (out,) = rebatch_latents([ones, _lat(2, (1, 1), 2)], 4)
    assert out.noise_mask is None and out.batch_index == (0, 1, 2, 3)


def test_rebatch_latents_time_dimensions():
    with pytest.raises(ValueError, match="input 'dimension'.*image latents"):
        rebatch_latents([_lat(1, (2, 2), 0)], 2, dimension="t (video only)")
    # "t (audio only)" is the last dimension: the width of an image latent, as in ComfyUI
    s = torch.arange(6, dtype=torch.float32).reshape(1, 1, 1, 6).expand(2, 4, 3, 6).clone()
    mask = torch.zeros(2, 1, 3, 6)
    mask[..., 5] = 0.25
    out = rebatch_latents([Latent(s, mask, (4, 5))], 4, dimension="t (audio only)", overlap=1)
    assert [tuple(o.samples.shape) for o in out] == [(2, 4, 3, 4), (2, 4, 3, 3)]
    assert out[0].samples[0, 0, 0].tolist() == [0, 1, 2, 3] and out[1].samples[0, 0, 0].tolist() == [3, 4, 5]
    assert [o.batch_index for o in out] == [(4, 5), (4, 5)]      # batch untouched
    assert out[1].noise_mask[0, 0, 0].tolist() == [0, 0, 0.25]
    # without batch indices none is made up along time
    (out,) = rebatch_latents([Latent(s)], 8, dimension="t (audio only)")
    assert out.batch_index is None and torch.equal(out.samples, s)


def test_rebatch_latents_lists_through_the_engine(tmp_path):
    g = api.Graph(precision="f32")
    empty = g.add("EmptyLatentImage", width=16, height=16, batch_size=5)
    twos = g.add("RebatchLatents", latents=empty, batch_size=2, **NEW)
    up = g.add("LatentUpscaleBy", samples=twos, upscale_method="nearest-exact", scale_by=2.0)
    fours = g.add("RebatchLatents", latents=up, batch_size=4, **NEW)
    g.add("SaveLatent", samples=fours, filename_prefix="rb")
    out = api.run(g, output=tmp_path)
    assert [lat.samples.shape[0] for lat in out[twos.node_id][0]] == [2, 2, 1]
    assert len(out[up.node_id][0]) == 3                      # mapped once per list element
    got = out[fours.node_id][0]
    assert [lat.samples.shape for lat in got] == [(4, 4, 4, 4), (1, 4, 4, 4)]
    assert [lat.batch_index for lat in got] == [(0, 1, 2, 3), (4,)]


def test_rebatch_images_overlap_through_the_engine(tmp_path):
    g = api.Graph(precision="f32")
    img = g.add("EmptyImage", width=4, height=4, batch_size=5, color=0)
    rb = g.add("RebatchImages", images=img, batch_size=3, overlap=1, merge_overlap_mode="fade linear")
    g.add("PreviewImage", images=rb)
    out = api.run(g, output=tmp_path)
    assert [tuple(b.shape) for b in out[rb.node_id][0]] == [(3, 4, 4, 3), (3, 4, 4, 3)]


def _call(cls, **inputs):
    return {"class_type": cls, "inputs": inputs}


def test_rebatch_validation_refuses_overlap_not_below_batch_size():
    prompt = load_workflow({"1": _call("EmptyImage", width=4, height=4, batch_size=2, color=0),
                            "2": _call("RebatchImages", images=["1", 0], batch_size=2, overlap=2,
                                       merge_overlap_mode="truncate start"),
                            "3": _call("PreviewImage", images=["2", 0])}, REG).prompt
    (p,) = validate(prompt, REG).errors
    assert p.node_id == "2" and p.type == "custom_validation_failed" and "overlap" in p.details
    prompt["2"].inputs["overlap"] = 1
    assert validate(prompt, REG).clean


def _ui(widgets):
    return {"nodes": [
        {"id": 1, "type": "EmptyLatentImage", "mode": 0, "inputs": [], "widgets_values": [16, 16, 3],
         "outputs": [{"name": "LATENT", "type": "LATENT", "links": [1]}]},
        {"id": 2, "type": "RebatchLatents", "mode": 0, "widgets_values": widgets,
         "inputs": [{"name": "latents", "type": "LATENT", "link": 1}],
         "outputs": [{"name": "LATENT", "type": "LATENT", "links": [2]}]},
        {"id": 3, "type": "SaveLatent", "mode": 0, "widgets_values": ["rb"],
         "inputs": [{"name": "samples", "type": "LATENT", "link": 2}], "outputs": []}],
        "links": [[1, 1, 0, 2, 0, "LATENT"], [2, 2, 0, 3, 0, "LATENT"]]}


def test_rebatch_ui_widgets_values_old_and_new():
    # a workflow saved before the new widgets: the defaults fill in
    old = load_workflow(_ui([2]), REG).prompt["2"].inputs
    assert old == {"latents": Link("1", 0), "batch_size": 2, **NEW}
    assert validate(load_workflow(_ui([2]), REG).prompt, REG).clean
    # the advanced widgets are ordinary widgets, saved in declaration order
    wf = load_workflow(_ui([4, "t (audio only)", 1, "fade smooth"]), REG)
    assert wf.prompt["2"].inputs == {"latents": Link("1", 0), "batch_size": 4, "dimension": "t (audio only)",
                                     "overlap": 1, "merge_overlap_mode": "fade smooth"}
    node = next(n for n in to_ui(wf, REG)["nodes"] if n["type"] == "RebatchLatents")
    assert node["widgets_values"] == [4, "t (audio only)", 1, "fade smooth"]
