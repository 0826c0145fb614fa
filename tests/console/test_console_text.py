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
    pytest.mark.timeout(60),
    pytest.mark.skipif(NODE is None, reason="node is not installed (it runs the console's own JS)"),
]


def _pretty(values: list[str]) -> list[str]:
    script = (
        f"import {{ pretty }} from {json.dumps(DOM.as_uri())};\n"
        f"console.log(JSON.stringify({json.dumps(values)}.map(pretty)));"
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
