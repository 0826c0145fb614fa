"""Skills in the local agent, end to end through the real host: the bound skills are indexed in the system prompt,
the model loads one (and its files) with `load_skill`, unknown names get an error naming what exists, and the same
`skills` list projects into a harness workspace as the SKILL.md files the harness runners write."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agenthost.runners.external_harness.config import ClaudeCodeConfig, CodexConfig, parse_config
from agenthost.runners.external_harness.projection import SKILL_DIRS, project_skills
from agenthost.runners.external_harness.workspace import WorkspaceManager
from agenthost.runners.local_agent.config import LocalAgentConfig
from agenthost.runners.local_agent.runner import LocalAgentRunner
from agenthost.runners.local_agent.testing import FakeProviderServer, openai_text, openai_tool_calls
from agenthost.runners.local_agent.tools.skills import MAX_FILE_CHARS
from agenthost.runners.sdk.skills import Skill, SkillFormatError, parse_skill_md, render_skill_md
from agenthost.runners.sdk.testing import HostHarness

pytestmark = pytest.mark.timeout(120)

SKILLS: list[dict[str, Any]] = [
    {
        "name": "release-notes",
        "description": "Write release notes from a list of merged changes.",
        "body": "# Release notes\n1. Group changes by area.\n2. Lead with user-visible ones.",
        "files": {"templates/notes.md": "## {version}\n- {change}\n", "big.txt": "x" * (MAX_FILE_CHARS + 500)},
    },
    {"name": "code-review", "description": 'Review a diff: "correctness first".', "body": "Check tests."},
]


def binding(server: FakeProviderServer, **extra: Any) -> dict[str, Any]:
    return {"model": "vllm/m", "base_url": server.url + "/v1", "context_window": 200_000, "max_retries": 0, **extra}


def tool_results(events: list[Any]) -> list[Any]:
    return [e.tool_finished for e in events if e.WhichOneof("kind") == "tool_finished"]


async def test_skills_indexed_and_loaded_on_demand(tmp_path: Path) -> None:
    async with FakeProviderServer() as server:
        async with HostHarness(tmp_path, runners=[LocalAgentRunner], config=binding(server, skills=SKILLS)) as h:
            server.push(
                openai_tool_calls([("s1", "load_skill", {"name": "release-notes"})]),
                openai_tool_calls([("s2", "load_skill", {"name": "release-notes", "path": "templates/notes.md"})]),
                openai_tool_calls([("s3", "load_skill", {"name": "changelog"})]),
                openai_tool_calls([("s4", "load_skill", {"name": "release-notes", "path": "../../etc/passwd"})]),
                openai_tool_calls([("s5", "load_skill", {"name": "release-notes", "path": "big.txt"})]),
                openai_text("Here are the notes."),
            )
            r = await h.send("write the release notes for v2", conversation_id="sk")
            assert r.run.status == "completed", r.run.error_message
        first = server.model_requests[0].json()
        system = first["messages"][0]["content"]
        # The index: one line per skill, sorted by name, bodies not included.
        index = system[system.index("<skills>") : system.index("</skills>")]
        lines = [line for line in index.splitlines() if line.startswith("- ")]
        assert lines == [
            '- code-review: Review a diff: "correctness first".',
            "- release-notes: Write release notes from a list of merged changes.",
        ]
        assert "Group changes by area" not in system
        assert "load_skill" in [t["function"]["name"] for t in first["tools"]]
        # The index is part of the frozen prefix: every request of the run starts with the same system prompt.
        assert all(q.json()["messages"][0]["content"] == system for q in server.model_requests)

        body, template, unknown, escape, big = tool_results(r.events)
        assert not body.is_error and "1. Group changes by area." in body.result
        assert "templates/notes.md" in body.result and "big.txt" in body.result  # files listed, not inlined
        assert "{version}" not in body.result
        assert not template.is_error and template.result == "## {version}\n- {change}\n"
        assert unknown.is_error and "no skill named 'changelog'" in unknown.result
        assert "code-review, release-notes" in unknown.result
        assert escape.is_error and "has no file '../../etc/passwd'" in escape.result
        assert "big.txt, templates/notes.md" in escape.result
        assert (
            not big.is_error
            and not big.artifact_id
            and big.result.startswith("x" * MAX_FILE_CHARS)
            and "500 more chars" in big.result
        )
        assert len(big.result) < MAX_FILE_CHARS + 200


async def test_no_skills_no_index_no_tool(tmp_path: Path) -> None:
    async with FakeProviderServer() as server:
        async with HostHarness(tmp_path, runners=[LocalAgentRunner], config=binding(server)) as h:
            server.push(openai_text("hi"))
            assert (await h.send("hello", conversation_id="n")).run.status == "completed"
        body = server.model_requests[0].json()
        assert "<skills>" not in body["messages"][0]["content"]
        assert "load_skill" not in [t["function"]["name"] for t in body["tools"]]


def test_bad_skills_refused_at_bind_time(tmp_path: Path) -> None:
    runner = LocalAgentRunner(tmp_path, env={})
    ok = {"name": "a", "description": "d"}
    cases = [
        ({"skills": [{"name": "../x", "description": "d"}]}, "skills.0.name"),
        ({"skills": [{"name": "a", "description": "line\nbreak"}]}, "skills.0.description"),
        ({"skills": [{"name": "a", "description": "d", "files": {"/etc/passwd": ""}}]}, "skills.0.files"),
        ({"skills": [{"name": "a", "description": "d", "files": {"SKILL.md": ""}}]}, "skills.0.files"),
        ({"skills": [{"name": "a", "description": "d", "body": "x" * (256 * 1024 + 1)}]}, "skills.0"),
        ({"skills": [ok, ok]}, "duplicate skill names"),
        ({"skills": [{"name": "a", "description": "d", "script": "rm -rf /"}]}, "skills.0.script"),
    ]
    for config, where in cases:
        problems = runner.validate_config(config)
        assert problems and where in problems[0], (config, problems)
    assert runner.validate_config({"skills": SKILLS}) == []


@pytest.mark.parametrize("harness", [ClaudeCodeConfig, CodexConfig])
def test_the_same_skills_project_into_a_harness_workspace(tmp_path: Path, harness: Any) -> None:
    """One skills list, two runners: the harness writes exactly the SKILL.md the shared renderer makes, and reading
    it back gives the skill the local agent loads."""
    local = LocalAgentConfig.parse({"skills": SKILLS})
    external = parse_config(harness, {"skills": json.loads(json.dumps(SKILLS))})
    assert external.skills == local.skills
    workspace = WorkspaceManager(tmp_path).workspace("bot", "conv")
    assert project_skills(workspace, external.skills) == []
    for skill in local.skills:
        for base in SKILL_DIRS:
            folder = workspace.working_dir / base / skill.name
            text = (folder / "SKILL.md").read_text()
            assert text == render_skill_md(skill)
            files = {rel: (folder / rel).read_text() for rel in skill.files}
            assert parse_skill_md(text, files) == skill


def test_skill_md_parser() -> None:
    skill = Skill(name="x-1", description='Quotes "and" colons: fine', body="Line one\n\n---\nafter a rule")
    assert parse_skill_md(render_skill_md(skill)) == skill
    assert parse_skill_md("---\nname: y\ndescription: 'it''s plain'\n---\nBody\n").description == "it's plain"
    for bad in ("no frontmatter", "---\nname: y\n", "---\nname: y\n---\nbody", '---\nname: y\ndescription: "x\n---\n'):
        with pytest.raises((SkillFormatError, ValueError)):
            parse_skill_md(bad)
    with pytest.raises(ValueError):
        parse_skill_md("---\nname: ../evil\ndescription: d\n---\n")  # the parsed skill is validated like config
