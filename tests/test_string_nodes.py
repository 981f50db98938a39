"""Primitive and string nodes (ComfyUI nodes_primitive / nodes_string): specs and behaviour."""

import sys

import pytest

from mixgraph.nodes.helpers import text_ops
from mixgraph.ui import api

REG = api.default_registry()
INFO = REG.object_info()


def _run(name, **kw):
    return REG.get(name).fn(**kw)


def test_primitive_specs_match_comfyui():
    value = INFO["PrimitiveInt"]["input"]["required"]["value"]
    assert value == ["INT", {"default": 0, "min": -sys.maxsize, "max": sys.maxsize,
                             "control_after_generate": True}]
    assert INFO["PrimitiveStringMultiline"]["input"]["required"]["value"][1]["multiline"] is True
    for name, out in [("PrimitiveInt", "INT"), ("PrimitiveFloat", "FLOAT"), ("PrimitiveString", "STRING"),
                      ("PrimitiveBoolean", "BOOLEAN"), ("PrimitiveStringMultiline", "STRING")]:
        assert INFO[name]["output"] == [out]
    assert _run("PrimitiveFloat", value=2.5) == (2.5,)


def test_string_specs_match_comfyui():
    assert INFO["StringConcatenate"]["input_order"]["required"] == ["string_a", "string_b", "delimiter"]
    assert INFO["CaseConverter"]["input"]["required"]["mode"][0] == ["UPPERCASE", "lowercase", "Capitalize",
                                                                     "Title Case"]
    assert INFO["StringTrim"]["input"]["required"]["mode"][0] == ["Both", "Left", "Right"]
    assert INFO["StringCompare"]["input"]["required"]["mode"][0] == ["Starts With", "Ends With", "Equal"]
    assert INFO["RegexExtract"]["input"]["required"]["mode"][0] == ["First Match", "All Matches",
                                                                    "First Group", "All Groups"]
    assert INFO["RegexExtract"]["input"]["required"]["group_index"] == ["INT", {"default": 1, "min": 0,
                                                                                "max": 100}]
    assert INFO["RegexReplace"]["input_order"] == {
        "required": ["string", "regex_pattern", "replace"],
        "optional": ["case_insensitive", "multiline", "dotall", "count"]}
    assert INFO["StringLength"]["output"] == ["INT"] and INFO["StringLength"]["output_name"] == ["length"]
    assert INFO["StringContains"]["output"] == ["BOOLEAN"]


def test_string_basic_operations():
    assert _run("StringConcatenate", string_a="a", string_b="b", delimiter=", ") == ("a, b",)
    assert _run("StringSubstring", string="abcdef", start=1, end=-1) == ("bcde",)
    assert _run("StringLength", string="héllo") == (5,)
    assert _run("CaseConverter", string="hello wORLD", mode="Capitalize") == ("Hello world",)
    assert _run("CaseConverter", string="hello wORLD", mode="Title Case") == ("Hello World",)
    assert _run("StringTrim", string="  x \n", mode="Left") == ("x \n",)
    assert _run("StringReplace", string="a-b-c", find="-", replace="+") == ("a+b+c",)
    assert _run("StringContains", string="Hello", substring="hell", case_sensitive=False) == (True,)
    assert _run("StringContains", string="Hello", substring="hell", case_sensitive=True) == (False,)
    assert _run("StringCompare", string_a="Hello", string_b="LO", mode="Ends With",
                case_sensitive=False) == (True,)


@pytest.mark.parametrize("mode,expected", [("First Match", "a1"), ("All Matches", "a\nb"),
                                           ("First Group", "1"), ("All Groups", "1\n2")])
def test_regex_extract_modes(mode, expected):
    out = _run("RegexExtract", string="A1 b2", regex_pattern=r"([a-z])(\d)" if mode == "All Matches"
               else r"[a-z](\d)", mode=mode, case_insensitive=True, multiline=False, dotall=False,
               group_index=1)
    assert out == (expected.replace("a1", "A1").replace("a\nb", "A\nb"),)


def test_regex_match_replace_and_bad_pattern():
    fl = text_ops.flags(False, True, False)
    assert text_ops.regex_match("x\nfoo", "^foo$", fl) is True
    assert text_ops.regex_match("x", "(", 0) is False
    assert text_ops.regex_extract("x", "(", "First Match", 0, 1) == ""
    assert _run("RegexReplace", string="aAa", regex_pattern="a", replace="-", case_insensitive=True,
                multiline=False, dotall=False, count=2) == ("--a",)
