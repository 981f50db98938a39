"""Precision SPEC grammar, auto resolution and the resolver's order (DESIGN §4)."""

import pytest
import torch

from mixgraph.graph.precision import (F32, Policy, PrecisionError, Resolver, auto_spec, emulation_warning,
                             format_spec, parse_config, parse_precision_arg, parse_spec, parse_type_defaults,
                             resolve)
from mixgraph.graph.prompt import InvalidPrecision, PrecisionConfig, Region, WorkflowError
from mixgraph.graph.formats.workflow import load_workflow
from tests import toy_nodes as toy
from tests.toy_nodes import call, link


def test_parse_spec_plain_dtypes():
    assert parse_spec("f32") == Policy(torch.float32, torch.float32, spec="f32")
    bf = parse_spec("bf16")
    assert (bf.storage, bf.compute, bf.is_half) == (torch.bfloat16, torch.bfloat16, True)
    assert parse_spec("fp16").compute == torch.float16 and parse_spec("fp16").spec == "f16"
    assert not F32.is_half


def test_parse_spec_store_compute_and_flags():
    p = parse_spec("bf16:f32")
    assert (p.storage, p.compute, p.is_half, p.spec) == (torch.bfloat16, torch.float32, False, "bf16:f32")
    p = parse_spec("fp8_e4m3fn:bf16")
    assert (p.storage, p.compute) == (torch.float8_e4m3fn, torch.bfloat16)
    p = parse_spec("fp8_e5m2:f16")
    assert (p.storage, p.compute) == (torch.float8_e5m2, torch.float16)
    p = parse_spec("f16+upcast")
    assert (p.upcast_attention, p.f32_norms, p.spec) == (True, True, "f16+upcast")
    p = parse_spec("bf16+upcast_attention")
    assert (p.upcast_attention, p.f32_norms) == (True, False)
    p = parse_spec("int8")
    assert p.int8 and p.compute == torch.float32 and p.spec == "int8"


def test_parse_spec_round_trips_through_format():
    for s in ["f32", "bf16", "f16", "bf16:f32", "fp8_e4m3fn:bf16", "fp8_e5m2:f16", "f16+upcast",
              "f16+f32_norms", "bf16+upcast_attention", "int8"]:
        assert format_spec(parse_spec(s)) == s == parse_spec(s).spec


@pytest.mark.parametrize("bad,hint", [("f64", "unknown storage"), ("bf16:fp8_e4m3fn", "compute dtype"),
                                      ("fp8_e4m3fn", "storage format only"), ("f16+fast", "unknown flag"),
                                      ("", "empty")])
def test_parse_spec_rejects_bad_spec_saying_what_is_allowed(bad, hint):
    with pytest.raises(PrecisionError, match=hint):
        parse_spec(bad)


def test_resolve_f32_compute_keeps_storage():
    p = resolve(parse_spec("bf16+upcast"), f32_compute=True)
    assert (p.storage, p.compute, p.is_half, p.spec) == (torch.bfloat16, torch.float32, False, "bf16:f32+upcast")
    assert resolve(F32, f32_compute=True) is F32


def test_auto_resolves_to_f32_on_cpu():
    assert auto_spec("cpu") == "f32"
    assert parse_spec("auto", "cpu") == F32


def test_emulated_half_warns_once_per_resolver_set():
    assert "slower than f32" in emulation_warning(parse_spec("bf16"), "cpu")
    assert emulation_warning(parse_spec("bf16:f32"), "cpu") is None
    warned: set = set()
    first = Resolver(PrecisionConfig("bf16"), device="cpu", warned=warned)
    second = Resolver(PrecisionConfig("bf16"), device="cpu", warned=warned)
    assert len(first.warnings) == 1 and second.warnings == []


