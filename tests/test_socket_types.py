"""Socket types and precision roles as registrations (graph.spec, graph.roles): what the engine
knows of a type is what a library registered, and presets decide per role."""

import pytest
import torch

from mixgraph.graph.cache import OutputCache
from mixgraph.graph.env import Env
from mixgraph.graph.executor import Executor, NodeError
from mixgraph.graph.node import Socket, String, Widget, node
from mixgraph.graph.precision import DeviceCaps, Resolver, cpu_caps_from_flags, preset_spec
from mixgraph.graph.prompt import PrecisionConfig, Region
from mixgraph.graph.roles import RolePresets, register_preset_role, register_role, unregister_role
from mixgraph.graph.spec import MODEL_TYPES, SOCKET_TYPES, WIDGET_TYPES, register_socket_type
from tests import toy_nodes as toy
from tests.toy_nodes import call, link

ZEN4 = cpu_caps_from_flags({"avx512f", "avx512_bf16", "avx512_vnni"})
AMPERE = DeviceCaps("cuda", native_bf16=True, native_f16=True, native_int8=True)

#: A toy model socket type whose handle holds two models with roles of their own (the roles are
#: registered per test, `toy_roles`: other tests list every registered role).
TOY = "TOY_ENCODER"
register_socket_type(TOY, model=True)
SMALL = RolePresets(balanced=("native_half", "f32"))
# a large part: 16-bit storage under `balanced` already, fp8 under `memory`
LARGE = RolePresets(quality=("f32",), balanced=("bf16:f32",), memory=("fp8_e4m3fn:bf16",),
                    fast=("native_half", "f32"))


@pytest.fixture
def toy_roles():
    register_preset_role("toy_small", SMALL)
    register_preset_role("toy_large", LARGE)
    register_role(TOY, "toy_small")
    register_role(TOY, "toy_large")
    yield
    unregister_role(TOY)


# --- socket types -------------------------------------------------------------------------------

def test_socket_types_generic_ones_and_unregistered_ones():
    for name in ("INT", "FLOAT", "STRING", "BOOLEAN", "COMBO"):
        assert SOCKET_TYPES.is_widget(name) and name in WIDGET_TYPES
    assert SOCKET_TYPES.get("*").link_only
    # a custom pack's own type: never registered, a link-only socket holding no model
    assert SOCKET_TYPES.get("MY_PACK_THING") is None
    assert not Socket("MY_PACK_THING").is_widget and not SOCKET_TYPES.is_model("MY_PACK_THING")


def test_socket_types_register_is_idempotent_and_refuses_a_redefinition():
    register_socket_type("TOY_PAYLOAD")
    register_socket_type("TOY_PAYLOAD")
    with pytest.raises(ValueError, match="TOY_PAYLOAD.*registered already"):
        register_socket_type("TOY_PAYLOAD", model=True)
    with pytest.raises(ValueError, match="link-only"):
        register_socket_type("TOY_WIDGET_MODEL", link_only=False, model=True)


def test_socket_types_a_model_type_joins_precision_types_and_a_widget_type_takes_literals():
    register_socket_type("TOY_HELD", model=True)
    register_socket_type("TOY_SWATCH", link_only=False)
    assert "TOY_HELD" in MODEL_TYPES and "TOY_SWATCH" in WIDGET_TYPES   # live views

    @node(outputs=["INT"], precision_types=("TOY_HELD",), register=False)
    def Declares(swatch=Widget("TOY_SWATCH", "#000000"), other=Socket("TOY_HELD")):
        return 0

    assert Declares.spec.precision_types == ("TOY_HELD",)
    assert Declares.spec.input_map["swatch"].is_widget
    with pytest.raises(TypeError, match="not registered model socket types"):
        node(precision_types=("TOY_NEVER",), register=False)(lambda: 0)
    with pytest.raises(TypeError, match="register_socket_type"):
        Widget("TOY_NEVER", 1)


# --- precision roles ----------------------------------------------------------------------------

