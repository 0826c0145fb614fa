"""The CLI as a user runs it: a real process per command against a real host (in this process, on its own loop).

Fast checks need no host (parsing, --version, --help cost, JSON encoding, config messages); the rest start one
host per test with the built-in runners (marked slow).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, Field

from agenthost.host.cli.main import RUN_STATUSES, STATE_SCOPE_NAMES, build_parser, config_fields, to_jsonable, version
from agenthost.host.processes import binding_config
from agenthost.protos import errors
from tests.cli_process import CLI, acli, cli_env


def run_cli(*args: str, data_dir: Path | None = None, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], env=cli_env(data_dir), capture_output=True, text=True, timeout=60, **kw)


# ---- no host needed ----


@pytest.mark.e2e
def test_version_is_the_installed_distributions() -> None:
    from importlib.metadata import version as dist_version

    proc = run_cli("--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"agenthost {dist_version('agenthost')}" == f"agenthost {version()}"


@pytest.mark.parametrize("flag", ["--help", "--version"])
@pytest.mark.e2e
def test_help_and_version_do_not_import_grpc(flag: str) -> None:
    code = (
        "import sys\nfrom agenthost.host.cli import main as cli\ntry:\n"
        f"    cli.main([{flag!r}])\nexcept SystemExit:\n    pass\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('grpc', 'google', 'pydantic'))\n"
        "sys.stderr.write('HEAVY=' + ','.join(heavy))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=cli_env())
    assert proc.stderr.strip().endswith("HEAVY="), proc.stderr[-500:]


def _leaves(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [(path, parser)]
    return [leaf for name, child in subs[0].choices.items() for leaf in _leaves(child, (*path, name))]


def test_every_action_has_an_example_in_its_help() -> None:
    leaves = _leaves(build_parser())
    assert len(leaves) >= 29
    for path, parser in leaves:
        assert parser.epilog and f"agenthost {' '.join(path)}" in parser.epilog, path


def test_every_data_command_takes_json() -> None:
    for path, parser in _leaves(build_parser()):
        if path[0] in ("serve", "demo", "chat", "worker"):  # processes that serve, not commands that print data
            continue
        assert any("--json" in a.option_strings for a in parser._actions), path


@pytest.mark.e2e
def test_bad_filters_are_refused_before_anything_runs() -> None:
    bad = run_cli("runs", "list", "--status", "bogus")
    assert bad.returncode == 2
    assert "invalid choice: 'bogus'" in bad.stderr and all(s in bad.stderr for s in RUN_STATUSES)
    for args in (
        ["runs", "list", "--limit", "0"],
        ["runs", "list", "--limit", "x"],
        ["history", "b", "--limit", "101"],
    ):
        proc = run_cli(*args)
        assert proc.returncode == 2 and "--limit" in proc.stderr, args
    assert "invalid choice" in run_cli("bots", "bind", "b", "--runner", "x/y", "--scope", "world").stderr


def test_the_clis_own_lists_match_their_sources() -> None:
    from agenthost.protos.wire import STATE_SCOPES

    assert set(STATE_SCOPE_NAMES) == set(STATE_SCOPES)
    proto = (Path(__file__).resolve().parent.parent / "protos" / "host.proto").read_text()
    assert "string status = 7;  // " + " | ".join(RUN_STATUSES) in proto


def test_json_keeps_64_bit_integers_numbers() -> None:
    from google.protobuf.json_format import MessageToDict

    from agenthost.protos import common_pb2 as pb
    from agenthost.protos import host_pb2 as hpb
    from agenthost.protos import runner_pb2

    run = hpb.RunInfo(run_id="r", usage=pb.Usage(input_tokens=2**40, output_tokens=7), created_at=1.5)
    assert MessageToDict(run)["usage"]["inputTokens"] == str(2**40)  # what a naive encoder would print
    out = json.loads(json.dumps(to_jsonable(run)))
    assert out["usage"]["input_tokens"] == 2**40 and out["usage"]["output_tokens"] == 7
    assert out["created_at"] == 1.5 and out["status"] == "" and out["error_code"] == ""  # defaults are present
    policy = to_jsonable(hpb.ResourcePolicy(state_scopes=[pb.CONVERSATION]))
    assert policy["state_scopes"] == ["CONVERSATION"]
    secrets = to_jsonable(runner_pb2.RunRequest(secrets={"K": "v"}))
    assert secrets["secrets"] == {"K": "v"} and "context" not in secrets  # unset message: absent, like protobuf
    event = to_jsonable(pb.RunEvent(text_delta=pb.TextDelta(text="hi")))
    assert event["text_delta"] == {"text": "hi"} and "completed" not in event


class _Harnessish(BaseModel):
    model_config = {"extra": "forbid"}
    max_turns: int | None = Field(default=None, ge=1, le=10, description="turns")
    name: str = "x"
    mode: str | None = Field(default=None, pattern="^(a|b)$")


def test_schema_problems_name_the_setting_and_the_rule() -> None:
    schema = _Harnessish.model_json_schema()
    assert binding_config.schema_problems(schema, {"max_turns": 12}) == [
        "max_turns: 12 is greater than the maximum of 10"
    ]
    assert binding_config.schema_problems(schema, {"max_turns": "many"}) == [
        "max_turns: 'many' is not of type integer or null"
    ]
    (extra,) = binding_config.schema_problems(schema, {"colour": 1})
    assert extra.startswith("config: Additional properties are not allowed ('colour'")
    assert binding_config.schema_problems(schema, {"max_turns": 3, "mode": "a"}) == []
    with pytest.raises(errors.InvalidArgument, match=r"runner p/r is invalid: max_turns: 0 is less than the minimum"):
        binding_config.refuse("p/r", binding_config.schema_problems(schema, {"max_turns": 0}))


def test_config_patch_merges_and_removes() -> None:
    assert binding_config.merge_patch({"a": 1, "b": 2}, '{"b": null, "c": [1]}') == {"a": 1, "c": [1]}
    for bad in ("[1]", "{nope"):
        with pytest.raises(errors.InvalidArgument):
            binding_config.merge_patch({}, bad)


def test_runners_show_lists_settings_with_types_defaults_and_rules() -> None:
    from agenthost.runners.local_agent.config import LocalAgentConfig

    fields = {f["name"]: f for f in config_fields(LocalAgentConfig.json_schema())}
    assert fields["max_iterations"]["type"] == "integer" and fields["max_iterations"]["default"] == 25
    assert fields["max_iterations"]["rules"] == [">= 1", "<= 500"]
    assert fields["model"]["type"] == "string | null" and "provider/model" in fields["model"]["description"]
    assert "secret" in fields["api_key"]["description"]
    assert fields["tools"]["type"] == "list[string] | null"
    assert fields["shell.timeout_seconds"]["type"] == "number"  # nested models are flattened


# ---- against a real host ----


@pytest.fixture
async def host(tmp_path: Path) -> AsyncIterator[Path]:
    from agenthost.host.server import Host

    h = Host(tmp_path / "data")
    await h.start()
    try:
        yield h.data_dir
    finally:
        await h.stop()


LOCAL = "agenthost/local-agent"


@pytest.mark.slow
async def test_bind_is_checked_by_the_runners_own_rules(host: Path) -> None:
    assert (await acli(host, "bots", "create", "b"))[0] == 0
    refused = {
        ("model=gpt-4o",): "model: must be 'provider/model'",
        ("model=nowhere/x",): "model: unknown provider 'nowhere'",
        ('tools=["read_file","fly"]',): "tools: unknown tools ['fly']",
        ("workspace=rel/dir",): "workspace: 'rel/dir' must be an absolute path",
        ("max_iterations=900",): "max_iterations: 900 is greater than the maximum of 500",
        ("temperature=hot",): "temperature: 'hot' is not of type number or null",
    }
    for config, message in refused.items():
        code, _, err = await acli(host, "bots", "bind", "b", "--runner", LOCAL, "--config", *config)
        assert code == 1 and "INVALID_ARGUMENT" in err and message in err, (config, err)
    for config, message in {
        ("workspace_root=ws",): "workspace_root: 'ws' must be an absolute path",
        ("max_turns=20000",): "max_turns: 20000 is greater than the maximum of 10000",
        ('pass_env=["HOME"]',): "'HOME' is not a forwardable environment variable name",
    }.items():
        code, _, err = await acli(host, "bots", "bind", "b", "--runner", "agenthost/claude-code", "--config", *config)
        assert code == 1 and message in err, (config, err)
    code, out, _ = await acli(host, "bots", "bindings", "b", "--json")
    assert code == 0 and json.loads(out) == []  # nothing refused was stored


@pytest.mark.slow
async def test_update_binding_json_runs_and_sigpipe(host: Path) -> None:
    await acli(host, "bots", "create", "b")
    code, out, err = await acli(host, "--json", "bots", "bind", "b", "--runner", LOCAL, "--config", "max_iterations=5")
    assert code == 0, err
    binding = json.loads(out)
    assert binding["priority"] == 0 and isinstance(binding["created_at"], float)
    bid = binding["binding_id"]

    code, out, err = await acli(
        host,
        "bots",
        "update-binding",
        bid,
        "--config",
        "max_iterations=7",
        "system_prompt=Be brief.",
        "--priority",
        "3",
        "--json",
    )
    assert code == 0, err
    updated = json.loads(out)
    assert updated["binding_id"] == bid and updated["priority"] == 3
    assert json.loads(updated["config_json"]) == {"max_iterations": 7, "system_prompt": "Be brief."}
    code, _, err = await acli(host, "bots", "update-binding", bid, "--config", 'tools=["fly"]')
    assert code == 1 and "tools: unknown tools ['fly']" in err
    code, _, err = await acli(host, "bots", "update-binding", bid, "--config", "max_iterations=0")
    assert code == 1 and "max_iterations: 0 is less than the minimum of 1" in err
    code, out, _ = await acli(host, "bots", "bindings", "b", "--json")
    (stored,) = json.loads(out)
    assert json.loads(stored["config_json"]) == {"max_iterations": 7, "system_prompt": "Be brief."}  # unchanged
    code, _, err = await acli(host, "bots", "update-binding", bid, "--config", "system_prompt=null")
    assert code == 0, err
    code, _, err = await acli(host, "bots", "update-binding", "bnd_missing", "--priority", "1")
    assert code == 1 and "NOT_FOUND" in err

    for text in ("hello", "again"):
        code, out, err = await acli(host, "send", "b", text, "--json")
        assert code == 0, err
        assert json.loads(out)["status"] == "completed"
    code, out, _ = await acli(host, "runs", "list", "--json")
    runs = json.loads(out)
    assert len(runs) == 2 and all(r["binding_id"] == bid for r in runs)
    assert isinstance(runs[0]["usage"]["input_tokens"], int) and runs[0]["usage"]["input_tokens"] > 0
    code, out, _ = await acli(host, "runs", "list", "--status", "failed", "--json")
    assert json.loads(out) == []
    code, out, _ = await acli(host, "runs", "show", runs[0]["run_id"], "--events", "--json")
    shown = json.loads(out)
    assert shown["run_id"] == runs[0]["run_id"] and isinstance(shown["events"][0]["seq"], int)
    code, out, _ = await acli(host, "status", "--json")
    status = json.loads(out)
    assert status["runs_in_flight"] == 0 and isinstance(status["pid"], int) and status["plugins"]
    code, out, _ = await acli(host, "runners", "show", LOCAL, "--json")
    shown = json.loads(out)
    assert shown["name"] == "local-agent" and any(f["name"] == "max_iterations" for f in shown["config_fields"])
    code, out, _ = await acli(host, "runners", "show", LOCAL)
    assert "max_iterations: integer = 25 [>= 1, <= 500]" in out and "permissions:" in out
    for listing in (["plugins", "list"], ["bots", "list"], ["keys", "list"], ["credentials", "list"]):
        code, out, err = await acli(host, *listing, "--json")
        assert code == 0 and isinstance(json.loads(out), list), (listing, err)
    code, out, _ = await acli(host, "history", "b", "--json")
    assert [i["role"] for i in json.loads(out)["items"]][:2] == ["user", "assistant"]

    # A reader that is already gone (`agenthost runs list | head -0`): no traceback, the shell's SIGPIPE status.
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        code, _, err = await acli(host, "runs", "list", "--json", stdout=write_end)
    finally:
        os.close(write_end)
    assert code == 141 and err == "", err


@pytest.mark.slow
async def test_credentials_granted_all_conversations_say_so(host: Path) -> None:
    assert (await acli(host, "bots", "create", "b"))[0] == 0
    code, _, err = await acli(host, "credentials", "create", "app", "--bot", "b")
    assert code == 0, err
    code, _, err = await acli(host, "credentials", "create", "ops-app", "--bot", "b", "--all-conversations")
    assert code == 0, err
    code, _, err = await acli(host, "credentials", "create", "ops", "--scope", "admin", "--all-conversations")
    assert code == 1 and "INVALID_ARGUMENT" in err and "only a send credential" in err
    code, out, _ = await acli(host, "credentials", "list", "--json")
    assert {c["name"]: c.get("all_conversations", False) for c in json.loads(out)} == {"app": False, "ops-app": True}
    code, out, err = await acli(host, "credentials", "list")
    lines = {line.split()[0]: line for line in (out + err).splitlines() if line.strip()}
    assert "own conversations" in lines["app"] and "all conversations" in lines["ops-app"]


@pytest.mark.slow
async def test_relative_paths_are_the_users(host: Path, tmp_path: Path) -> None:
    """`plugins install ./dir` and `--data-dir rel` resolve against the CLI's working directory, not the host's."""
    import shutil

    from agenthost.host.cli.demo import example_plugin

    work = tmp_path / "work"
    work.mkdir()
    shutil.copytree(example_plugin(), work / "my-notes")
    rel_data = os.path.relpath(host, work)
    proc = await asyncio.create_subprocess_exec(
        *CLI,
        "--data-dir",
        rel_data,
        "plugins",
        "install",
        "./my-notes",
        "--offline",
        "--json",
        cwd=work,
        env=cli_env(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 300)
    assert proc.returncode == 0, err.decode()
    info = json.loads(out)
    assert info["plugin_id"] == "agenthost-notes" and info["source"].endswith("my-notes")
    assert [r["runner_id"] for r in info["runners"]] == ["agenthost-notes/notes"]


@pytest.mark.slow
async def test_a_plugins_own_validate_hook_refuses_and_a_crashing_hook_fails_closed(tmp_path: Path) -> None:
    from agenthost.runners.sdk import Runner, RunnerManifest, events
    from agenthost.runners.sdk.testing import HostHarness

    class Picky(Runner):
        manifest = RunnerManifest(name="picky", config_schema={"type": "object"})

        def validate_config(self, config: dict[str, Any]) -> list[str]:
            if config.get("boom"):
                raise RuntimeError("bug in the hook")
            return [] if config.get("colour", "blue") == "blue" else ["colour: must be blue"]

        async def run(self, run: Any) -> AsyncIterator[Any]:
            yield events.text("ok")

    async with HostHarness(tmp_path, runners=[Picky]) as h:  # binds {} at priority 0: accepted
        with pytest.raises(errors.InvalidArgument, match="runner test/picky is invalid: colour: must be blue"):
            await h.bind("test/picky", {"colour": "red"}, priority=1)
        with pytest.raises(errors.InvalidArgument, match="could not check this config: RuntimeError: bug in the hook"):
            await h.bind("test/picky", {"boom": True}, priority=1)
        assert (await h.bind("test/picky", {"colour": "blue"}, priority=1)).binding_id
        assert (await h.send("hi")).text == "ok"