def test_parse_type_defaults_and_precision_arg():
    d = parse_type_defaults("MODEL=bf16, vae=f32")
    assert d["MODEL"].spec == "bf16" and d["VAE"].spec == "f32"
    default, types = parse_precision_arg("f16+upcast,VAE=f32")
    assert default == "f16+upcast" and types["VAE"] == F32
    with pytest.raises(PrecisionError):
        parse_precision_arg("bf16,f16")
    with pytest.raises(PrecisionError):
        parse_type_defaults("MODEL")


def _resolver(**kw):
    regions = (Region("outer", frozenset({"1", "2", "3"}), "bf16"),
               Region("inner", frozenset({"2"}), "f16"))
    return Resolver(PrecisionConfig(kw.pop("default", "bf16:f32"), regions), **kw)


def test_resolver_innermost_region_wins_over_outer():
    r = _resolver(type_defaults="VAE=f32")
    assert r.policy("2", "MODEL").spec == "f16"
    assert r.policy("1", "MODEL").spec == "bf16"
    assert r.resolve("2").for_type("MODEL").spec == "f16"
    assert r.resolve("2").region == "inner"


def test_resolver_region_listed_inner_first_still_wins():
    regions = (Region("inner", frozenset({"2"}), "f16"),
               Region("outer", frozenset({"1", "2"}), "bf16"))
    assert Resolver(PrecisionConfig(None, regions)).policy("2", "MODEL").spec == "f16"


def test_resolver_type_default_beats_workflow_default_outside_regions():
    r = _resolver(type_defaults={"VAE": "f32"})
    assert r.policy("9", "VAE").spec == "f32"
    assert r.policy("9", "MODEL").spec == "bf16:f32"      # the file's default
    assert r.policy("1", "VAE").spec == "bf16"            # region beats the type default


def test_resolver_cli_default_beats_file_default_and_auto_is_last():
    assert _resolver(cli_default="f16").policy("9", "MODEL").spec == "f16"
    assert Resolver(None).policy("9", "MODEL") == F32     # auto on cpu
    with pytest.raises(PrecisionError):
        Resolver(PrecisionConfig(None, (Region("r", frozenset({"1"}), "bogus"),)))


# --- resolve: the per-use rules (handle pin, pinned storage, int8, NaN-guard f32) ---------------

def test_resolve_handle_pin_beats_the_engine_policy():
    assert resolve(parse_spec("bf16"), pinned=parse_spec("f16:f32")).spec == "f16:f32"
    assert resolve(parse_spec("bf16")) == parse_spec("bf16")


def test_resolve_pinned_storage_keeps_compute_and_flags():
    p = resolve(parse_spec("bf16+upcast"), storage=torch.float8_e4m3fn)
    assert (p.storage, p.compute, p.spec) == (torch.float8_e4m3fn, torch.bfloat16, "fp8_e4m3fn:bf16+upcast")
    assert resolve(parse_spec("f32"), storage=torch.float32) is parse_spec("f32")


def test_resolve_int8_with_pinned_fp8_storage_stores_fp8_computes_f32_and_warns():
    warned = []
    p = resolve(parse_spec("f32"), pinned=parse_spec("int8"), storage=torch.float8_e4m3fn, warn=warned.append)
    assert (p.storage, p.compute, p.int8, p.spec) == (torch.float8_e4m3fn, torch.float32, False, "fp8_e4m3fn:f32")
    assert len(warned) == 1 and "int8" in warned[0] and "fp8_e4m3fn:f32" in warned[0]
    assert resolve(parse_spec("int8")).int8           # no pin: int8 stays int8


def test_resolve_f32_compute_beats_pin_and_pinned_storage():
    p = resolve(parse_spec("bf16"), pinned=parse_spec("f16"), storage=torch.float8_e5m2, f32_compute=True)
    assert (p.storage, p.compute, p.spec) == (torch.float8_e5m2, torch.float32, "fp8_e5m2:f32")
    assert resolve(parse_spec("int8"), f32_compute=True) == parse_spec("int8")


def test_resolve_accepts_any_policy_like_pin():
    class Pin:
        storage, compute, upcast_attention, f32_norms, int8 = torch.bfloat16, torch.float32, False, False, False

    p = resolve(F32, pinned=Pin())
    assert isinstance(p, Policy) and p.spec == "bf16:f32"


