// What a runner author writes: a Runner with a manifest and an async-generator `run` (agenthost.runners.sdk.runner).
import type { RunAPI } from "./api";
import type { ChildRun, ChildRunOptions } from "./child";
import type { RunEvent } from "./events";
import type { ArtifactRef, TranscriptItem } from "./gen/agenthost/protos/common";
import type { ApprovalDecision } from "./gen/agenthost/protos/run_api";
import type { AgentRunContext } from "./gen/agenthost/protos/runner";

export type ApiName =
  | "history.page"
  | "history.search"
  | "events.get"
  | "events.page"
  | "artifacts.read"
  | "artifacts.create"
  | "state.read"
  | "state.write"
  | "kb"
  | "subagents";
export type ScopeName = "run" | "conversation" | "actor" | "binding" | "runner";

/** The manifest a runner declares; the host validates it (agenthost.plugins.manifest.RunnerManifest) at install
 * and at every start. Field names are the wire's (snake_case): it travels as this JSON. */
export interface RunnerManifest {
  name: string;
  description?: string;
  version?: string;
  capabilities?: { streaming?: boolean; tool_calls?: boolean; attachments?: boolean; cancellation?: boolean };
  /** The most a binding can grant this runner. `network`: its process needs the network (granted at install). */
  permissions?: { apis?: ApiName[]; state_scopes?: ScopeName[]; cross_conversation?: boolean; network?: boolean };
  context?: {
    bootstrap?: "none" | "current_event" | "recent_tail" | "summary_tail";
    max_inline_events?: number;
    max_inline_bytes?: number;
  };
  /** JSON Schema of the binding config; checked when a binding is created. */
  config_schema?: Record<string, unknown>;
}

/** One run as the runner sees it: the host's AgentRunContext plus a client for the run's API. */
export class RunContext {
  constructor(
    readonly context: AgentRunContext,
    readonly api: RunAPI,
    /** Aborted when the host cancels the run (a cancel request, its deadline, the process stopping). */
    readonly signal: AbortSignal,
    /** A directory private to this runner, under the plugin's data dir; persists across restarts. */
    readonly dataDir: string,
    /** The credential for processes started for this run; valid for this run's grant only. */
    readonly toolToken = "",
    /** Provider keys the binding names, resolved by the host from its key store. */
    readonly secrets: Record<string, string> = {},
  ) {}

  get runId(): string {
    return this.context.runId;
  }
  /** The inbound message text. */
  get text(): string {
    return this.context.input?.text ?? "";
  }
  /** Files sent with the inbound message (read them with `api.artifactReadAll`). */
  get attachments(): ArtifactRef[] {
    return this.context.event?.attachments ?? [];
  }
  get conversationId(): string {
    return this.context.conversation?.conversationId ?? "";
  }
  get botId(): string {
    return this.context.conversation?.botId ?? "";
  }
  /** UNIX seconds. */
  get deadlineAt(): number {
    return this.context.runtime?.deadlineAt ?? 0;
  }
  /** The binding's runner config (already checked by the host against the manifest's config_schema). */
  get config(): Record<string, unknown> {
    return JSON.parse(this.context.configJson || "{}");
  }
  /** The state snapshot taken when the run started, per granted scope. */
  get state(): Record<string, Record<string, unknown>> {
    return JSON.parse(this.context.stateJson || "{}");
  }
  /** History inlined by the host; empty unless the manifest asked for a bootstrap. */
  get bootstrap(): TranscriptItem[] {
    return this.context.bootstrap;
  }

  /** Records a subagent as a child run of this run while `body` runs. See ./child. */
  childRun<T>(description: string, options: ChildRunOptions, body: (child: ChildRun) => Promise<T>): Promise<T> {
    return this.api.childRun(description, options, body);
  }

  /** Asks whoever is talking to the bot whether a tool call may run. See RunAPI.requestApproval. */
  requestApproval(toolName: string, options: Parameters<RunAPI["requestApproval"]>[1] = {}): Promise<ApprovalDecision> {
    return this.api.requestApproval(toolName, options);
  }
}

/** Base class of every runner: set `static manifest` and implement `run`. */
export abstract class Runner {
  static manifest: RunnerManifest;

  constructor(readonly dataDir: string) {}

  /** Called once per process before the first run. */
  async setup(): Promise<void> {}

  /** Called once when the process shuts down gracefully. */
  async close(): Promise<void> {}

  /** Rules of a binding config that its JSON Schema cannot express; each sentence refuses it. */
  validateConfig(_config: Record<string, unknown>): string[] | Promise<string[]> {
    return [];
  }

  /** The models a binding with this config could use (`agenthost models`); a provider that could not be asked is
   * an entry with `error`. */
  async listModels(
    _config: Record<string, unknown>,
    _secrets: Record<string, string>,
  ): Promise<{ provider?: string; model?: string; base_url?: string; error?: string }[]> {
    return [];
  }

  /** Yields the run's events; a plain string is a text delta (the SDK coalesces deltas into batches). */
  abstract run(run: RunContext): AsyncIterable<RunEvent | string>;
}

export type RunnerClass = (new (dataDir: string) => Runner) & { manifest: RunnerManifest };

/** Sleeps `ms`, or rejects with the signal's reason when it is aborted first (a cancelled run). */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}
