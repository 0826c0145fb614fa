"""The manifest's config_schema check as the host makes it on every manifest a plugin process sends: the verdict is
kept by the schema's content (the same schemas arrive at every plugin start), so a kept verdict must be exactly
what a fresh check says, a refusal included, every time."""

from __future__ import annotations

import json

import pytest

from agenthost.plugins import manifest
from agenthost.plugins.manifest import ChannelManifest, ManifestError, RunnerManifest


def _wire(schema: object, name: str = "r") -> str:
    return json.dumps({"name": name, "config_schema": schema})


@pytest.mark.parametrize("model", [RunnerManifest, ChannelManifest])
def test_a_bad_schema_is_refused_every_time_it_arrives(model: type[RunnerManifest] | type[ChannelManifest]) -> None:
    manifest._known_schema_problem.cache_clear()
    bad = {"type": "object", "properties": {"n": {"type": "integer", "minimum": "zero"}}}
    for _ in range(3):
        with pytest.raises(ManifestError, match=r"config_schema is not a valid JSON Schema: 'zero' is not of type"):
            model.parse_json(_wire(bad))
    # the same content in another key order is the same schema, with the same verdict
    reordered = {"properties": {"n": {"minimum": "zero", "type": "integer"}}, "type": "object"}
    with pytest.raises(ManifestError, match="not a valid JSON Schema"):
        model.parse_json(_wire(reordered))
    good = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}}
    for _ in range(2):
        assert model.parse_json(_wire(good)).config_schema == good
    assert manifest._known_schema_problem.cache_info().hits >= 3


def test_a_schema_built_in_python_that_is_not_json_is_still_checked() -> None:
    with pytest.raises(ValueError, match="not a valid JSON Schema"):
        RunnerManifest(name="r", config_schema={"type": "object", "minProperties": -1, "x": {1, 2}})
    assert RunnerManifest(name="r", config_schema={"type": "object", "x": {1, 2}}).name == "r"
