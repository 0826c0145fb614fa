"""The AgentHost servicer: what the CLI (and any local client) can ask of the host."""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import grpc

from agenthost.host.access.credentials import current, require_bot
from agenthost.host.api import access
from agenthost.host.processes.binding_config import redact_config
from agenthost.plugins.install import InstallError
from agenthost.plugins.manifest import ManifestError
from agenthost.protos import common_pb2 as pb
from agenthost.protos import errors
from agenthost.protos import host_pb2 as hpb
from agenthost.protos import host_pb2_grpc as host_grpc
from agenthost.protos import run_api_pb2 as api
from agenthost.protos.handlers import add_service, pass_encoded

if TYPE_CHECKING:
    from agenthost.host.api.services import HostServices
    from agenthost.host.workers.hub import WorkerHub

R = TypeVar("R")
READ_ARTIFACT_MAX = 4 * 1024 * 1024  # per ReadRunArtifact call, well under the 8 MiB message cap


def _mapped(fn: Callable[..., Awaitable[R]]) -> Callable[..., Awaitable[R]]:
    @functools.wraps(fn)
    async def wrapper(self: AdminServicer, request: Any, context: grpc.aio.ServicerContext) -> R:
        try:
            return await fn(self, request, context)
        except errors.AgentHostError as exc:
            await errors.abort_with(context, exc)
            raise
        except InstallError as exc:
            await errors.abort_with(context, errors.FailedPrecondition(str(exc)))
            raise
        except ManifestError as exc:
            await errors.abort_with(context, errors.InvalidArgument(str(exc)))
            raise

    return wrapper


def add_admin_servicer(host: HostServices, server: grpc.aio.Server) -> dict[str, grpc.RpcMethodHandler]:
    """Serves the AgentHost service on `server`, as generated but for SendMessage, whose event batches may come
    serialized already and are sent as they are. Returns the handlers by fully qualified method name."""
    servicer = AdminServicer(host, encoded_replies=True)
    return add_service(
        server, hpb.DESCRIPTOR.services_by_name["AgentHost"], servicer, serializers={"SendMessage": pass_encoded}
    )


