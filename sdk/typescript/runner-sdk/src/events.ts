// Constructors for the events a runner yields (agenthost.runners.sdk.events): each returns a RunEvent ready for the
// wire. Exactly one terminal event (completed or failed) ends a run; a runner that returns without one gets
// completed() for it, one that throws gets failed("runner_error", ...).
import { type ArtifactRef, type RunEvent, StateScope } from "./gen/agenthost/protos/common";

export type { RunEvent };
export type Scope = "run" | "conversation" | "actor" | "binding" | "runner";

export const STATE_SCOPES: Record<Scope, StateScope> = {
  run: StateScope.RUN,
  conversation: StateScope.CONVERSATION,
  actor: StateScope.ACTOR,
  binding: StateScope.BINDING,
  runner: StateScope.RUNNER,
};

/** The wire value of a scope name; throws for an unknown one. */
export function scopeValue(scope: Scope): StateScope {
  const value = STATE_SCOPES[scope];
  if (value === undefined) {
    throw new RangeError(`unknown state scope ${JSON.stringify(scope)}; expected one of ${Object.keys(STATE_SCOPES)}`);
  }
  return value;
}

function event(kind: Omit<RunEvent, "seq" | "createdAt">): RunEvent {
  return { ...kind, seq: 0, createdAt: 0 };
}

/** A piece of streamed assistant text (yielding a plain string is the same). */
export function text(delta: string): RunEvent {
  return { textDelta: { text: delta }, seq: 0, createdAt: 0 };
}

/** A completed message: after streamed deltas, it is the final text in the transcript. */
export function message(text: string, role = "assistant"): RunEvent {
  return event({ message: { role, text, parts: [] } });
}

export function toolStarted(toolCallId: string, toolName: string, args: unknown = {}): RunEvent {
  const argumentsJson = typeof args === "string" ? args : JSON.stringify(args ?? {});
  return event({ toolStarted: { toolCallId, toolName, argumentsJson } });
}

export function toolFinished(
  toolCallId: string,
  toolName: string,
  result: string,
  options: { isError?: boolean; artifactId?: string } = {},
): RunEvent {
  return event({
    toolFinished: { toolCallId, toolName, result, isError: options.isError ?? false, artifactId: options.artifactId ?? "" },
  });
}

export function compaction(tokensBefore: number, tokensAfter: number, summary = "", artifactId = ""): RunEvent {
  return event({ compaction: { tokensBefore, tokensAfter, summary, artifactId } });
}

export function retry(attempt: number, delaySeconds: number, reason: string): RunEvent {
  return event({ retry: { attempt, delaySeconds, reason } });
}

export function stateUpdated(scope: Scope, key: string): RunEvent {
  return event({ stateUpdated: { scope: scopeValue(scope), key } });
}

/** Must name an artifact the run may read (one it made, or its conversation's). */
export function artifactCreated(artifact: ArtifactRef): RunEvent {
  return event({ artifactCreated: { artifact } });
}

export function usage(
  inputTokens = 0,
  outputTokens = 0,
  options: { cacheReadTokens?: number; cacheWriteTokens?: number; costUsd?: number; model?: string } = {},
): RunEvent {
  return event({
    usage: {
      inputTokens,
      outputTokens,
      cacheReadTokens: options.cacheReadTokens ?? 0,
      cacheWriteTokens: options.cacheWriteTokens ?? 0,
      costUsd: options.costUsd ?? 0,
      model: options.model ?? "",
    },
  });
}

export function progress(message: string, fraction = -1): RunEvent {
  return event({ progress: { message, fraction } });
}

export function completed(finishReason = "stop"): RunEvent {
  return event({ completed: { finishReason } });
}

export function failed(code: string, message: string, options: { retryable?: boolean } = {}): RunEvent {
  return event({ failed: { code, message, retryable: options.retryable ?? false } });
}

export function isTerminal(event: RunEvent): boolean {
  return event.completed !== undefined || event.failed !== undefined;
}

/** The name of the event's kind ("text_delta", "completed", ...), as the Python SDK's WhichOneof says it. */
export function kindOf(event: RunEvent): string {
  for (const [key, value] of Object.entries(event)) {
    if (value !== undefined && key !== "seq" && key !== "createdAt") return key.replace(/[A-Z]/g, (c) => "_" + c.toLowerCase());
  }
  return "";
}
