"""Precision SPEC grammar, auto resolution and the resolver's order (DESIGN §4)."""

import pytest
import torch

from mixgraph.graph.precision import (F32, Policy, PrecisionError, Resolver, auto_spec, emulation_warning,
                             format_spec, parse_precision_arg, parse_spec, parse_type_defaults)
from mixgraph.graph.prompt import PrecisionConfig, Region


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


def test_policy_as_f32_compute_keeps_storage():
    p = parse_spec("bf16+upcast").as_f32_compute()
    assert (p.storage, p.compute, p.is_half, p.spec) == (torch.bfloat16, torch.float32, False, "bf16:f32+upcast")
    assert F32.as_f32_compute() is F32


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
