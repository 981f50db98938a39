"""A safe arithmetic expression evaluator for ComfyMathExpression (ComfyUI 0.38.1, nodes_math.py).

ComfyUI evaluates the expression with the `simpleeval` package. We parse it with `ast` and
walk a whitelist instead (no `eval`, no attribute access, no names but the given values, no
functions but ComfyUI's table), which keeps the node free of a dependency for 150 lines:

* literals: numbers, strings, True / False / None; names: the inputs (`a`..`z`) and `values`
  (their list, in order);
* operators: `+ - * / // % **`, unary `- + not ~`, `& | ^ << >>`, comparisons (chained),
  `in` / `not in` / `is` / `is not`, `and` / `or`, `x if c else y`, subscripts `values[0]`;
* functions: sum (of a list or of its arguments), min, max, abs, round, pow, sqrt, ceil, floor,
  log, log2, log10, sin, cos, tan, int, float.

Resource guards as in ComfyUI: `**` exponents above 4,000,000 (simpleeval's MAX_POWER) and `pow`
exponents above 4,000 (ComfyUI's MAX_EXPONENT) are refused, shifts above 10,000 bits and strings
longer than 100,000 characters too.
"""

from __future__ import annotations

import ast
import math
import operator
from typing import Any, Callable

MAX_POWER = 4_000_000      # simpleeval's cap on the exponent of `**`
MAX_EXPONENT = 4000        # ComfyUI's cap on pow()'s exponent
MAX_SHIFT = 10_000
MAX_STRING = 100_000


class ExpressionError(ValueError):
    """An expression that cannot be evaluated: syntax, a forbidden construct, a missing name."""


def _sum(*args: Any) -> Any:
    if len(args) == 1 and hasattr(args[0], "__iter__"):
        return sum(args[0])
    return sum(args)


def _pow(base: Any, exp: Any) -> Any:
    if abs(exp) > MAX_EXPONENT:
        raise ExpressionError(f"Exponent {exp} exceeds maximum allowed ({MAX_EXPONENT})")
    return pow(base, exp)


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "sum": _sum, "min": min, "max": max, "abs": abs, "round": round, "pow": _pow,
    "sqrt": math.sqrt, "ceil": math.ceil, "floor": math.floor, "log": math.log,
    "log2": math.log2, "log10": math.log10, "sin": math.sin, "cos": math.cos, "tan": math.tan,
    "int": int, "float": float,
}


def _power(a: Any, b: Any) -> Any:
    if isinstance(b, (int, float)) and abs(b) > MAX_POWER:
        raise ExpressionError(f"Sorry! I don't want to evaluate {a} ** {b}")
    return a ** b


