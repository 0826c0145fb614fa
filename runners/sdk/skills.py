"""Skills: one definition for every runner.

A skill is a named set of instructions (and optional supporting text files) bound to a bot. Harness runners
project it as `<skills dir>/<name>/SKILL.md` (frontmatter + body) for the harness to discover; the local agent
lists it in its system prompt and loads it on demand. Both take the same `Skill` from the binding config, so a
skills list moves between runners unchanged.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import PurePosixPath

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

SKILL_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")
MAX_SKILL_BYTES = 256 * 1024
MAX_SKILLS = 64
SKILL_FILE = "SKILL.md"


class SkillFormatError(ValueError):
    """A SKILL.md that is not frontmatter (name, description) followed by a body."""


class Skill(BaseModel):
    """A skill bound to the bot, projected as `<skills dir>/<name>/SKILL.md` (+ supporting files)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="Directory name and skill name: a-z, 0-9 and '-', at most 64 chars.")
    description: str = Field(min_length=1, max_length=1536, description="When the model should use the skill.")
    body: str = Field(default="", description="Markdown instructions (SKILL.md after the frontmatter).")
    files: dict[str, str] = Field(
        default_factory=dict, description="Supporting files: relative path inside the skill dir -> text content."
    )

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not SKILL_NAME.match(name):
            raise ValueError("skill name must be 1-64 chars of a-z 0-9 '-' starting with a letter or digit")
        return name

    @field_validator("description")
    @classmethod
    def _one_line(cls, description: str) -> str:
        # The description goes into YAML frontmatter (and one index line); a newline or '---' would end it early.
        if "\n" in description or "\r" in description:
            raise ValueError("description must be a single line")
        return description

    @field_validator("files")
    @classmethod
    def _relative_paths(cls, files: dict[str, str]) -> dict[str, str]:
        for rel in files:
            p = PurePosixPath(rel)
            if not rel or p.is_absolute() or ".." in p.parts or "\\" in rel or "\0" in rel or p.name == SKILL_FILE:
                raise ValueError(f"skill file path {rel!r} must be relative, inside the skill dir and not SKILL.md")
        return files

    @model_validator(mode="after")
    def _size(self) -> Skill:
        total = len(self.body.encode()) + sum(len(v.encode()) for v in self.files.values())
        if total > MAX_SKILL_BYTES:
            raise ValueError(f"skill {self.name!r} is {total} bytes; the cap is {MAX_SKILL_BYTES}")
        return self


def unique_names(skills: list[Skill]) -> list[Skill]:
    """The check a config's `skills` validator runs: names are directories and tool arguments, so one each."""
    names = [s.name for s in skills]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"duplicate skill names {dupes}")
    return skills


def render_skill_md(skill: Skill) -> str:
    # JSON strings are valid YAML scalars, so any description survives the frontmatter intact.
    frontmatter = f"---\nname: {skill.name}\ndescription: {json.dumps(skill.description, ensure_ascii=False)}\n---\n"
    return frontmatter + "\n" + skill.body.rstrip() + "\n"


def skill_files(skill: Skill) -> dict[str, str]:
    """Every file of the projected skill directory, SKILL.md included, by relative path."""
    return {SKILL_FILE: render_skill_md(skill), **skill.files}


def parse_skill_md(text: str, files: dict[str, str] | None = None) -> Skill:
    """The inverse of `render_skill_md` for the frontmatter this module writes (and plain `key: value` YAML
    scalars, quoted or not), so a projected skill reads back as the same `Skill`."""
    if not text.startswith("---\n"):
        raise SkillFormatError("SKILL.md must start with a '---' frontmatter line")
    end = text.find("\n---\n", 3)
    if end < 0:
        raise SkillFormatError("SKILL.md frontmatter is not closed by a '---' line")
    fields: dict[str, str] = {}
    for line in text[4:end].splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, sep, value = line.partition(":")
        if not sep:
            raise SkillFormatError(f"frontmatter line {line!r} is not 'key: value'")
        value = value.strip()
        if value.startswith('"'):
            try:
                value = json.loads(value)
            except ValueError:
                raise SkillFormatError(f"frontmatter value of {key.strip()!r} is not a valid quoted string") from None
        elif value.startswith("'") and value.endswith("'") and len(value) >= 2:
            value = value[1:-1].replace("''", "'")
        fields[key.strip()] = str(value)
    if "name" not in fields or "description" not in fields:
        raise SkillFormatError("SKILL.md frontmatter needs 'name' and 'description'")
    body = text[end + len("\n---\n") :]
    body = body.removeprefix("\n").rstrip()
    return Skill(name=fields["name"], description=fields["description"], body=body, files=dict(files or {}))


def index_lines(skills: Sequence[Skill]) -> list[str]:
    """One line per skill, sorted by name: the stable index a runner shows its model."""
    return [f"- {s.name}: {s.description}" for s in sorted(skills, key=lambda s: s.name)]


__all__ = [
    "MAX_SKILLS",
    "MAX_SKILL_BYTES",
    "SKILL_FILE",
    "SKILL_NAME",
    "Skill",
    "SkillFormatError",
    "index_lines",
    "parse_skill_md",
    "render_skill_md",
    "skill_files",
    "unique_names",
]