class AdminServicer(host_grpc.AgentHostServicer):
    """The admin API. Served over gRPC (add_admin_servicer) and called in-process by the web console
    (gateway.admin_calls), which gets every reply as an object: `encoded_replies` is for a gRPC server only."""

    def __init__(self, host: HostServices, *, encoded_replies: bool = False) -> None:
        self.host = host
        self._encoded_replies = encoded_replies

    @_mapped
    async def GetStatus(self, request: hpb.GetStatusRequest, context: grpc.aio.ServicerContext) -> hpb.HostStatus:
        return self.host.status()

    @_mapped
    async def InstallPlugin(
        self, request: hpb.InstallPluginRequest, context: grpc.aio.ServicerContext
    ) -> hpb.PluginInfo:
        if not request.source:
            raise errors.InvalidArgument("source is required: a directory, a wheel, or a requirement")
        return await self.host.install_plugin(
            request.source,
            offline=request.offline,
            allow_network=request.allow_network,
            require_hashes=request.require_hashes,
        )

    @_mapped
    async def ListPlugins(
        self, request: hpb.ListPluginsRequest, context: grpc.aio.ServicerContext
    ) -> hpb.ListPluginsResponse:
        return hpb.ListPluginsResponse(plugins=self.host.plugin_infos())

    @_mapped
    async def RemovePlugin(
        self, request: hpb.PluginRequest, context: grpc.aio.ServicerContext
    ) -> hpb.RemovePluginResponse:
        await self.host.remove_plugin(request.plugin_id)
        return hpb.RemovePluginResponse()

    @_mapped
    async def SetPluginEnabled(
        self, request: hpb.SetPluginEnabledRequest, context: grpc.aio.ServicerContext
    ) -> hpb.PluginInfo:
        return await self.host.set_plugin_enabled(request.plugin_id, request.enabled)

    @_mapped
    async def ListRunners(
        self, request: hpb.ListRunnersRequest, context: grpc.aio.ServicerContext
    ) -> hpb.ListRunnersResponse:
        return hpb.ListRunnersResponse(runners=[r for p in self.host.plugin_infos() for r in p.runners])

    @_mapped
    async def CreateBot(self, request: hpb.CreateBotRequest, context: grpc.aio.ServicerContext) -> hpb.Bot:
        name = request.name.strip()
        if not name or len(name) > 64 or not all(c.isalnum() or c in "-_." for c in name):
            raise errors.InvalidArgument("bot name must be 1-64 letters, digits, '-', '_' or '.'")
        return await self.host.registry.create_bot(name, request.description[:1000])

    @_mapped
    async def ListBots(self, request: hpb.ListBotsRequest, context: grpc.aio.ServicerContext) -> hpb.ListBotsResponse:
        return hpb.ListBotsResponse(bots=self.host.registry.bots())

    @_mapped
    async def DeleteBot(self, request: hpb.BotRequest, context: grpc.aio.ServicerContext) -> hpb.DeleteBotResponse:
        bot = self.host.registry.bot(request.bot)
        channels = self.host.channels.of_bot(bot.bot_id)
        if channels:
            raise errors.FailedPrecondition(f"channels {channels} connect bot {bot.name}; remove them first")
        await self.host.registry.delete_bot(bot.bot_id)
        return hpb.DeleteBotResponse()

    @_mapped
    async def CreateBinding(self, request: hpb.CreateBindingRequest, context: grpc.aio.ServicerContext) -> hpb.Binding:
        return await self.host.create_binding(request.bot, request.binding)

    @_mapped
    async def ListBindings(
        self, request: hpb.BotRequest, context: grpc.aio.ServicerContext
    ) -> hpb.ListBindingsResponse:
        bot = self.host.registry.bot(request.bot)
        bindings = self.host.registry.bindings(bot.bot_id)
        for binding in bindings:
            binding.config_json = json.dumps(redact_config(json.loads(binding.config_json or "{}")))
        return hpb.ListBindingsResponse(bindings=bindings)

    @_mapped
    async def DeleteBinding(
        self, request: hpb.DeleteBindingRequest, context: grpc.aio.ServicerContext
    ) -> hpb.DeleteBindingResponse:
        await self.host.registry.delete_binding(request.binding_id)
        return hpb.DeleteBindingResponse()

    @_mapped
    async def UpdateBinding(self, request: hpb.UpdateBindingRequest, context: grpc.aio.ServicerContext) -> hpb.Binding:
        binding = await self.host.update_binding(request)
        shown = hpb.Binding()
        shown.CopyFrom(binding)
        shown.config_json = json.dumps(redact_config(json.loads(binding.config_json or "{}")))
        return shown

    async def SendMessage(
        self, request: hpb.SendMessageRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[hpb.SendMessageReply | bytes]:
        try:
            stream = access.send(self.host.runs, current(), request, encoded=self._encoded_replies)
            started = await anext(stream)
        except errors.AgentHostError as exc:
            await errors.abort_with(context, exc)
            return
        yield started
        # Each reply coalesces whatever piled up, like the runner side does: one message, many deltas.
        try:
            async for reply in stream:
                yield reply
        except errors.AgentHostError as exc:  # e.g. this client fell too far behind and was dropped
            await errors.abort_with(context, exc)

    @_mapped
    async def GetRun(self, request: hpb.RunRequestById, context: grpc.aio.ServicerContext) -> hpb.RunInfo:
        info = self._run(request.run_id)
        info.child_run_ids.extend(self.host.run_store.children(info.run_id))
        return info

    def _run(self, run_id: str) -> hpb.RunInfo:
        return access.run(self.host.run_store, current(), run_id)

    @_mapped
    async def ListRuns(self, request: hpb.ListRunsRequest, context: grpc.aio.ServicerContext) -> hpb.ListRunsResponse:
        bot_id = self.host.registry.bot(request.bot).bot_id if request.bot else ""
        if not current().is_admin:
            if not bot_id:
                raise errors.InvalidArgument("a scoped credential lists the runs of one bot at a time: name it")
            require_bot(bot_id)
        limit = request.limit or 50
        if not 0 < limit <= 1000:
            raise errors.OutOfRange("limit must be between 1 and 1000")
        return hpb.ListRunsResponse(
            runs=self.host.run_store.list(
                bot_id=bot_id,
                conversation_id=request.conversation_id,
                status=request.status,
                limit=limit,
                origin=current().own_only,
            )
        )

    @_mapped
    async def CancelRun(self, request: hpb.RunRequestById, context: grpc.aio.ServicerContext) -> hpb.RunInfo:
        self._run(request.run_id)
        return await self.host.runs.cancel(request.run_id)

    @_mapped
    async def ListRunEvents(
        self, request: hpb.ListRunEventsRequest, context: grpc.aio.ServicerContext
    ) -> hpb.ListRunEventsResponse:
        self._run(request.run_id)
        limit = request.limit or 500
        if not 0 < limit <= 5000:
            raise errors.OutOfRange("limit must be between 1 and 5000")
        events, has_more = self.host.run_store.events(request.run_id, request.after_seq, limit)
        return hpb.ListRunEventsResponse(events=events, has_more=has_more)

    @_mapped
    async def ListConversations(
        self, request: hpb.BotRequest, context: grpc.aio.ServicerContext
    ) -> hpb.ListConversationsResponse:
        bot = self.host.registry.bot(request.bot)
        return hpb.ListConversationsResponse(
            conversations=[
                hpb.ConversationInfo(conversation_id=c, bot_id=bot.bot_id, item_count=n, updated_at=t)
                for c, n, t in self.host.conversations.list_conversations(bot.bot_id)
            ]
        )

    @_mapped
    async def GetHistory(
        self, request: hpb.GetHistoryRequest, context: grpc.aio.ServicerContext
    ) -> hpb.GetHistoryResponse:
        bot = self.host.registry.bot(request.bot)
        limit = request.limit or 50
        if not 0 < limit <= 100:
            raise errors.OutOfRange("limit must be between 1 and 100")
        forward = request.direction == pb.FORWARD
        page = self.host.conversations.page_history(
            bot.bot_id,
            request.conversation_id or "default",
            cursor=request.cursor,
            forward=forward,
            limit=limit,
            settled=forward,  # see page_history: a reader tailing forward must not pass a turn still running
        )
        return hpb.GetHistoryResponse(items=page.items, next_cursor=page.next_cursor, has_more=page.has_more)

    # ---- runner workers (admin only) ----

    def _workers(self) -> WorkerHub:
        if self.host.workers is None:
            raise errors.FailedPrecondition(
                "this host does not listen for workers; restart it with `agenthost serve --workers 0.0.0.0:7443`"
            )
        return self.host.workers

    @_mapped
    async def CreateWorkerToken(
        self, request: hpb.CreateWorkerTokenRequest, context: grpc.aio.ServicerContext
    ) -> hpb.CreatedWorkerToken:
        return await self._workers().create_token(request.pool, request.ttl_seconds)

    @_mapped
    async def ListWorkers(
        self, request: hpb.ListWorkersRequest, context: grpc.aio.ServicerContext
    ) -> hpb.ListWorkersResponse:
        return hpb.ListWorkersResponse(workers=self._workers().infos())

    @_mapped
    async def DrainWorker(self, request: hpb.WorkerRequest, context: grpc.aio.ServicerContext) -> hpb.WorkerInfo:
        return await self._workers().drain(request.name)

    @_mapped
    async def RevokeWorker(self, request: hpb.WorkerRequest, context: grpc.aio.ServicerContext) -> hpb.WorkerInfo:
        return await self._workers().revoke(request.name)

    @_mapped
    async def RotateWorker(self, request: hpb.WorkerRequest, context: grpc.aio.ServicerContext) -> hpb.WorkerInfo:
        return await self._workers().rotate(request.name)

    @_mapped
    async def RollWorkerCA(
        self, request: hpb.RollWorkerCARequest, context: grpc.aio.ServicerContext
    ) -> hpb.WorkerCAStatus:
        return await self._workers().roll_ca(request.step, request.force)

    # ---- credentials and keys (admin only: AuthInterceptor refuses scoped callers) ----

    @_mapped
    async def CreateCredential(
        self, request: hpb.CreateCredentialRequest, context: grpc.aio.ServicerContext
    ) -> hpb.CreatedCredential:
        bot_ids = [self.host.registry.bot(ref).bot_id for ref in request.bots]
        info, token = self.host.credentials.create(
            request.name, request.scope, bot_ids, all_conversations=request.all_conversations
        )
        return hpb.CreatedCredential(credential=info, token=token)

    @_mapped
    async def ListCredentials(
        self, request: hpb.ListCredentialsRequest, context: grpc.aio.ServicerContext
    ) -> hpb.ListCredentialsResponse:
        return hpb.ListCredentialsResponse(credentials=self.host.credentials.list())

    @_mapped
    async def RevokeCredential(
        self, request: hpb.RevokeCredentialRequest, context: grpc.aio.ServicerContext
    ) -> hpb.RevokeCredentialResponse:
        self.host.credentials.revoke(request.name)
        return hpb.RevokeCredentialResponse()

    @_mapped
    async def SetKey(self, request: hpb.SetKeyRequest, context: grpc.aio.ServicerContext) -> hpb.KeyInfo:
        return self.host.keys.set(request.name, request.value)

    @_mapped
    async def ListKeys(self, request: hpb.ListKeysRequest, context: grpc.aio.ServicerContext) -> hpb.ListKeysResponse:
        return hpb.ListKeysResponse(keys=self.host.keys.list())

    @_mapped
    async def RemoveKey(
        self, request: hpb.RemoveKeyRequest, context: grpc.aio.ServicerContext
    ) -> hpb.RemoveKeyResponse:
        self.host.keys.remove(request.name)
        return hpb.RemoveKeyResponse()

    # ---- knowledge base (admin only: AuthInterceptor refuses scoped callers) ----

    @_mapped
    async def KbAddDocument(
        self, request: hpb.KbAddDocumentRequest, context: grpc.aio.ServicerContext
    ) -> hpb.KbDocument:
        bot = self.host.registry.bot(request.bot)
        return await self.host.knowledge.add(bot.bot_id, request.name, request.content)

    @_mapped
    async def KbListDocuments(
        self, request: hpb.BotRequest, context: grpc.aio.ServicerContext
    ) -> hpb.KbListDocumentsResponse:
        bot = self.host.registry.bot(request.bot)
        documents = self.host.knowledge.documents(bot.bot_id)
        return hpb.KbListDocumentsResponse(documents=documents, chunks=sum(d.chunks for d in documents))

    @_mapped
    async def KbRemoveDocument(
        self, request: hpb.KbRemoveDocumentRequest, context: grpc.aio.ServicerContext
    ) -> hpb.KbRemoveDocumentResponse:
        bot = self.host.registry.bot(request.bot)
        await self.host.knowledge.remove(bot.bot_id, request.doc_id)
        return hpb.KbRemoveDocumentResponse()

    @_mapped
    async def KbSearch(
        self, request: hpb.KbAdminSearchRequest, context: grpc.aio.ServicerContext
    ) -> api.KbSearchResponse:
        bot = self.host.registry.bot(request.bot)
        return await self.host.knowledge.search(bot.bot_id, request.query, request.top_k)

    @_mapped
    async def KbReindex(self, request: hpb.BotRequest, context: grpc.aio.ServicerContext) -> hpb.KbReindexResponse:
        bot = self.host.registry.bot(request.bot)
        documents, chunks = await self.host.knowledge.reindex(bot.bot_id)
        return hpb.KbReindexResponse(documents=documents, chunks=chunks)

    @_mapped
    async def KbSetEmbeddings(
        self, request: hpb.KbSetEmbeddingsRequest, context: grpc.aio.ServicerContext
    ) -> hpb.KbEmbeddings:
        bot_id = self.host.registry.bot(request.bot).bot_id if request.bot else ""
        if not request.clear and not request.HasField("embeddings"):
            raise errors.InvalidArgument("give the embeddings settings, or clear")
        return await self.host.knowledge.set_embeddings(bot_id, None if request.clear else request.embeddings)

    @_mapped
    async def KbGetEmbeddings(
        self, request: hpb.KbGetEmbeddingsRequest, context: grpc.aio.ServicerContext
    ) -> hpb.KbEmbeddings:
        bot_id = self.host.registry.bot(request.bot).bot_id if request.bot else ""
        return self.host.knowledge.get_embeddings(bot_id)

    # Admin only (AuthInterceptor refuses scoped callers): the runners receive the bindings' provider keys.
    @_mapped
    async def ListModels(
        self, request: hpb.ListModelsAdminRequest, context: grpc.aio.ServicerContext
    ) -> hpb.ListModelsAdminResponse:
        from agenthost.host.api.models import list_models

        return await list_models(self.host.registry, self.host.supervisor, self.host.keys, request.bot)

    # ---- approvals (a send credential: its own bots' only, and unless granted all conversations, the runs it
    # started only; others' do not exist to it: agenthost.host.api.access) ----

    @_mapped
    async def ListApprovals(
        self, request: hpb.ListApprovalsRequest, context: grpc.aio.ServicerContext
    ) -> hpb.ListApprovalsResponse:
        bot_id = self.host.registry.bot(request.bot).bot_id if request.bot else ""
        approvals = access.approvals(self.host.runs.approvals, current(), bot_id=bot_id, run_id=request.run_id)
        return hpb.ListApprovalsResponse(approvals=approvals)

    @_mapped
    async def DecideApproval(
        self, request: hpb.DecideApprovalRequest, context: grpc.aio.ServicerContext
    ) -> hpb.ApprovalInfo:
        approvals = self.host.runs.approvals
        access.approval(approvals, current(), request.approval_id)
        return approvals.decide(request.approval_id, request.decision, request.note, current().name)

    # Channel instances (admin only): agenthost.host.processes.channels.
    @_mapped
    async def AddChannel(self, request: hpb.AddChannelRequest, context: grpc.aio.ServicerContext) -> hpb.ChannelInfo:
        return await self.host.channels.add(request)

    @_mapped
    async def ListChannels(
        self, request: hpb.ListChannelsRequest, context: grpc.aio.ServicerContext
    ) -> hpb.ListChannelsResponse:
        return hpb.ListChannelsResponse(channels=self.host.channels.list())

    @_mapped
    async def RemoveChannel(
        self, request: hpb.RemoveChannelRequest, context: grpc.aio.ServicerContext
    ) -> hpb.RemoveChannelResponse:
        await self.host.channels.remove(request.name)
        return hpb.RemoveChannelResponse()

    @_mapped
    async def ReadRunArtifact(
        self, request: hpb.ReadRunArtifactRequest, context: grpc.aio.ServicerContext
    ) -> hpb.ReadRunArtifactResponse:
        run = self._run(request.run_id)
        found = self.host.artifacts.get(request.artifact_id) if request.artifact_id else None
        # Only what this run made: an artifact of another run (of the same bot or not) does not exist here.
        if found is None or found[0].run_id != run.run_id or found[1] != run.bot_id:
            raise errors.NotFound(f"run {run.run_id} made no artifact {request.artifact_id!r}")
        ref = found[0]
        length = request.length or READ_ARTIFACT_MAX
        if request.offset < 0 or not 0 < length <= READ_ARTIFACT_MAX:
            raise errors.OutOfRange(f"offset must be >= 0 and length between 1 and {READ_ARTIFACT_MAX}")
        if request.offset > ref.size_bytes:
            raise errors.OutOfRange(f"offset {request.offset} is past the end ({ref.size_bytes} bytes)")
        data = self.host.artifacts.read(ref.sha256, request.offset, length)
        return hpb.ReadRunArtifactResponse(artifact=ref, data=data, eof=request.offset + len(data) >= ref.size_bytes)
