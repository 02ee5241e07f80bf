"""FHIRPath `where:` conditions of site rules: an allowed subset, checked when the rules load, evaluated under a budget.

Checked at load: only the functions in ALLOWED (no `trace()`, which prints values; no `repeat()` or
`aggregate()`, which iterate without bound; nothing that resolves or defines), and the pattern of `matches()` and
`replaceMatches()` a string literal that RE2 (linear time, no backreferences) compiles. Evaluated: every step
counted (at most MAX_STEPS per evaluation), every collection and string size-capped, and the record's deadline
(text_deid/budget.py) checked; a condition that errors or runs out refuses the record (ConditionFailed), and its
message names neither a value nor fhirpathpy's own message, which may quote one.
"""
from __future__ import annotations

import time
from contextvars import ContextVar
from functools import lru_cache
from typing import Callable

import fhirpathpy
import fhirpathpy.engine
import re2
from fhirpathpy.parser import parse

from fhir_transforms.errors import RecordRefused
from text_deid import budget

ALLOWED = frozenset({
    "empty", "exists", "all", "allTrue", "anyTrue", "allFalse", "anyFalse", "subsetOf", "supersetOf", "count",
    "distinct", "isDistinct", "where", "select", "ofType", "as", "is", "first", "last", "tail", "skip", "take",
    "single", "intersect", "exclude", "union", "combine", "iif", "not", "toString", "toInteger", "toDecimal",
    "toBoolean", "toDate", "toDateTime", "toTime", "toQuantity", "convertsToString", "convertsToInteger",
    "convertsToDecimal", "convertsToBoolean", "convertsToDate", "convertsToDateTime", "convertsToTime",
    "convertsToQuantity", "indexOf", "substring", "startsWith", "endsWith", "contains", "upper", "lower",
    "replace", "matches", "replaceMatches", "length", "toChars", "trim", "split", "join", "children",
    "descendants", "extension", "hasValue", "abs", "ceiling", "floor", "round", "truncate", "sqrt", "exp", "ln",
    "log", "power", "sum", "min", "max", "avg", "today", "now", "timeOfDay", "type",
})
REGEX_FUNCTIONS = ("matches", "replaceMatches")
MAX_STEPS = 20_000  # fhirpathpy evaluation steps per condition and element; a real condition takes under a hundred
MAX_ITEMS = 10_000  # items in any one collection
MAX_TEXT = 100_000  # characters in any one string
DEADLINE_EVERY = 256  # steps between two looks at the clock


class ConditionError(ValueError):
    """A condition outside the allowed subset (raised when the rules load; the caller names the file and line)."""


class ConditionFailed(RecordRefused):
    """A condition errored or ran out of its budget while a record was de-identified: the record is refused."""


def _functions(node: dict):
    """(name, parameter nodes) of every function invocation in a parsed expression."""
    if node.get("type") == "Functn":
        children = node.get("children", [])
        name = children[0].get("text", "") if children else ""
        params = children[1].get("children", []) if len(children) > 1 else []
        yield name, params
    for child in node.get("children", []):
        yield from _functions(child)


def _string_literal(node: dict) -> str | None:
    """The value of a parameter that is a bare string literal, else None."""
    while node.get("type") in ("TermExpression", "LiteralTerm") and len(node.get("children", [])) == 1:
        node = node["children"][0]
    if node.get("type") != "StringLiteral":
        return None
    return fhirpathpy.evaluate({}, node["text"])[0]


@lru_cache(maxsize=256)
def _regex(pattern: str):
    options = re2.Options()
    options.log_errors = False
    options.max_mem = 8 << 20
    return re2.compile(pattern, options)


def check(expression: str) -> None:
    """Refuse an expression outside the allowed subset (ConditionError, which names the function or pattern)."""
    try:
        tree = parse(expression)
    except Exception as e:  # the ANTLR parser raises its own kinds
        raise ConditionError(f"not a FHIRPath expression ({str(e)[:120]})") from None
    for name, params in _functions(tree):
        if name not in ALLOWED:
            raise ConditionError(f"function {name[:40]}() is not allowed in a condition (allowed: docs/rules.md)")
        if name in REGEX_FUNCTIONS:
            pattern = _string_literal(params[0]) if params else None
            if pattern is None:
                raise ConditionError(f"{name}(): the pattern must be a string literal")
            try:
                _regex(pattern)
            except re2.error:
                raise ConditionError(f"{name}(): the pattern is not one RE2 runs in linear time (no "
                                     "backreferences or lookaround)") from None


