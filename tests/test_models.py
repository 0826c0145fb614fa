"""`agenthost models`: the host asks each binding's runner (here the real local agent, in process) what its
providers offer; the providers are a scripted model server on loopback, so what each was asked is observable."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
from pathlib import Path

import pytest

from agenthost.protos import errors
from agenthost.protos import host_pb2 as hpb
from agenthost.runners.local_agent.runner import LocalAgentRunner
from agenthost.runners.local_agent.testing import FakeProviderServer, Reply
from agenthost.runners.sdk.testing import HostHarness

MODELS = Reply(chunks=[json.dumps({"data": [{"id": "m1"}, {"id": "m2"}]}).encode()], content_type="application/json")


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released), so a connection to it is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.e2e
async def test_models_of_every_binding_with_errors_per_binding(tmp_path: Path) -> None:
    async with FakeProviderServer() as fake:
        # One path serves both protocols: OpenAI-compatible at {base}/models with base .../v1, Anthropic at
        # {base}/v1/models with the bare base.
        fake.routes["GET /v1/models"] = MODELS
        async with HostHarness(tmp_path, runners=[LocalAgentRunner], config={"model": "demo/offline"}) as h:
            await h.client.call("SetKey", hpb.SetKeyRequest(name="VLLM_KEY", value="sk-test-value-123"))
            keyed = await h.bind(
                "test/local-agent",
                {
                    "model": "vllm/m1",
                    "base_url": fake.url + "/v1",
                    "api_key_env": "VLLM_KEY",
                    "fallback_models": [
                        {"model": "anthropic-compatible/claude-x", "base_url": fake.url, "api_key_env": "VLLM_KEY"}
                    ],
                },
                priority=1,
                keys=["VLLM_KEY"],
            )
            missing = await h.bind(
                "test/local-agent", {"model": "vllm/m1", "base_url": fake.url + "/v1"}, priority=2, keys=["NOPE"]
            )
            down = await h.bind(
                "test/local-agent", {"model": "vllm/m1", "base_url": f"http://127.0.0.1:{closed_port()}/v1"}, priority=3
            )

            resp = await asyncio.wait_for(h.client.call("ListModels", hpb.ListModelsAdminRequest(bot=h.bot)), 60)
            by_id = {b.binding_id: b for b in resp.bindings}
            assert len(by_id) == 4

            demo = next(
                b for b in resp.bindings if b.binding_id not in {keyed.binding_id, missing.binding_id, down.binding_id}
            )
            assert not demo.error
            assert [(m.provider, m.model) for m in demo.models] == [("demo", "offline")]

            got = by_id[keyed.binding_id]
            assert not got.error and got.runner_id == "test/local-agent"
            assert [(m.provider, m.model, m.error) for m in got.models] == [
                ("vllm", "m1", ""),
                ("vllm", "m2", ""),
                ("anthropic-compatible", "m1", ""),
                ("anthropic-compatible", "m2", ""),
            ]
            asked = [r for r in fake.requests if r.path == "/v1/models"]
            assert len(asked) == 2
            # The binding's key reached each provider in its protocol's header, and only through the binding.
            assert any(r.headers.get("authorization") == "Bearer sk-test-value-123" for r in asked)
            assert any(
                r.headers.get("x-api-key") == "sk-test-value-123" and r.headers.get("anthropic-version") for r in asked
            )

            nokey = by_id[missing.binding_id]
            assert not nokey.models and "NOPE" in nokey.error
            assert len([r for r in fake.requests if r.path == "/v1/models"]) == 2  # never asked without its key

            unreachable = by_id[down.binding_id]
            assert not unreachable.error
            assert len(unreachable.models) == 1
            entry = unreachable.models[0]
            assert entry.provider == "vllm" and not entry.model and "ConnectError" in entry.error

            # Without a bot: every bot's bindings; an unknown bot is NOT_FOUND.
            everything = await h.client.call("ListModels", hpb.ListModelsAdminRequest())
            assert {b.binding_id for b in everything.bindings} == set(by_id)
            with pytest.raises(errors.NotFound):
                await h.client.call("ListModels", hpb.ListModelsAdminRequest(bot="no-such-bot"))

            # The CLI, as a user runs it, against this host.
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "agenthost.host.cli",
                "--data-dir",
                str(h.host.data_dir),
                "models",
                "--bot",
                h.bot,
                "--json",
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            try:
                out, err = await asyncio.wait_for(proc.communicate(), 60)
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
            assert proc.returncode == 0, err.decode()
            shown = {b["binding_id"]: b for b in json.loads(out)}
            assert [m["model"] for m in shown[keyed.binding_id]["models"][:2]] == ["m1", "m2"]
            assert "NOPE" in shown[missing.binding_id]["error"]


async def test_scoped_credential_cannot_list_models(tmp_path: Path) -> None:
    """The call hands the bindings' keys to runners: a send-scoped credential is refused."""
    from agenthost.host.api.client import HostClient

    async with HostHarness(tmp_path, runners=[LocalAgentRunner], config={"model": "demo/offline"}) as h:
        created = await h.client.call(
            "CreateCredential", hpb.CreateCredentialRequest(name="gw", scope="send", bots=[h.bot])
        )
        scoped = HostClient(h.host.admin_address, token=created.token)
        try:
            with pytest.raises(errors.PermissionDenied):
                await scoped.call("ListModels", hpb.ListModelsAdminRequest(bot=h.bot))
        finally:
            await scoped.close()


async def test_plugin_not_running_is_the_bindings_error(tmp_path: Path) -> None:
    async with HostHarness(tmp_path, runners=[LocalAgentRunner], config={"model": "demo/offline"}) as h:
        await h.host.supervisor.stop("test")
        resp = await h.client.call("ListModels", hpb.ListModelsAdminRequest(bot=h.bot))
        assert len(resp.bindings) == 1
        assert resp.bindings[0].error.startswith("plugin not running") and not resp.bindings[0].models