# --- parse_config and the load-time check -------------------------------------------------------

def test_parse_config_names_every_bad_spec_and_where():
    cfg = PrecisionConfig("f99", (Region("ok", frozenset({"1"}), "bf16"),
                                  Region("unet", frozenset({"2"}), "fp8_e4m3fn"),
                                  Region("Sampling", frozenset({"3"}), "bf16+fast", origin="group")))
    with pytest.raises(PrecisionError) as e:
        parse_config(cfg)
    assert len(e.value.problems) == 3
    default, region, group = e.value.problems
    assert default.startswith("precision default is 'f99'") and "unknown storage dtype" in default
    assert region.startswith("precision of region 'unet'") and "storage format only" in region
    assert group.startswith("precision of group 'Sampling'") and "unknown flag" in group


def test_parse_config_parses_default_and_regions_once_in_order():
    cfg = PrecisionConfig("bf16", (Region("a", frozenset({"1"}), "f16+upcast"),))
    parsed = parse_config(cfg)
    assert parsed.default.spec == "bf16" and [(r.name, p.spec) for r, p in parsed.regions] == [("a", "f16+upcast")]
    assert parse_config(None).default is None and parse_config(PrecisionConfig()).regions == ()


ENVELOPE_PROMPT = {"1": call("Const", value=2), "2": call("Show", value=link(1))}


def test_load_workflow_envelope_bad_default_is_invalid_precision():
    env = {"format": "mixgraph/1", "prompt": ENVELOPE_PROMPT, "precision": {"default": "f99"}}
    with pytest.raises(InvalidPrecision, match=r"precision default is 'f99': unknown storage dtype") as e:
        load_workflow(env, toy.registry())
    assert isinstance(e.value, WorkflowError) and e.value.error_type == "invalid_precision"


def test_load_workflow_envelope_bad_region_names_the_region():
    env = {"format": "mixgraph/1", "prompt": ENVELOPE_PROMPT,
           "precision": {"default": "bf16", "regions": [{"name": "vae part", "nodes": ["2"], "precision": "bf16:f8"}]}}
    with pytest.raises(InvalidPrecision, match=r"precision of region 'vae part' is 'bf16:f8'"):
        load_workflow(env, toy.registry())


def test_load_workflow_ui_group_with_bad_spec_names_the_group():
    ui = {"nodes": [{"id": 1, "type": "Const", "pos": [10, 10], "size": [100, 50], "mode": 0,
                     "inputs": [], "outputs": [{"name": "INT", "type": "INT", "links": [1]}],
                     "widgets_values": [2]},
                    {"id": 2, "type": "Show", "pos": [300, 10], "size": [100, 50], "mode": 0,
                     "inputs": [{"name": "value", "type": "INT", "link": 1}], "outputs": []}],
          "links": [[1, 1, 0, 2, 0, "INT"]],
          "groups": [{"title": "Numbers", "bounding": [0, 0, 200, 100], "properties": {"precision": "f99"}}]}
    with pytest.raises(InvalidPrecision, match=r"precision of group 'Numbers' is 'f99'"):
        load_workflow(ui, toy.registry())
    ui["groups"][0]["properties"]["precision"] = "bf16"
    wf = load_workflow(ui, toy.registry())
    assert [(r.name, r.precision, r.origin) for r in wf.precision.regions] == [("Numbers", "bf16", "group")]


def test_precision_node_int8_is_a_whole_spec_whatever_the_other_widgets_say():
    from mixgraph.nodes.declare.model_patches.precision_nodes import policy_from

    assert policy_from("int8", "bf16", True, True) == parse_spec("int8")
    assert policy_from("int8:bf16", "f32", False, True) == parse_spec("int8:bf16")
    assert policy_from("fp8_e4m3fn", "bf16", True, False).spec == "fp8_e4m3fn:bf16+upcast_attention"
