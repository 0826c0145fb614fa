"""`load_skill`: the bot's skills on demand. The system prompt carries only their index (name + description);
the body, and any supporting file, reaches the context only when the model asks for it."""

from __future__ import annotations

from typing import Any

from agenthost.runners.local_agent.tools.base import Tool, ToolContext, ToolError
from agenthost.runners.sdk.skills import Skill, index_lines

# One supporting file per call, excerpted past this (under the default tool_result_max_chars, so a small window
# is what sends an excerpt to an artifact, not every large file).
MAX_FILE_CHARS = 16_000
SKILLS_PROMPT_HEADER = (
    "Skills bound to this bot. Each is a set of instructions for one kind of task: when a request matches a "
    "skill's description, call load_skill with its name and follow what it says."
)


def skills_prompt(skills: list[Skill]) -> str:
    """The index block of the system prompt; sorted, so the same skills give the same bytes."""
    if not skills:
        return ""
    return "<skills>\n" + SKILLS_PROMPT_HEADER + "\n" + "\n".join(index_lines(skills)) + "\n</skills>"


class LoadSkill(Tool):
    name = "load_skill"
    description = (
        "Load one of the skills listed in the system prompt: returns its instructions and the names of its "
        "supporting files. Pass `path` to read one of those files."
    )
    parameters = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 64},
            "path": {"type": "string", "minLength": 1, "maxLength": 500},
        },
        "required": ["name"],
        "additionalProperties": False,
    }
    read_only = True

    async def execute(self, args: dict[str, Any], ctx: ToolContext) -> str:
        skills = {s.name: s for s in ctx.config.skills}
        skill = skills.get(args["name"])
        if skill is None:
            available = ", ".join(sorted(skills)) or "none"
            raise ToolError(f"no skill named {args['name']!r}; available skills: {available}")
        path = args.get("path")
        if path is None:
            return _render(skill)
        content = skill.files.get(path)
        if content is None:
            listed = ", ".join(sorted(skill.files)) or "none"
            raise ToolError(f"skill {skill.name!r} has no file {path!r}; its files: {listed}")
        if len(content) > MAX_FILE_CHARS:
            return (
                content[:MAX_FILE_CHARS] + f"\n… [{len(content) - MAX_FILE_CHARS} more chars of {path} not shown; "
                "the file is larger than one tool result may be]"
            )
        return content


def _render(skill: Skill) -> str:
    text = f"# Skill: {skill.name}\n{skill.description}\n\n{skill.body.strip() or '(this skill has no instructions)'}"
    if skill.files:
        listing = "\n".join(f"- {rel} ({len(skill.files[rel])} chars)" for rel in sorted(skill.files))
        text += f"\n\nSupporting files (read one with load_skill name={skill.name!r} path=...):\n{listing}"
    return text