def test_roles_a_socket_type_without_a_role_gets_the_careful_default():
    assert preset_spec("balanced", "TOY_NO_ROLE", ZEN4) == "f32"
    assert preset_spec("balanced", "TOY_NO_ROLE", AMPERE) == "bf16"
    assert preset_spec("memory", "TOY_NO_ROLE", ZEN4) == "bf16:f32"
    assert preset_spec("fast", "TOY_NO_ROLE", AMPERE) == "f16"


def test_roles_presets_resolve_per_role_explicit_specs_do_not(toy_roles):
    r = Resolver(None, caps=ZEN4)
    assert r.policy("1", TOY).spec == "bf16"                         # its own role: toy_small
    assert r.policy("1", TOY, role="toy_large").spec == "bf16:f32"
    assert r.resolve("1").for_type(TOY, "toy_large").spec == "bf16:f32"
    r = Resolver(None, cli_default="memory", caps=ZEN4)
    assert r.policy("1", TOY).spec == "bf16:f32"
    assert r.policy("1", TOY, role="toy_large").storage == torch.float8_e4m3fn
    r = Resolver(None, cli_default="f16", caps=ZEN4)                  # a SPEC is a SPEC
    assert r.policy("1", TOY).spec == r.policy("1", TOY, role="toy_large").spec == "f16"
    r = Resolver(None, {TOY: "memory"}, caps=ZEN4)                     # a preset type default
    assert r.policy("1", TOY, role="toy_large").spec == "fp8_e4m3fn:bf16"
    r = Resolver(None, {TOY: "bf16"}, caps=ZEN4)                       # an explicit one
    assert r.policy("1", TOY, role="toy_large").spec == "bf16"
    cfg = PrecisionConfig("f32", (Region("part", frozenset({"2"}), "memory"),))
    r = Resolver(cfg, caps=ZEN4)
    assert r.policy("2", TOY, role="toy_large").spec == "fp8_e4m3fn:bf16"
    assert r.policy("1", TOY, role="toy_large").spec == "f32"


def test_roles_cache_key_holds_every_registered_role(toy_roles):
    r = Resolver(None, cli_default="memory", caps=ZEN4)
    assert r.key_spec("1", TOY) == "bf16:f32|toy_large=fp8_e4m3fn:bf16"
    assert r.key_spec("1", "TOY_NO_ROLE") == r.policy("1", "TOY_NO_ROLE").spec


def test_roles_registration_errors_name_what_is_wrong(toy_roles):
    with pytest.raises(LookupError, match="register_preset_role"):
        register_role(TOY, "toy_undeclared")
    with pytest.raises(ValueError, match="toy_large.*registered already"):
        register_preset_role("toy_large", RolePresets())
    with pytest.raises(ValueError, match="is a preset"):
        RolePresets(balanced=("auto",))
    with pytest.raises(TypeError, match="non-empty tuple"):
        RolePresets(memory=())
    with pytest.raises(LookupError, match="not declared"):
        Resolver(None, cli_default="memory").policy("1", TOY, role="toy_undeclared")


# --- through a run --------------------------------------------------------------------------

@node(outputs=["STRING"], precision_types=(TOY,), register=False)
def LargePartSpec(tag=String(""), ctx=None):
    """The SPEC the large part of a TOY_ENCODER handle runs under in this node."""
    return ctx.policy_for(TOY, role="toy_large").spec


@node(outputs=["STRING"], precision_types=(TOY,), register=False)
def AsksUnregisteredRole(tag=String(""), ctx=None):
    return ctx.policy_for(TOY, role="toy_elsewhere").spec


def _executor(tmp_path):
    reg = toy.registry()
    reg.add(LargePartSpec.spec)
    reg.add(AsksUnregisteredRole.spec)
    env = Env(models=(), input=tmp_path, output=tmp_path / "out", temp=tmp_path / "temp")
    return Executor(reg, env, OutputCache(2**20))


def test_roles_a_node_asks_for_a_role_and_is_rerun_when_only_that_role_changes(tmp_path, toy_roles):
    ex = _executor(tmp_path)
    prompt = {"1": call("LargePartSpec", tag="a"), "2": call("ShowText", text=link(1))}
    # the suite's CPU has no native half: toy_small is f32 under quality and balanced alike
    assert ex.run(prompt, precision="quality").values["1"] == ("f32",)
    again = ex.run(prompt, precision="balanced")
    assert again.executed and again.values["1"] == ("bf16:f32",)


