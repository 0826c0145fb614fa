"""search_knowledge: the bot's knowledge base (documents its owner added with `agenthost kb add`), through the host.

The host owns the index and the embeddings endpoint; this tool only asks (RunAPI.kb_search, the `kb` grant) and
formats the chunks it gets back with where they come from, so the model can cite them or read the whole document.
"""

from __future__ import annotations

from typing import Any, Protocol, cast

from agenthost.protos import errors as host_errors
from agenthost.runners.local_agent.tools.base import Tool, ToolContext, ToolError

MAX_TOP_K = 20
DEFAULT_TOP_K = 5


class _KbAPI(Protocol):
    async def kb_search(self, query: str, *, top_k: int = ...) -> Any: ...


class SearchKnowledge(Tool):
    name = "search_knowledge"
    description = (
        "Search this bot's knowledge base: documents its owner provided (manuals, policies, notes, code). Matches "
        "by keywords and by meaning, so phrase the query as the question or topic. Returns the best passages with "
        "their document and line numbers. Use it before answering questions the documents may cover."
    )
    parameters = {
        "type": "object",
        "properties": {
            "query": {"type": "string", "minLength": 1, "maxLength": 2000},
            "top_k": {"type": "integer", "minimum": 1, "maximum": MAX_TOP_K},
        },
        "required": ["query"],
        "additionalProperties": False,
    }
    read_only = True

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> str:
        api = cast(_KbAPI, ctx.api)
        try:
            result = await api.kb_search(args["query"], top_k=int(args.get("top_k", DEFAULT_TOP_K)))
        except host_errors.AgentHostError as exc:
            raise ToolError(f"knowledge search failed: {type(exc).__name__}: {exc.message}") from None
        note = f"(keyword search only: {result.keyword_only_reason})\n" if result.keyword_only else ""
        if not result.hits:
            return note + "no matching passages in the knowledge base"
        parts = []
        for n, hit in enumerate(result.hits, start=1):
            parts.append(
                f"[{n}] {hit.document_name} lines {hit.start_line}-{hit.end_line}"
                f" (doc {hit.doc_id}, artifact {hit.artifact_id})\n{hit.text}"
            )
        return note + "\n\n".join(parts)
