// The typed errors of a failed run-API call, one class per gRPC status, as agenthost.protos.errors maps them: a
// runner catches `NotFound`, not a ServiceError with a code to compare.
import { Metadata, status, type ServiceError } from "@grpc/grpc-js";

/** Trailing metadata of a refusal that a later retry can cure: how long to wait, in milliseconds. */
export const RETRY_AFTER_KEY = "retry-after-ms";

export class AgentHostError extends Error {
  /** The gRPC status the error travels as. */
  readonly code: status = status.INTERNAL;
  /** 0 when the host gave no retry hint. */
  readonly retryAfterMs: number;
  constructor(message: string, options: { retryAfterMs?: number } = {}) {
    super(message);
    this.name = new.target.name;
    this.retryAfterMs = options.retryAfterMs ?? 0;
  }
}

function errorClass(code: status): typeof AgentHostError {
  return class extends AgentHostError {
    override readonly code = code;
  };
}

export class InvalidArgument extends errorClass(status.INVALID_ARGUMENT) {}
export class NotFound extends errorClass(status.NOT_FOUND) {}
export class AlreadyExists extends errorClass(status.ALREADY_EXISTS) {}
export class PermissionDenied extends errorClass(status.PERMISSION_DENIED) {}
export class Unauthenticated extends errorClass(status.UNAUTHENTICATED) {}
export class FailedPrecondition extends errorClass(status.FAILED_PRECONDITION) {}
export class ResourceExhausted extends errorClass(status.RESOURCE_EXHAUSTED) {}
export class OutOfRange extends errorClass(status.OUT_OF_RANGE) {}
/** Optimistic-concurrency conflict (a state write whose ifVersion is stale). */
export class Aborted extends errorClass(status.ABORTED) {}
export class DeadlineExceeded extends errorClass(status.DEADLINE_EXCEEDED) {}
export class Unavailable extends errorClass(status.UNAVAILABLE) {}
export class Cancelled extends errorClass(status.CANCELLED) {}
export class Internal extends errorClass(status.INTERNAL) {}

const BY_STATUS = new Map<status, new (message: string, options?: { retryAfterMs?: number }) => AgentHostError>([
  [status.INVALID_ARGUMENT, InvalidArgument],
  [status.NOT_FOUND, NotFound],
  [status.ALREADY_EXISTS, AlreadyExists],
  [status.PERMISSION_DENIED, PermissionDenied],
  [status.UNAUTHENTICATED, Unauthenticated],
  [status.FAILED_PRECONDITION, FailedPrecondition],
  [status.RESOURCE_EXHAUSTED, ResourceExhausted],
  [status.OUT_OF_RANGE, OutOfRange],
  [status.ABORTED, Aborted],
  [status.DEADLINE_EXCEEDED, DeadlineExceeded],
  [status.UNAVAILABLE, Unavailable],
  [status.CANCELLED, Cancelled],
  [status.INTERNAL, Internal],
]);

/** The typed error of a status (unknown codes become Internal). */
export function errorFor(code: status, details: string, metadata?: Metadata): AgentHostError {
  const cls = BY_STATUS.get(code) ?? Internal;
  let retryAfterMs = 0;
  const hint = metadata?.get(RETRY_AFTER_KEY)[0];
  if (typeof hint === "string" && /^\d+$/.test(hint)) retryAfterMs = Number(hint);
  return new cls(details || status[code] || "UNKNOWN", { retryAfterMs });
}

/** Maps a failed call back to its typed error. */
export function fromServiceError(err: ServiceError | Error): AgentHostError {
  if (err instanceof AgentHostError) return err;
  const e = err as Partial<ServiceError>;
  if (typeof e.code === "number") return errorFor(e.code, e.details ?? err.message, e.metadata);
  return new Internal(err.message);
}

/** The snake_case name of a status, as the `host_<code>` failure codes spell it ("not_found"). */
export function statusName(code: status): string {
  return (status[code] ?? "unknown").toLowerCase();
}
