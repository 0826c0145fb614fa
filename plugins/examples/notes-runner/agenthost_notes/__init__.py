"""The `notes` runner: a small bot that keeps notes for a conversation, using every run-scoped API."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from agenthost.runners.sdk import RunContext, Runner, RunnerManifest, RunnerPermissions, events, hookimpl
from agenthost.runners.sdk.events import RunEvent


class NotesRunner(Runner):
    manifest = RunnerManifest(
        name="notes",
        description="Keeps notes per conversation (example plugin)",
        version="0.1.0",
        permissions=RunnerPermissions(state_scopes=("conversation", "run")),
        config_schema={
            "type": "object",
            "properties": {"greeting": {"type": "string", "maxLength": 200}},
            "additionalProperties": False,
        },
    )

    async def run(self, run: RunContext) -> AsyncIterator[RunEvent]:
        command, _, rest = run.text.strip().partition(" ")
        greeting = run.config.get("greeting", "Noted.")
        if command == "note" and rest:
            art = await run.api.artifact_create(rest.encode(), name="note.txt", mime_type="text/plain")
            yield events.artifact_created(art)
            notes = await run.api.state_get("conversation", "notes", default=[])
            notes.append(art.artifact_id)
            await run.api.state_set("conversation", "notes", notes)
            yield events.state_updated("conversation", "notes")
            yield events.text(f"{greeting} ({len(notes)} notes)")
        elif command == "list":
            notes = await run.api.state_get("conversation", "notes", default=[])
            keys = await run.api.state_list("conversation")
            yield events.text(f"{len(notes)} notes (state keys: {', '.join(keys.keys)})\n")
            for i, artifact_id in enumerate(notes, 1):
                meta = await run.api.artifact_metadata(artifact_id)
                head = await run.api.artifact_read_range(artifact_id, 0, 1024)
                body = await run.api.artifact_read_all(artifact_id)
                assert body.startswith(head.data)  # the streamed read and the range read agree
                yield events.text(f"{i}. {body.decode()} ({meta.size_bytes} bytes)\n")
        elif command == "find" and rest:
            call_id = "search-1"
            yield events.tool_started(call_id, "history_search", {"query": rest})
            hits = await run.api.history_search(rest, roles=["user"], top_k=5)
            found = [h.text for h in hits if h.event_id != run.context.event.event_id]
            yield events.tool_finished(call_id, "history_search", json.dumps(found))
            yield events.text(f"found {len(found)} earlier messages: " + "; ".join(found))
        elif command == "forget":
            removed = await run.api.state_delete("conversation", "notes")
            yield events.text("forgot every note" if removed else "there were no notes")
        else:
            page = await run.api.history_page(limit=20)
            event = await run.api.event_get(run.context.event.event_id)
            earlier = await run.api.event_page(limit=5)
            await run.api.state_set("run", "seen_items", len(page.items))
            user_turns = sum(1 for item in page.items if item.role == "user")
            yield events.text(
                f"You said {event.text!r}. This conversation has {user_turns} recent user messages"
                f" and {len(earlier.events)} recent events."
            )


@hookimpl
def agenthost_register_runners(register):  # noqa: ANN001 - the hookspec documents the signature
    register(NotesRunner)
