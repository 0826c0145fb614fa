"""A task graph for multi-step work: tasks with a status and dependencies, kept in conversation state.

The host owns the graph (every change goes through the run API's state calls), so it survives compaction, runner
restarts and lost sessions; the model reads it on demand with task_list / task_get instead of carrying it in
its context. Rules the tools enforce, whatever the model asks:

* at most one task is in_progress at a time (a second is refused, naming the first);
* a task is blocked while any task it is blockedBy is pending or in_progress; a blocked task cannot start or
  complete, and completing (or cancelling) its last open blocker unblocks it, which the result says;
* dependencies never form a cycle (an edge that would close one is refused, naming the path);
* the graph stays within MAX_TASKS tasks and the host's state-value size: finished tasks are pruned oldest-first
  to make room, open ones never.

Writes are read-modify-write under the state's optimistic version check, retried on a concurrent change, so
two runs of the same conversation cannot silently overwrite each other's edits.

`todo_write` stays beside it for a short checklist within one request (one call replaces the list); this graph is
for work that spans requests or has an order to respect.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agenthost.protos import errors as host_errors
from agenthost.runners.local_agent.tools.base import Tool, ToolContext, ToolError
from agenthost.runners.sdk import events

STATE_SCOPE = "conversation"
STATE_KEY = "local_agent.tasks"
STATUSES = ("pending", "in_progress", "completed", "cancelled")
OPEN = ("pending", "in_progress")
MAX_TASKS = 100
MAX_EDGES = 20
TITLE_MAX = 200
DESCRIPTION_MAX = 2_000
# Below the host's 256 KiB value cap with room to spare; measured on the JSON the SDK sends (ASCII-escaped).
MAX_STATE_BYTES = 200_000
WRITE_ATTEMPTS = 3
MARK = {"pending": "[ ]", "in_progress": "[>]", "completed": "[x]", "cancelled": "[-]"}

_ID = {"type": "string", "minLength": 1, "maxLength": 12}
_IDS = {"type": "array", "items": _ID, "maxItems": MAX_EDGES}


@dataclass
class Task:
    id: str
    title: str
    status: str = "pending"
    description: str = ""
    blocked_by: list[str] = field(default_factory=list)
    created_at: float = 0.0
    updated_at: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "title": self.title,
            "status": self.status,
            "description": self.description,
            "blockedBy": self.blocked_by,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        }

    @classmethod
    def from_json(cls, raw: Any) -> Task:
        if not isinstance(raw, dict):
            raise ValueError("task is not an object")
        status = str(raw.get("status", "pending"))
        return cls(
            id=str(raw["id"]),
            title=str(raw.get("title", ""))[:TITLE_MAX],
            status=status if status in STATUSES else "pending",
            description=str(raw.get("description", ""))[:DESCRIPTION_MAX],
            blocked_by=[str(b) for b in raw.get("blockedBy", []) if isinstance(b, (str, int))],
            created_at=float(raw.get("created_at", 0) or 0),
            updated_at=float(raw.get("updated_at", 0) or 0),
        )


class TaskGraph:
    """The stored document: tasks in creation order and the next id. Only the `blockedBy` side of each edge is
    stored; `blocks` is derived, so the two can never disagree."""

    def __init__(self, tasks: list[Task] | None = None, next_id: int = 1) -> None:
        self.tasks: dict[str, Task] = {t.id: t for t in tasks or []}
        self.next_id = next_id

    @classmethod
    def from_state(cls, raw: Any) -> TaskGraph:
        """Tolerant of a damaged document (state is writable by the runner's other versions): bad tasks are
        dropped, edges to missing tasks forgotten."""
        if not isinstance(raw, dict):
            return cls()
        tasks: list[Task] = []
        for item in raw.get("tasks", []) if isinstance(raw.get("tasks"), list) else []:
            try:
                tasks.append(Task.from_json(item))
            except (KeyError, TypeError, ValueError):
                continue
        graph = cls(tasks)
        for t in graph.tasks.values():
            t.blocked_by = [b for b in dict.fromkeys(t.blocked_by) if b in graph.tasks and b != t.id]
        numeric = [int(t.id) for t in tasks if t.id.isdigit()]
        try:
            next_id = int(raw.get("next_id", 1))
        except (TypeError, ValueError):
            next_id = 1
        graph.next_id = max([next_id, *(n + 1 for n in numeric)])
        return graph

    def to_state(self) -> dict[str, Any]:
        return {"next_id": self.next_id, "tasks": [t.to_json() for t in self.tasks.values()]}

    # ---- queries ----

    def get(self, task_id: str) -> Task:
        task = self.tasks.get(task_id.lstrip("#"))
        if task is None:
            known = ", ".join(f"#{i}" for i in self.tasks) or "none"
            raise ToolError(f"no task #{task_id.lstrip('#')}; existing tasks: {known}")
        return task

    def blocks(self, task_id: str) -> list[str]:
        return [t.id for t in self.tasks.values() if task_id in t.blocked_by]

    def open_blockers(self, task: Task) -> list[Task]:
        return [self.tasks[b] for b in task.blocked_by if self.tasks[b].status in OPEN]

    def in_progress(self) -> Task | None:
        return next((t for t in self.tasks.values() if t.status == "in_progress"), None)

    def path(self, start: str, goal: str) -> list[str] | None:
        """A blockedBy path start → … → goal, if one exists (depth-first; the graph is small)."""
        stack: list[tuple[str, list[str]]] = [(start, [start])]
        seen: set[str] = set()
        while stack:
            node, trail = stack.pop()
            if node == goal:
                return trail
            if node in seen:
                continue
            seen.add(node)
            stack.extend((b, [*trail, b]) for b in self.tasks[node].blocked_by)
        return None

    # ---- changes ----

    def add_edge(self, task: Task, blocker_id: str) -> None:
        """`task` is blockedBy `blocker_id`. Refused if that closes a cycle."""
        blocker = self.get(blocker_id)
        if blocker.id == task.id:
            raise ToolError(f"task #{task.id} cannot be blocked by itself")
        if blocker.id in task.blocked_by:
            return
        cycle = self.path(blocker.id, task.id)
        if cycle is not None:
            chain = " -> ".join(f"#{i}" for i in cycle)
            raise ToolError(
                f"refused: #{task.id} blocked by #{blocker.id} would make a cycle (#{blocker.id} already waits on "
                f"#{task.id}: {chain} in blockedBy order)"
            )
        if len(task.blocked_by) >= MAX_EDGES:
            raise ToolError(f"task #{task.id} already has {MAX_EDGES} blockers")
        task.blocked_by.append(blocker.id)

    def set_status(self, task: Task, status: str) -> list[str]:
        """Applies a status change; returns notes on what it did to other tasks."""
        if status == task.status:
            return []
        if status in ("in_progress", "completed"):
            waiting = self.open_blockers(task)
            if waiting:
                names = ", ".join(f"#{b.id} {b.title!r} ({b.status})" for b in waiting)
                raise ToolError(
                    f"task #{task.id} is blocked by {names}; finish or cancel those first, or remove the dependency"
                )
        if status == "in_progress":
            current = self.in_progress()
            if current is not None and current.id != task.id:
                raise ToolError(
                    f"only one task may be in_progress at a time, and #{current.id} {current.title!r} is; complete, "
                    f"cancel or set it back to pending before starting #{task.id}"
                )
        was_open = task.status in OPEN
        task.status = status
        notes: list[str] = []
        if was_open and status not in OPEN:
            for dep_id in self.blocks(task.id):
                dep = self.tasks[dep_id]
                if dep.status == "pending" and not self.open_blockers(dep):
                    notes.append(f"#{dep.id} {dep.title!r} is now unblocked")
                if status == "cancelled" and dep.status in OPEN:
                    notes.append(f"#{dep.id} {dep.title!r} depended on this cancelled task; check it still makes sense")
        return notes

    def make_room(self) -> list[str]:
        """Prunes the oldest finished task when the graph is full; open tasks are the model's plan and stay."""
        if len(self.tasks) < MAX_TASKS:
            return []
        finished = [t for t in self.tasks.values() if t.status not in OPEN]
        if not finished:
            raise ToolError(
                f"the task list is full ({MAX_TASKS} open tasks); complete or cancel some before adding more"
            )
        oldest = min(finished, key=lambda t: (t.updated_at, int(t.id) if t.id.isdigit() else 0))
        del self.tasks[oldest.id]
        for t in self.tasks.values():
            if oldest.id in t.blocked_by:
                t.blocked_by.remove(oldest.id)
        return [f"pruned finished task #{oldest.id} {oldest.title!r} to make room"]

    # ---- rendering ----

    def line(self, task: Task) -> str:
        out = f"{MARK[task.status]} #{task.id} {task.title}"
        waiting = self.open_blockers(task)
        if waiting and task.status in OPEN:
            out += " (blocked by " + ", ".join(f"#{b.id}" for b in waiting) + ")"
        return out

    def render(self, statuses: list[str] | None = None) -> str:
        shown = [t for t in self.tasks.values() if statuses is None or t.status in statuses]
        if not shown:
            return "no tasks" if not self.tasks else "no tasks with that status"
        counts = {s: sum(t.status == s for t in self.tasks.values()) for s in STATUSES}
        head = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
        return f"{len(self.tasks)} task(s): {head}\n" + "\n".join(self.line(t) for t in shown)

    def detail(self, task: Task) -> str:
        def names(ids: list[str]) -> str:
            return ", ".join(f"#{i} ({self.tasks[i].status})" for i in ids) or "none"

        blocked = " — blocked" if self.open_blockers(task) and task.status in OPEN else ""
        return (
            f"#{task.id} {task.title}\nstatus: {task.status}{blocked}\nblockedBy: {names(task.blocked_by)}\n"
            f"blocks: {names(self.blocks(task.id))}\ndescription: {task.description or '(none)'}"
        )


async def load(ctx: ToolContext) -> tuple[TaskGraph, int]:
    try:
        value = await ctx.api.state_get_versioned(STATE_SCOPE, STATE_KEY)
    except host_errors.AgentHostError as exc:
        raise ToolError(f"the task list is unavailable: {type(exc).__name__}: {exc.message}") from None
    if not value.found:
        return TaskGraph(), 0
    try:
        raw = json.loads(value.value_json)
    except ValueError:
        raw = None
    return TaskGraph.from_state(raw), value.version


async def mutate(ctx: ToolContext, change: Callable[[TaskGraph], str]) -> str:
    """Read, apply `change` (which raises ToolError to refuse), write under the version read; on a concurrent
    write start over from the new version, so the refusal rules are checked against what is really stored."""
    for _ in range(WRITE_ATTEMPTS):
        graph, version = await load(ctx)
        message = change(graph)
        state = graph.to_state()
        size = len(json.dumps(state).encode())
        if size > MAX_STATE_BYTES:
            raise ToolError(
                f"the task list would take {size} bytes (limit {MAX_STATE_BYTES}); shorten descriptions or cancel "
                "tasks that are no longer needed"
            )
        try:
            await ctx.api.state_set(STATE_SCOPE, STATE_KEY, state, if_version=version)
        except host_errors.Aborted:
            continue
        except host_errors.AgentHostError as exc:
            raise ToolError(f"could not save the task list: {type(exc).__name__}: {exc.message}") from None
        ctx.pending_events.append(events.state_updated(STATE_SCOPE, STATE_KEY))
        return message
    raise ToolError("the task list kept changing underneath this call (another run is editing it); try again")


def _text(args: dict[str, Any], name: str) -> str | None:
    value = args.get(name)
    return None if value is None else str(value).strip()


class TaskCreate(Tool):
    name = "task_create"
    description = (
        "Add a pending task to this conversation's task graph, for work spanning several requests or with an "
        "order to respect. blockedBy: ids that must finish first. The host keeps the graph; read it back with "
        "task_list instead of remembering it."
    )
    parameters = {
        "type": "object",
        "properties": {
            "title": {"type": "string", "minLength": 1, "maxLength": TITLE_MAX},
            "description": {"type": "string", "maxLength": DESCRIPTION_MAX},
            "blockedBy": _IDS,
            "blocks": _IDS,
        },
        "required": ["title"],
        "additionalProperties": False,
    }

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> str:
        title = _text(args, "title") or ""
        if not title:
            raise ToolError("title must not be blank")

        def change(graph: TaskGraph) -> str:
            notes = graph.make_room()
            now = time.time()
            task = Task(
                id=str(graph.next_id),
                title=title,
                description=_text(args, "description") or "",
                created_at=now,
                updated_at=now,
            )
            graph.tasks[task.id] = task
            graph.next_id += 1
            for blocker in args.get("blockedBy", []):
                graph.add_edge(task, str(blocker).lstrip("#"))
            for dependant in args.get("blocks", []):
                dep = graph.get(str(dependant))
                graph.add_edge(dep, task.id)
                dep.updated_at = now
            return "\n".join([f"created {graph.line(task)}", *notes])

        return await mutate(ctx, change)


class TaskUpdate(Tool):
    name = "task_update"
    description = (
        "Change a task's status, title, description or dependencies. One task in_progress at a time; a blocked "
        "task cannot start or complete. Set in_progress when starting, completed as soon as done."
    )
    parameters = {
        "type": "object",
        "properties": {
            "id": _ID,
            "status": {"enum": list(STATUSES)},
            "title": {"type": "string", "minLength": 1, "maxLength": TITLE_MAX},
            "description": {"type": "string", "maxLength": DESCRIPTION_MAX},
            "addBlockedBy": _IDS,
            "removeBlockedBy": _IDS,
        },
        "required": ["id"],
        "additionalProperties": False,
    }

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> str:
        def change(graph: TaskGraph) -> str:
            task = graph.get(str(args["id"]))
            now = time.time()
            title = _text(args, "title")
            if title is not None:
                if not title:
                    raise ToolError("title must not be blank")
                task.title = title
            description = _text(args, "description")
            if description is not None:
                task.description = description
            for blocker in args.get("removeBlockedBy", []):
                b = graph.get(str(blocker))
                if b.id in task.blocked_by:
                    task.blocked_by.remove(b.id)
            for blocker in args.get("addBlockedBy", []):
                graph.add_edge(task, str(blocker).lstrip("#"))
            notes: list[str] = []
            if "status" in args:
                notes = graph.set_status(task, str(args["status"]))
            task.updated_at = now
            return "\n".join([f"updated {graph.line(task)}", *notes])

        return await mutate(ctx, change)


class TaskList(Tool):
    name = "task_list"
    description = "List the task graph: status and blockers of each task. Check it when resuming work."
    parameters = {
        "type": "object",
        "properties": {"status": {"type": "array", "items": {"enum": list(STATUSES)}, "maxItems": len(STATUSES)}},
        "additionalProperties": False,
    }
    read_only = True

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> str:
        graph, _ = await load(ctx)
        statuses = args.get("status")
        return graph.render(list(statuses) if statuses else None)


class TaskGet(Tool):
    name = "task_get"
    description = "One task in full: description, blockedBy, blocks."
    parameters = {
        "type": "object",
        "properties": {"id": _ID},
        "required": ["id"],
        "additionalProperties": False,
    }
    read_only = True

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> str:
        graph, _ = await load(ctx)
        return graph.detail(graph.get(str(args["id"])))


def task_tools() -> list[Tool]:
    return [TaskCreate(), TaskUpdate(), TaskList(), TaskGet()]


def summary_line(raw: Any) -> str:
    """One line for the system prompt at run start: enough for the model to know to look, not the graph itself
    (which it pulls on demand, so a compaction cannot leave a stale copy in its context)."""
    graph = TaskGraph.from_state(raw)
    open_tasks = [t for t in graph.tasks.values() if t.status in OPEN]
    if not open_tasks:
        return ""
    current = graph.in_progress()
    now = f"; in progress: #{current.id} {current.title}" if current is not None else ""
    return f"This conversation has {len(open_tasks)} open task(s) in its task graph{now}. Use task_list to see them."


__all__ = ["STATE_KEY", "TaskGraph", "summary_line", "task_tools"]
