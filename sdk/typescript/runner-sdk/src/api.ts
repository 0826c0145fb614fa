// RunAPI: the typed client a runner uses to reach the host's AgentRunAPIProxy for one run, call for call what the
// Python SDK's agenthost.runners.sdk.api.RunAPI offers. Every call carries the run's token and the plugin's
// process secret, names the run, and is bounded by the run's deadline (a call never outlives the run that made
// it). A failed call rejects with the typed errors of ./errors.
import { Metadata, type CallOptions, type ClientReadableStream, type ServiceError } from "@grpc/grpc-js";
import { ChildRun, openChildRun, type ChildRunOptions } from "./child";
import { DeadlineExceeded, ResourceExhausted, fromServiceError } from "./errors";
import { type Scope, scopeValue } from "./events";
import { type ArtifactRef, Direction as WireDirection, type EventRecord, type TranscriptItem } from "./gen/agenthost/protos/common";
import type {
  AgentRunAPIProxyClient,
  ApprovalDecision,
  ArtifactChunk,
  EventPageResponse,
  HistoryPageResponse,
  KbSearchResponse,
  StateListResponse,
  StateValue,
} from "./gen/agenthost/protos/run_api";
import { APPROVAL_DEFAULT_SECONDS } from "./wire";

export type Direction = "backward" | "forward";
export const UPLOAD_CHUNK = 256 * 1024;
export const DEFAULT_CALL_TIMEOUT = 30.0;

function direction(value: Direction): WireDirection {
  if (value === "backward") return WireDirection.BACKWARD;
  if (value === "forward") return WireDirection.FORWARD;
  throw new RangeError(`direction must be 'backward' or 'forward', not ${JSON.stringify(value)}`);
}

type Unary<Req, Res> = (
  request: Req,
  metadata: Metadata,
  options: Partial<CallOptions>,
  callback: (error: ServiceError | null, response: Res) => void,
) => unknown;

export class RunAPI {
  readonly runId: string;
  readonly runToken: string;
  readonly pluginSecret: string;
  /** UNIX seconds; 0: none. */
  readonly deadlineAt: number;
  private readonly metadata: Metadata;

  /** Built by the SDK for each run (`RunContext.api`); runner code does not make one. `client` is the generated
   * AgentRunAPIProxy client the calls go through. */
  constructor(
    readonly client: AgentRunAPIProxyClient,
    options: { runId: string; runToken: string; pluginSecret?: string; deadlineAt: number; callTimeout?: number },
  ) {
    this.runId = options.runId;
    this.runToken = options.runToken;
    this.pluginSecret = options.pluginSecret ?? "";
    this.deadlineAt = options.deadlineAt;
    this.callTimeout = options.callTimeout ?? DEFAULT_CALL_TIMEOUT;
    // A run token is presented with the plugin process's secret; a tool token alone.
    this.metadata = new Metadata();
    this.metadata.set("authorization", `Bearer ${options.runToken}`);
    if (options.pluginSecret) this.metadata.set("x-agenthost-plugin", options.pluginSecret);
  }

  private readonly callTimeout: number;

  /** Seconds left for a call: the run's remaining time, at most `limit`. */
  private remaining(limit: number): number {
    const left = this.deadlineAt ? this.deadlineAt - Date.now() / 1000 : limit;
    if (left <= 0) throw new DeadlineExceeded(`run ${this.runId} is past its deadline`);
    return Math.min(left, limit);
  }

  private options(limit = this.callTimeout): Partial<CallOptions> {
    return { deadline: new Date(Date.now() + this.remaining(limit) * 1000) };
  }

  private unary<Req, Res>(method: Unary<Req, Res>, request: Req, limit?: number): Promise<Res> {
    return new Promise<Res>((resolve, reject) => {
      let options: Partial<CallOptions>;
      try {
        options = this.options(limit);
      } catch (err) {
        reject(err);
        return;
      }
      method.call(this.client, request, this.metadata, options, (error, response) => {
        if (error) reject(fromServiceError(error));
        else resolve(response);
      });
    });
  }

  // ---- history and events ----

