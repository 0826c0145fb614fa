"""The console shows a runner's tool arguments (on approval cards and tool rows) so a person can decide on them:
characters that hide or reorder text (bidi overrides, zero-width, controls) are shown as escapes, not obeyed."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

import agenthost.host.api.gateway as gateway

NODE = shutil.which("node")
DOM = Path(gateway.__file__).parent / "console_static" / "dom.js"

pytestmark = [
    pytest.mark.e2e,  # starts processes (tests/process_guard.py)
    pytest.mark.timeout(60),
    pytest.mark.skipif(NODE is None, reason="node is not installed (it runs the console's own JS)"),
]


def _pretty(values: list[str], function: str = "pretty") -> list[str]:
    script = (
        f"import {{ {function} }} from {json.dumps(DOM.as_uri())};\n"
        f"console.log(JSON.stringify({json.dumps(values)}.map((v) => {function}(v))));"
    )
    proc = subprocess.run(
        [str(NODE), "--input-type=module", "-e", script], capture_output=True, text=True, timeout=30, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_arguments_shown_to_an_approver_cannot_hide_or_reorder_text() -> None:
    spoof = json.dumps({"path": "invoice\u202etxt.exe", "cmd": "ls\u200b -la", "x": "a\u2066b\u2069"})
    (shown, raw) = _pretty([spoof, "not json \x1b[2J\u202e"])
    for hidden in ("\u202e", "\u200b", "\u2066", "\u2069", "\x1b"):
        assert hidden not in shown + raw
    assert json.loads(shown) == json.loads(spoof)  # still the same JSON, now readable
    assert "\\u202e" in shown and '"cmd": "ls\\u200b -la"' in shown and "\\u001b" in raw
    assert _pretty(['{"a": "plain ✓ text"}']) == ['{\n  "a": "plain ✓ text"\n}']


def test_names_others_chose_are_shown_as_what_they_are() -> None:
    """Conversation ids (a client's or a chat's), runner ids and tool names (a plugin's) are shown through `ident`:
    an id built to look like another (a right-to-left override, a zero-width space) shows what it hides, and every
    character the CLI's terminal rule (agenthost.protos.text.UNSAFE) refuses to print raw is escaped here too."""
    from agenthost.protos.text import UNSAFE

    spoofs = ["tg:4\u200b2", "invoice\u202etxt.exe", "a\u061cb", "plain-id.✓"]
    assert _pretty(spoofs, "ident") == ["tg:4\\u200b2", "invoice\\u202etxt.exe", "a\\u061cb", "plain-id.✓"]
    every = [chr(c) for c in range(0x3000) if UNSAFE.match(chr(c)) and chr(c) not in "\t\n"]
    shown = _pretty(every, "ident")
    assert all(s.startswith("\\u") for s in shown), [
        c for c, s in zip(every, shown, strict=True) if not s.startswith("\\u")
    ]


def test_the_console_and_the_cli_hide_nothing_the_other_shows() -> None:
    """One rule for names others chose: the console's `ident` escapes exactly what the CLI's (protos.text.ident,
    HIDDEN) does, so a conversation id that the console shows as `tg\\u200b:42` never reads as `tg:42` in
    `agenthost runs list` (it did: the CLI's rule lacked the zero-width characters)."""
    from agenthost.protos.text import ident

    every = [chr(c) for c in range(0x3000)] + [chr(c) for c in range(0xFE00, 0x10000)]
    console = _pretty(every, "ident")
    differ = [hex(ord(c)) for c, shown in zip(every, console, strict=True) if shown != ident(c)]
    assert not differ, differ
