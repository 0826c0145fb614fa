from __future__ import annotations

import json

from agenthost.runners.local_agent import pairing
from agenthost.runners.local_agent.history import Checkpoint, items_to_messages, rebuild
from agenthost.runners.local_agent.messages import AssistantMessage, Summary, ToolResult, UserMessage
from agenthost.runners.local_agent.testing import FakeRunAPI


def test_transcript_items_become_paired_messages() -> None:
    api = FakeRunAPI()
    api.add_user("list files", event_id="e1")
    api.add_item(role="assistant", item_type="message", text="Looking")
    api.add_item(
        role="assistant", item_type="tool_call", tool_call_id="a", tool_name="list_files", data_json='{"path": "."}'
    )
    api.add_item(
        role="assistant",
        item_type="tool_call",
        tool_call_id="b",
        tool_name="read_file",
        data_json=json.dumps({"path": "x"}),
    )
    api.add_item(
        role="tool",
        item_type="tool_result",
        tool_call_id="a",
        tool_name="list_files",
        text="x\ny",
        data_json='{"artifact_id": "art9"}',
    )
    # b never got a result (the runner died); an orphan result from elsewhere:
    api.add_item(role="tool", item_type="tool_result", tool_call_id="zz", tool_name="t", text="orphan")
    api.add_item(role="assistant", item_type="message", text="done")
    api.add_user("current", event_id="e2")
    msgs = items_to_messages(api.items, exclude_event_id="e2")
    pairing.check(msgs)
    assert isinstance(msgs[0], UserMessage) and msgs[0].host_seq == 1
    a = msgs[1]
    assert isinstance(a, AssistantMessage) and a.content == "Looking"
    assert [(c.id, json.loads(c.arguments)) for c in a.tool_calls] == [("a", {"path": "."}), ("b", {"path": "x"})]
    assert [(m.tool_call_id, m.is_error) for m in msgs if isinstance(m, ToolResult)] == [("a", False), ("b", True)]
    assert msgs[2] == ToolResult("a", "list_files", "x\ny", artifact_id="art9")
    assert msgs[-1] == AssistantMessage("done")


async def test_rebuild_stops_at_checkpoint_and_pages() -> None:
    api = FakeRunAPI()
    for i in range(150):
        api.add_user(f"old {i}")
    api.add_user("new 1")
    api.add_item(role="assistant", item_type="message", text="reply 1")
    api.add_user("now", event_id="cur")
    cp = Checkpoint("everything before", through_seq=150, artifact_id="art")
    msgs = await rebuild(api, "c1", checkpoint=cp, exclude_event_id="cur", token_budget=100_000)
    assert msgs == [
        Summary("everything before", "art", 150),
        UserMessage("new 1", host_seq=151),
        AssistantMessage("reply 1"),
    ]
    # Without a checkpoint it pages through everything (150+ items over several pages).
    msgs = await rebuild(api, "c1", checkpoint=None, exclude_event_id="cur", token_budget=100_000)
    assert len(msgs) == 152 and msgs[0] == UserMessage("old 0", host_seq=1)
    assert api.calls.count("history_page") > 2


async def test_rebuild_respects_budget_and_compaction_markers() -> None:
    api = FakeRunAPI()
    for _ in range(50):
        api.add_user("word " * 100)
    msgs = await rebuild(api, "c1", checkpoint=None, exclude_event_id="", token_budget=1000)
    assert isinstance(msgs[0], Summary) and "search_history" in msgs[0].content
    assert 5 <= len(msgs) <= 12
    api2 = FakeRunAPI()
    api2.add_user("ancient")
    api2.add_item(role="system", item_type="compaction", text="summary of ancient")
    api2.add_user("recent")
    msgs = await rebuild(api2, "c1", checkpoint=None, exclude_event_id="", token_budget=1000)
    assert msgs == [Summary("summary of ancient", "", 2), UserMessage("recent", host_seq=3)]
