"""Read Math-Verify's own pytest suite as data: (gold, prediction, expected) cases and options.

The suite (``tests/`` of a huggingface/Math-Verify checkout) is a set of pytest files whose tests
are ``@pytest.mark.parametrize("gold,pred,expected", [...])`` lists, each test calling a helper
(``compare_strings(gold, pred, match_types=[...], precision=..., strict=..., ...)``) or
``verify(parse(gold), parse(pred))``. Importing those files needs Math-Verify's conftest and
package layout, so this module reads them with ``ast`` instead: the parametrize lists are
evaluated as literals (plus f-strings over ``math.*`` calls, which one case uses), and the helper
call in the test body gives the Math-Verify options each case is meant to run with.
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass, field
from pathlib import Path

#: Math-Verify's ``verify`` defaults; a case that sets another value depends on that option.
DEFAULT_OPTIONS = {"precision": 6, "strict": True, "allow_set_relation_comp": False}


@dataclass(frozen=True)
class SuiteCase:
    """One labeled case. ``options``: the Math-Verify settings the suite runs it with."""

    id: str
    gold: str
    pred: str
    label: bool
    match_types: tuple[str, ...] = ("latex", "expr")
    helper: str = "compare_strings"  # or "parse_verify" (plain parse()/verify() defaults)
    options: dict[str, object] = field(default_factory=lambda: dict(DEFAULT_OPTIONS))

    @property
    def default_options(self) -> bool:
        """True when the label does not depend on a non-default Math-Verify option."""
        return all(self.options.get(k) == v for k, v in DEFAULT_OPTIONS.items())


class SuiteFormatError(ValueError):
    """A test file could not be read as data (names the file and the construct)."""


def _value(node: ast.expr) -> object:
    """Evaluate a literal, or an f-string whose parts are literals or ``math.f(literal)`` calls."""
    try:
        return ast.literal_eval(node)
    except ValueError:
        pass
    if isinstance(node, ast.Tuple | ast.List):
        return tuple(_value(e) for e in node.elts)
    if isinstance(node, ast.JoinedStr):
        out = []
        for part in node.values:
            if isinstance(part, ast.Constant):
                out.append(str(part.value))
            elif isinstance(part, ast.FormattedValue):
                spec = _value(part.format_spec) if part.format_spec is not None else ""
                out.append(format(_value(part.value), str(spec)))
            else:
                raise ValueError("unsupported f-string part")
        return "".join(out)
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "math"
        and not node.keywords
    ):
        fn = getattr(math, node.func.attr)
        return fn(*[_value(a) for a in node.args])
    raise ValueError(f"not a literal: {ast.dump(node)[:80]}")


def _helper_call(fn: ast.FunctionDef) -> tuple[str, dict[str, ast.expr]] | None:
    """Find ``compare_strings(...)`` or ``verify(parse(..), parse(..))`` in the test body."""
    for node in ast.walk(fn):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            continue
        if node.func.id == "compare_strings":
            return "compare_strings", {k.arg: k.value for k in node.keywords if k.arg}
        if node.func.id == "verify" and all(
            isinstance(a, ast.Call) and getattr(a.func, "id", "") == "parse" for a in node.args
        ):
            return "parse_verify", {}
    return None


def load_suite(path: Path) -> list[SuiteCase]:
    """Read every labeled (gold, pred, expected) case under ``path`` (a checkout or its tests/).

    Raises:
        FileNotFoundError: no ``test_*.py`` files under the path.
        SuiteFormatError: a parametrize list could not be read as data.
    """
    root = path / "tests" if (path / "tests").is_dir() else path
    files = sorted(root.glob("test_*.py"))
    if not files:
        raise FileNotFoundError(
            f"no test_*.py files in {root}: pass a huggingface/Math-Verify checkout or its tests/"
        )
    cases: list[SuiteCase] = []
    for file in files:
        tree = ast.parse(file.read_text(), filename=str(file))
        for fn in tree.body:
            if isinstance(fn, ast.FunctionDef):
                cases.extend(_cases_of(file, fn))
    return cases


def _cases_of(file: Path, fn: ast.FunctionDef) -> list[SuiteCase]:
    helper = _helper_call(fn)
    if helper is None:
        return []
    kind, kwargs = helper
    out: list[SuiteCase] = []
    for dec in fn.decorator_list:
        if not (
            isinstance(dec, ast.Call)
            and getattr(dec.func, "attr", "") == "parametrize"
            and len(dec.args) >= 2
        ):
            continue
        names_raw = _value(dec.args[0])
        names = (
            [s.strip() for s in names_raw.split(",")]
            if isinstance(names_raw, str)
            else list(names_raw)  # type: ignore[call-overload]
        )
        label_name = next((n for n in ("expected", "result") if n in names), None)
        if "gold" not in names or "pred" not in names or label_name is None:
            continue
        if not isinstance(dec.args[1], ast.List | ast.Tuple):
            raise SuiteFormatError(f"{file.name}::{fn.name}: parametrize values are not a list")
        for i, row in enumerate(dec.args[1].elts):
            try:
                values = _value(row)
            except (ValueError, AttributeError, TypeError) as exc:
                raise SuiteFormatError(f"{file.name}::{fn.name}[{i}]: {exc}") from exc
            params = dict(zip(names, values))  # type: ignore[call-overload]
            options = dict(DEFAULT_OPTIONS)
            match_types: tuple[str, ...] = ("latex", "expr")
            for key, node in kwargs.items():
                value = params[node.id] if isinstance(node, ast.Name) else _value(node)
                if key == "match_types":
                    match_types = tuple(value)  # type: ignore[arg-type]
                elif key in options:
                    options[key] = value
            out.append(
                SuiteCase(
                    id=f"{file.stem}::{fn.name}[{i}]",
                    gold=str(params["gold"]),
                    pred=str(params["pred"]),
                    label=bool(params[label_name]),
                    match_types=match_types,
                    helper=kind,
                    options=options,
                )
            )
    return out
