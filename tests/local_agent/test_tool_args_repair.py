"""Repair rate of near-JSON tool arguments: the fast path alone against fast path + json_repair.

Each sample is text a local model has been seen to emit for a tool call, paired with the object it meant. A sample
counts as repaired only when the result parses to exactly that object (a "repair" into different input is worse
than an error the model can read and fix).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from agenthost.runners.local_agent.providers.tool_args import repair_arguments

P = {"path": "src/app.py"}
SAMPLES: list[tuple[str, str, dict[str, Any]]] = [
    ("valid", '{"path": "src/app.py"}', P),
    ("trailing comma", '{"path": "src/app.py",}', P),
    ("trailing comma, nested", '{"paths": ["a", "b",], "n": 2,}', {"paths": ["a", "b"], "n": 2}),
    ("truncated string", '{"path": "src/app.py', P),
    ("truncated object", '{"query": "todo", "limit": 5', {"query": "todo", "limit": 5}),
    ("raw newline in string", '{"content": "line1\nline2"}', {"content": "line1\nline2"}),
    ("double-encoded", json.dumps(json.dumps(P)), P),
    ("single quotes", "{'path': 'src/app.py'}", P),
    ("single quotes, nested", "{'todos': [{'id': 1, 'done': False}]}", {"todos": [{"id": 1, "done": False}]}),
    (
        "python True/None",
        '{"path": "a", "recursive": True, "limit": None}',
        {"path": "a", "recursive": True, "limit": None},
    ),
    ("python False", '{"network": False, "command": "ls"}', {"network": False, "command": "ls"}),
    ("code fence json", '```json\n{"path": "src/app.py"}\n```', P),
    ("code fence bare", '```\n{"path": "src/app.py"}\n```', P),
    ("unquoted keys", '{path: "src/app.py"}', P),
    ("unquoted keys, two", '{command: "ls -la", timeout_seconds: 30}', {"command": "ls -la", "timeout_seconds": 30}),
    ("trailing prose", '{"path": "src/app.py"} I will read this file now.', P),
    ("leading prose", 'Sure, here are the arguments: {"path": "src/app.py"}', P),
    ("prose both sides", 'Arguments: {"path": "src/app.py"}. Done.', P),
    ("single quotes + trailing comma", "{'path': 'src/app.py',}", P),
    ("comment inside", '{"path": "src/app.py" // the entry point\n}', P),
    ("truncated nested", '{"todos": [{"id": 1, "text": "write tests"', {"todos": [{"id": 1, "text": "write tests"}]}),
    ("fence + single quotes", "```json\n{'path': 'src/app.py'}\n```", P),
    ("double-encoded malformed", json.dumps("{'path': 'src/app.py'}"), P),
]

# Inputs that must NOT become arguments: the model is better served by an error it can read.
NOT_ARGUMENTS = [
    "I will now read the file src/app.py",
    "",  # empty is the documented `{}` (a call without arguments), checked separately below
    '{"a": 1}{"b": 2}',  # two merged calls: left raw for the accumulator to split
    "[1, 2, 3]",
]


def _ok(out: str, want: dict[str, Any]) -> bool:
    try:
        return json.loads(out) == want
    except ValueError:
        return False


def test_repair_rate_before_and_after_json_repair(capsys: pytest.CaptureFixture[str]) -> None:
    rows = []
    for label, raw, want in SAMPLES:
        before = _ok(repair_arguments(raw, second_stage=False), want)
        after = _ok(repair_arguments(raw), want)
        rows.append((label, before, after))
        # The second stage only ever adds repairs; it never breaks one the fast path made.
        assert after or not before, label
    n = len(rows)
    before_rate = sum(b for _, b, _ in rows) / n
    after_rate = sum(a for _, _, a in rows) / n
    with capsys.disabled():
        print(f"\n{'sample':34} {'fast path':>10} {'+json_repair':>13}")
        for label, b, a in rows:
            print(f"{label:34} {'ok' if b else '-':>10} {'ok' if a else '-':>13}")
        print(f"{'repair rate':34} {before_rate:>10.0%} {after_rate:>13.0%}  (n={n})")
    assert n >= 20
    assert after_rate >= 0.95, [r for r in rows if not r[2]]
    assert after_rate - before_rate >= 0.3


@pytest.mark.parametrize("raw", [r for r in NOT_ARGUMENTS if r])
def test_second_stage_does_not_invent_arguments(raw: str) -> None:
    assert repair_arguments(raw) == raw
    assert repair_arguments("   ") == "{}"