def test_roles_a_node_asking_an_unregistered_role_fails_naming_it(tmp_path, toy_roles):
    with pytest.raises(NodeError, match="toy_elsewhere.*not a registered role of TOY_ENCODER"):
        _executor(tmp_path).run({"1": call("AsksUnregisteredRole", tag="a"),
                                 "2": call("ShowText", text=link(1))})



# --- the node library's registrations -------------------------------------------------------------

def test_library_registers_comfyui_model_types_and_the_diffusion_roles():
    from mixgraph.graph.roles import ROLES
    from mixgraph.nodes import socket_types

    assert set(socket_types.MODEL_SOCKETS) <= set(MODEL_TYPES)
    assert not SOCKET_TYPES.is_widget("LATENT") and SOCKET_TYPES.is_widget("BOUNDING_BOX")
    assert [ROLES.role_of(s) for s in ("MODEL", "CONTROL_NET", "CLIP", "VAE", "CLIP_VISION")] == \
        ["unet", "unet", "text", "vae", None]
    assert ROLES.primary == "MODEL"
    assert Resolver(None, caps=ZEN4).describe()["default"] == "bf16"   # the denoiser's auto


def test_library_every_role_a_family_names_is_declared():
    """A family names its parts' roles (`Family.precision_roles`); nodes/socket_types.py must
    declare each, or every preset fails for that part."""
    from mixgraph.graph.roles import ROLES
    from mixgraph.nodes import library  # noqa: F401  (the families the library registers)
    from mixgraph.nodes.families.registry import FAMILIES

    undeclared = [f"{family.name}: {part} -> {role}" for family in FAMILIES.values()
                  for part, role in family.precision_roles.items() if role not in ROLES.declared()]
    assert not undeclared, f"roles to declare in nodes/socket_types.py: {undeclared}"


def test_library_every_declared_role_gives_a_valid_spec_on_every_device():
    """A role's candidates are checked where they are evaluated; this runs each one."""
    from mixgraph.graph.precision import PRESETS, parse_spec
    from mixgraph.graph.roles import ROLES
    from mixgraph.nodes import socket_types  # noqa: F401

    devices = [ZEN4, AMPERE, cpu_caps_from_flags({"avx2"}), DeviceCaps("mps", False, True),
               DeviceCaps("cuda", native_bf16=False, native_f16=True)]
    for role in ROLES.declared():
        for caps in devices:
            for preset in PRESETS:
                assert parse_spec(preset_spec(preset, None, caps, role=role)).spec


def test_roles_large_text_encoders_store_half_under_balanced():
    """T5-XXL / Qwen3-4B / Gemma 2 (role ``text_large``, the DiT families' slots) store bf16 under
    `balanced` and fp8 under `memory`, computing f32 off accelerators; CLIP-L/G (``text``) stay
    f32. An explicit SPEC (a region, a type default) applies to both roles."""
    from mixgraph.nodes.families import registry

    assert preset_spec("balanced", "CLIP", ZEN4, role="text_large") == "bf16:f32"
    assert preset_spec("memory", "CLIP", ZEN4, role="text_large") == "fp8_e4m3fn:f32"
    assert preset_spec("quality", "CLIP", ZEN4, role="text_large") == "f32"
    assert preset_spec("balanced", "CLIP", ZEN4) == "f32"
    assert preset_spec("balanced", "CLIP", AMPERE, role="text_large") == "bf16"
    large = {(f.name, s.name) for f in registry.FAMILIES.values() for v in (getattr(f, "clip_types", None) or {}).values()
             for s in f.text_encoders(v) if s.role == "text_large"}
    assert {("flux", "t5xxl"), ("sd3", "t5xxl"), ("lumina2", "gemma2_2b"), ("z_image", "qwen3_4b")} <= large
    resolver = Resolver(PrecisionConfig("f32", ()), device="cpu")
    assert resolver.policy("1", "CLIP", role="text_large").spec == "f32"
