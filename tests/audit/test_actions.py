"""Every action the code records is in the audit catalogue (``dashboard/audit/actions.py``),
so the log's Action filter offers each one by name."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

from dashboard.audit.actions import ACTIONS, MODES
from dashboard.saved_memories.models import FORGET_MODES

ROOT = Path(__file__).resolve().parents[2]


def recorded_actions() -> set[str]:
    """The ``action=`` of every ``record_event`` call in the app and its jobs: literals,
    both arms of a conditional, module constants, and f-strings over the forget modes."""
    found: set[str] = set()
    for path in [*ROOT.joinpath("dashboard").rglob("*.py"), *ROOT.joinpath("jobs").rglob("*.py")]:
        tree = ast.parse(path.read_text())
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or getattr(node.func, "id", None) != "record_event":
                continue
            for keyword in node.keywords:
                if keyword.arg == "action":
                    found |= _values(keyword.value, module)
    return found


def _values(node: ast.expr, module: str) -> set[str]:
    if isinstance(node, ast.Constant):
        return {node.value}
    if isinstance(node, ast.IfExp):
        return _values(node.body, module) | _values(node.orelse, module)
    if isinstance(node, ast.Name):
        return {getattr(importlib.import_module(module), node.id)}
    if isinstance(node, ast.JoinedStr):
        (prefix, _) = node.values
        return {f"{prefix.value}{mode}" for mode in FORGET_MODES}
    raise AssertionError(f"{module}: an action the catalogue test cannot read: {ast.dump(node)}")


def test_every_recorded_action_is_in_the_catalogue():
    recorded = recorded_actions()
    assert len(recorded) > 20  # the walk found the calls
    assert recorded - set(ACTIONS) == set()


def test_the_catalogue_names_no_action_the_code_never_records():
    assert set(ACTIONS) - recorded_actions() == set()


def test_every_forget_mode_is_a_mode_of_the_catalogue():
    assert set(FORGET_MODES) <= set(MODES)