def _shift(op: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    def run(a: Any, b: Any) -> Any:
        if isinstance(b, int) and abs(b) > MAX_SHIFT:
            raise ExpressionError(f"Shift of {b} bits exceeds maximum allowed ({MAX_SHIFT})")
        return op(a, b)
    return run


def _checked_string(op: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    def run(a: Any, b: Any) -> Any:
        for s, n in ((a, b), (b, a)):   # "x" * 10**9 is refused before it is built
            if isinstance(s, str) and isinstance(n, int) and not isinstance(n, bool) \
                    and op is operator.mul and len(s) * n > MAX_STRING:
                raise ExpressionError(f"String longer than {MAX_STRING} characters")
        out = op(a, b)
        if isinstance(out, str) and len(out) > MAX_STRING:
            raise ExpressionError(f"String longer than {MAX_STRING} characters")
        return out
    return run


BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: _checked_string(operator.add), ast.Sub: operator.sub,
    ast.Mult: _checked_string(operator.mul), ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: _power,
    ast.BitAnd: operator.and_, ast.BitOr: operator.or_, ast.BitXor: operator.xor,
    ast.LShift: _shift(operator.lshift), ast.RShift: _shift(operator.rshift),
}
UNARY: dict[type, Callable[[Any], Any]] = {
    ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_,
    ast.Invert: operator.invert,
}
COMPARE: dict[type, Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge, ast.Is: operator.is_, ast.IsNot: operator.is_not,
    ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b,
}


def evaluate(expression: str, names: dict[str, Any]) -> Any:
    """The value of `expression` with `names` bound; ExpressionError on anything not allowed."""
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as e:
        raise ExpressionError(f"invalid expression {expression!r}: {e.msg}") from None
    try:
        return _Eval(names).visit(tree.body)
    except RecursionError:
        raise ExpressionError("expression nested too deeply") from None


class _Eval:
    def __init__(self, names: dict[str, Any]):
        self.names = names

    def visit(self, node: ast.AST) -> Any:
        method = getattr(self, "_" + type(node).__name__, None)
        if method is None:
            raise ExpressionError(f"{type(node).__name__} is not allowed in a math expression")
        return method(node)

    def _Constant(self, node: ast.Constant) -> Any:
        if not isinstance(node.value, (int, float, str, bool, type(None))):
            raise ExpressionError(f"literal {node.value!r} is not allowed")
        return node.value

    def _Name(self, node: ast.Name) -> Any:
        if node.id not in self.names:
            raise ExpressionError(f"'{node.id}' is not defined (the inputs are "
                                  f"{', '.join(self.names) or 'none'})")
        return self.names[node.id]

    def _BinOp(self, node: ast.BinOp) -> Any:
        op = BINARY.get(type(node.op))
        if op is None:
            raise ExpressionError(f"operator {type(node.op).__name__} is not allowed")
        return op(self.visit(node.left), self.visit(node.right))

    def _UnaryOp(self, node: ast.UnaryOp) -> Any:
        return UNARY[type(node.op)](self.visit(node.operand))

    def _BoolOp(self, node: ast.BoolOp) -> Any:
        value = None
        for v in node.values:   # short-circuit, returning the deciding operand
            value = self.visit(v)
            if isinstance(node.op, ast.And) and not value:
                return value
            if isinstance(node.op, ast.Or) and value:
                return value
        return value

    def _Compare(self, node: ast.Compare) -> Any:
        left = self.visit(node.left)
        for op, comp in zip(node.ops, node.comparators):
            right = self.visit(comp)
            if not COMPARE[type(op)](left, right):
                return False
            left = right
        return True

    def _IfExp(self, node: ast.IfExp) -> Any:
        return self.visit(node.body) if self.visit(node.test) else self.visit(node.orelse)

    def _Call(self, node: ast.Call) -> Any:
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
            shown = node.func.id if isinstance(node.func, ast.Name) else type(node.func).__name__
            raise ExpressionError(f"function {shown!r} is not allowed (allowed: "
                                  f"{', '.join(FUNCTIONS)})")
        if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            raise ExpressionError("* and ** arguments are not allowed")
        args = [self.visit(a) for a in node.args]
        kwargs = {k.arg: self.visit(k.value) for k in node.keywords}
        return FUNCTIONS[node.func.id](*args, **kwargs)

    def _Subscript(self, node: ast.Subscript) -> Any:
        return self.visit(node.value)[self.visit(node.slice)]

    def _Slice(self, node: ast.Slice) -> slice:
        part = [None if x is None else self.visit(x) for x in (node.lower, node.upper, node.step)]
        return slice(*part)


def math_expression(expression: str, values: dict[str, Any]) -> tuple[float, int, bool]:
    """ComfyMathExpression: the expression over the inputs (and `values`, their list), as
    (FLOAT, INT, BOOL); a non-numeric, too large or non-finite result is an error."""
    if not expression.strip():
        raise ExpressionError("Expression cannot be empty.")
    names = dict(values)
    names["values"] = list(values.values())
    result = evaluate(expression, names)
    if not isinstance(result, (int, float)):
        raise ExpressionError(f"Math Expression '{expression}' must evaluate to a numeric result, "
                              f"got {type(result).__name__}: {result!r}")
    try:
        as_float = float(result)
    except OverflowError:
        raise ExpressionError(f"Math Expression '{expression}' produced a result too large to "
                              f"represent as a float: {result}") from None
    if not math.isfinite(as_float):
        raise ExpressionError(f"Math Expression '{expression}' produced a non-finite result: "
                              f"{result}")
    return as_float, int(result), bool(result)


def number_convert(value) -> tuple[float, int]:
    """ComfyUI's ComfyNumberConvert (comfy_extras/nodes_number_convert.py): an INT, FLOAT,
    STRING or BOOLEAN as (float, int). Booleans are 1 / 0; a float's int truncates toward zero; a
    string is parsed as a number (its int: parsed as an int when it is one, else the float
    truncated). Empty or non-numeric strings and non-finite values are refused."""
    if isinstance(value, bool):
        return (1.0, 1) if value else (0.0, 0)
    if isinstance(value, int):
        return float(value), value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"Cannot convert non-finite value to number: {value}")
        return value, int(value)
    if isinstance(value, str):
        text = value.strip()
        if not text:
            raise ValueError("Cannot convert empty string to number.")
        try:
            as_float = float(text)
        except ValueError:
            raise ValueError(f"Cannot convert string to number: {value!r}") from None
        if not math.isfinite(as_float):
            raise ValueError(f"Cannot convert non-finite value to number: {as_float}")
        try:
            return as_float, int(text)
        except ValueError:
            return as_float, int(as_float)
    raise TypeError(f"Unsupported input type: {type(value).__name__}")