  /** One page of the transcript. BACKWARD (default) starts at the newest item; pass nextCursor on. */
  historyPage(
    options: { conversationId?: string; cursor?: string; direction?: Direction; limit?: number } = {},
  ): Promise<HistoryPageResponse> {
    return this.unary(this.client.historyPage, {
      runId: this.runId,
      conversationId: options.conversationId ?? "",
      cursor: options.cursor ?? "",
      direction: direction(options.direction ?? "backward"),
      limit: options.limit ?? 50,
    });
  }

  async historySearch(
    query: string,
    options: { conversationId?: string; roles?: string[]; itemTypes?: string[]; topK?: number } = {},
  ): Promise<TranscriptItem[]> {
    const response = await this.unary(this.client.historySearch, {
      runId: this.runId,
      conversationId: options.conversationId ?? "",
      query,
      roles: options.roles ?? [],
      itemTypes: options.itemTypes ?? [],
      topK: options.topK ?? 10,
    });
    return response.items;
  }

  eventGet(eventId: string): Promise<EventRecord> {
    return this.unary(this.client.eventGet, { runId: this.runId, eventId });
  }

  eventPage(
    options: { conversationId?: string; cursor?: string; direction?: Direction; limit?: number; eventTypes?: string[] } = {},
  ): Promise<EventPageResponse> {
    return this.unary(this.client.eventPage, {
      runId: this.runId,
      conversationId: options.conversationId ?? "",
      cursor: options.cursor ?? "",
      direction: direction(options.direction ?? "backward"),
      limit: options.limit ?? 50,
      eventTypes: options.eventTypes ?? [],
    });
  }

  // ---- artifacts ----

  artifactMetadata(artifactId: string): Promise<ArtifactRef> {
    return this.unary(this.client.artifactMetadata, { runId: this.runId, artifactId });
  }

  artifactReadRange(artifactId: string, offset = 0, length = 64 * 1024): Promise<ArtifactChunk> {
    return this.unary(this.client.artifactReadRange, { runId: this.runId, artifactId, offset, length });
  }

  /** Streams an artifact's bytes from offset to the end, in host-sized chunks. */
  async *artifactRead(artifactId: string, offset = 0): AsyncGenerator<Uint8Array> {
    const call: ClientReadableStream<ArtifactChunk> = this.client.artifactRead(
      { runId: this.runId, artifactId, offset },
      this.metadata,
      this.options(),
    );
    try {
      for await (const chunk of call as AsyncIterable<ArtifactChunk>) {
        if (chunk.data.length) yield chunk.data;
      }
    } catch (err) {
      throw fromServiceError(err as Error);
    } finally {
      call.cancel();
    }
  }

  async artifactReadAll(artifactId: string, options: { maxBytes?: number } = {}): Promise<Buffer> {
    const maxBytes = options.maxBytes ?? 16 * 1024 * 1024;
    const parts: Uint8Array[] = [];
    let total = 0;
    for await (const data of this.artifactRead(artifactId)) {
      total += data.length;
      if (total > maxBytes) throw new ResourceExhausted(`artifact ${artifactId} is larger than maxBytes=${maxBytes}`);
      parts.push(data);
    }
    return Buffer.concat(parts);
  }

  /** Uploads bytes (or an async stream of chunks) as a new artifact of this run's conversation. */
  artifactCreate(
    data: Uint8Array | string | AsyncIterable<Uint8Array>,
    options: { name: string; mimeType?: string; metadata?: Record<string, unknown> },
  ): Promise<ArtifactRef> {
    const bytes = typeof data === "string" ? Buffer.from(data) : data;
    return new Promise<ArtifactRef>((resolve, reject) => {
      let callOptions: Partial<CallOptions>;
      try {
        callOptions = this.options();
      } catch (err) {
        reject(err);
        return;
      }
      const call = this.client.artifactCreate(this.metadata, callOptions, (error, ref) => {
        if (error) reject(fromServiceError(error));
        else resolve(ref);
      });
      const header = {
        runId: this.runId,
        name: options.name,
        mimeType: options.mimeType ?? "application/octet-stream",
        metadataJson: JSON.stringify(options.metadata ?? {}),
        expectedSize: bytes instanceof Uint8Array ? bytes.length : 0,
      };
      // A write after the host ended the call is dropped by grpc-js; the call's status (the callback) says why.
      const write = (part: object) =>
        new Promise<void>((done) => {
          if (!call.write(part)) call.once("drain", done);
          else done();
        });
      (async () => {
        await write({ header });
        const chunks: AsyncIterable<Uint8Array> | Iterable<Uint8Array> = bytes instanceof Uint8Array ? [bytes] : bytes;
        for await (const chunk of chunks) {
          for (let start = 0; start < chunk.length; start += UPLOAD_CHUNK) {
            await write({ data: chunk.subarray(start, start + UPLOAD_CHUNK) });
          }
        }
        call.end();
      })().catch((err) => {
        call.cancel();
        reject(err);
      });
    });
  }