def _matches(coll, pattern):
    if not coll or not pattern:
        return []
    return _regex(pattern).search(_one_string(coll)) is not None


def _replace_matches(coll, pattern, replacement):
    if not coll or isinstance(pattern, list) or isinstance(replacement, list):
        return []
    # FHIRPath writes a group as $1; RE2, as Python, as \1
    return _regex(pattern).sub(re2.compile(r"\$(\d+)").sub(r"\\\1", replacement), _one_string(coll))


def _one_string(coll) -> str:
    if len(coll) != 1 or not isinstance(coll[0], str):
        raise ValueError("a string function applied to what is not one string")
    return coll[0]


# fhirpathpy's own matches() and replaceMatches() use Python's backtracking `re`: these use RE2 instead
LINEAR_REGEX = {"matches": {"fn": _matches, "arity": {1: ["String"]}, "nullable_input": True},
                "replaceMatches": {"fn": _replace_matches, "arity": {2: ["String", "String"]}, "nullable_input": True}}


class _Budget:
    __slots__ = ("steps", "deadline")

    def __init__(self, deadline: float | None):
        self.steps = 0
        self.deadline = deadline


_budget: ContextVar[_Budget | None] = ContextVar("deid_condition_budget", default=None)
_do_eval = fhirpathpy.engine.do_eval


def _counted_do_eval(ctx, parent_data, node):
    """fhirpathpy evaluates every node through engine.do_eval (looked up on the module at each call); counted here
    so a condition stops at its budget. Outside a condition's evaluation it only passes through."""
    spent = _budget.get()
    if spent is None:
        return _do_eval(ctx, parent_data, node)
    spent.steps += 1
    if spent.steps > MAX_STEPS:
        raise _OverBudget(f"more than {MAX_STEPS} steps")
    if spent.deadline is not None and spent.steps % DEADLINE_EVERY == 0 and time.monotonic() > spent.deadline:
        raise _OverBudget("past the record's deadline")
    result = _do_eval(ctx, parent_data, node)
    if isinstance(result, list):
        if len(result) > MAX_ITEMS:
            raise _OverBudget(f"a collection of more than {MAX_ITEMS} items")
        if len(result) <= 64 and any(isinstance(r, str) and len(r) > MAX_TEXT for r in result):
            raise _OverBudget(f"a string of more than {MAX_TEXT} characters")
    elif isinstance(result, str) and len(result) > MAX_TEXT:
        raise _OverBudget(f"a string of more than {MAX_TEXT} characters")
    return result


class _OverBudget(Exception):
    pass


fhirpathpy.engine.do_eval = _counted_do_eval


def compile_condition(expression: str) -> Callable:
    """A checked condition, compiled once (ConditionError when it is outside the subset or does not evaluate)."""
    check(expression)
    test = fhirpathpy.compile(expression, options={"userInvocationTable": LINEAR_REGEX})
    token = _budget.set(_Budget(None))
    try:
        test({})  # fhirpathpy compiles lazily: a first evaluation finds what it cannot parse or does not implement
    except Exception as e:  # on an empty element, so its message quotes the expression only
        raise ConditionError(f"not a FHIRPath expression ({str(e)[:120]})") from None
    finally:
        _budget.reset(token)
    return test


def holds(test: Callable, node) -> bool:
    """The condition's answer on `node`: true only for a single `true`; ConditionFailed when it errors or runs out."""
    token = _budget.set(_Budget(budget.current()))
    try:
        answer = test(node)
    except _OverBudget as e:
        raise _failed(f"over its budget ({e})") from None
    except RecursionError:
        raise _failed("over its budget (nested too deep)") from None
    except Exception as e:  # fhirpathpy raises its own kinds, with messages that may quote a value
        raise _failed(f"an error ({type(e).__name__})") from None
    finally:
        _budget.reset(token)
    return answer == [True]


def _failed(reason: str) -> ConditionFailed:
    return ConditionFailed(f"a site rule's where condition failed: {reason}")
