"""The editor's colour-picker value (COLOR, `"#rrggbb"`) as numbers, for ComfyUI's newer
`ColorToRGBInt` ("Color Picker": an RGB integer, the hex string and an alpha)."""

from __future__ import annotations

from typing import Any


def rgb_int_and_alpha(value: Any) -> tuple[int, float]:
    """`"#rrggbb"` -> (0xRRGGBB, 1.0); `"#rrggbbaa"` -> (0xRRGGBB, aa / 255). The `#` is optional,
    hex digits either case. Anything else is a ValueError naming the value (mixgraph's reading:
    the node's source was not available; the editor's picker writes `#rrggbb`)."""
    if not isinstance(value, str):
        raise ValueError(f"a colour is a string '#rrggbb', got {type(value).__name__}")
    digits = value.strip().removeprefix("#")
    if len(digits) not in (6, 8) or any(c not in "0123456789abcdefABCDEF" for c in digits):
        raise ValueError(f"colour {value!r} is not '#rrggbb' (or '#rrggbbaa') in hex digits")
    alpha = int(digits[6:], 16) / 255.0 if len(digits) == 8 else 1.0
    return int(digits[:6], 16), alpha