  // ---- state ----

  /** The decoded JSON value, or `fallback` when the key is absent. */
  async stateGet<T = unknown>(scope: Scope, key: string, fallback?: T): Promise<T | undefined> {
    const value = await this.stateGetVersioned(scope, key);
    return value.found ? (JSON.parse(value.valueJson) as T) : fallback;
  }

  stateGetVersioned(scope: Scope, key: string): Promise<StateValue> {
    return this.unary(this.client.stateGet, { runId: this.runId, scope: scopeValue(scope), key });
  }

  /** Stores a JSON value; resolves to its new version. With ifVersion, rejects with Aborted if another write won. */
  async stateSet(scope: Scope, key: string, value: unknown, options: { ifVersion?: number } = {}): Promise<number> {
    const response = await this.unary(this.client.stateSet, {
      runId: this.runId,
      scope: scopeValue(scope),
      key,
      valueJson: JSON.stringify(value),
      ifVersion: options.ifVersion,
    });
    return response.version;
  }

  async stateDelete(scope: Scope, key: string): Promise<boolean> {
    const response = await this.unary(this.client.stateDelete, { runId: this.runId, scope: scopeValue(scope), key });
    return response.deleted;
  }

  stateList(scope: Scope, options: { prefix?: string; cursor?: string; limit?: number } = {}): Promise<StateListResponse> {
    return this.unary(this.client.stateList, {
      runId: this.runId,
      scope: scopeValue(scope),
      prefix: options.prefix ?? "",
      cursor: options.cursor ?? "",
      limit: options.limit ?? 100,
    });
  }

  // ---- knowledge base ----

  /** The bot's knowledge-base chunks that best match the query (needs the `kb` grant). */
  kbSearch(query: string, options: { topK?: number } = {}): Promise<KbSearchResponse> {
    return this.unary(this.client.kbSearch, { runId: this.runId, query, topK: options.topK ?? 5 });
  }

  // ---- approvals ----

  /** Asks a person whether this tool call may run and waits for the answer (or the timeout: 0 = the host's
   * default, capped by the run's deadline). Only `decision.approved` means yes. Always granted. */
  requestApproval(
    toolName: string,
    options: { summary?: string; arguments?: unknown; reason?: string; timeoutSeconds?: number; toolCallId?: string } = {},
  ): Promise<ApprovalDecision> {
    const timeoutSeconds = options.timeoutSeconds ?? 0;
    // The host answers at the timeout itself; the margin only covers the trip back.
    const wait = (timeoutSeconds || APPROVAL_DEFAULT_SECONDS) + 30;
    return this.unary(
      this.client.requestApproval,
      {
        runId: this.runId,
        toolName,
        summary: options.summary ?? "",
        argumentsJson: options.arguments === undefined ? "" : JSON.stringify(options.arguments),
        reason: options.reason ?? "",
        timeoutSeconds,
        toolCallId: options.toolCallId ?? "",
      },
      wait,
    );
  }

  // ---- child runs (subagents) ----

  /** Records a subagent as a child run of this run (needs the `subagents` grant) while `body` runs; see ./child. */
  childRun<T>(description: string, options: ChildRunOptions, body: (child: ChildRun) => Promise<T>): Promise<T> {
    const remaining = this.remaining(24 * 3600);
    const header = {
      runId: this.runId,
      description,
      subagentType: options.subagentType ?? "",
      toolCallId: options.toolCallId ?? "",
      timeoutSeconds: options.timeout ?? 0,
    };
    // The call lives as long as the child, which the host ends at the run's deadline at the latest.
    const call = this.client.childRun(this.metadata, { deadline: new Date(Date.now() + (remaining + 5) * 1000) });
    return openChildRun(call, header, body);
  }
}
