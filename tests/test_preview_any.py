"""PreviewAny: ComfyUI's spec and the text it shows for each kind of value."""

from __future__ import annotations

import torch

from mixgraph.nodes.declare.logic.preview_any_nodes import as_text
from mixgraph.ui import api


def test_preview_any_spec_matches_comfyui():
    info = api.default_registry().object_info()["PreviewAny"]
    assert list(info["input"]["required"]) == ["source"]
    assert info["input"]["required"]["source"][0] == "*"
    assert info["output"] == ["STRING"] and info["output_node"] is True
    assert info["category"] == "utilities" and info["display_name"] == "Preview as Text"


def test_preview_any_text_per_kind():
    assert as_text("a cat") == "a cat"
    assert as_text(3) == "3" and as_text(0.5) == "0.5" and as_text(True) == "True"
    assert as_text(None) == "None"
    assert as_text({"a": [1, 2]}) == '{\n    "a": [\n        1,\n        2\n    ]\n}'
    text = as_text(torch.arange(2000))
    # over 1000 elements: summarized, 6 items at each edge (torch's default is 3)
    assert " ".join(text.split()) == ("tensor([ 0, 1, 2, 3, 4, 5, ..., 1994, 1995, 1996, 1997, 1998, "
                                     "1999])")
    assert str(torch.arange(2000)) == "tensor([   0,    1,    2,  ..., 1997, 1998, 1999])"  # restored


def test_preview_any_shows_a_value_in_the_ui(tmp_path):
    g = api.Graph()
    empty = g.add("EmptyLatentImage", width=16, height=24, batch_size=1)
    node = g.add("PreviewAny", source=empty)
    out = api.run(g, output=tmp_path)
    (text,) = out[node.node_id]
    assert list(out.ui[node.node_id]["text"]) == [text]
    assert text.startswith("Latent(samples=tensor(") and "batch_index=None" in text
