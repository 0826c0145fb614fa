// Recording a subagent as a child run of the current run (the run API's ChildRun call), as the Python SDK's
// agenthost.runners.sdk.child does it:
//
//   const result = await run.childRun("look for the config loader", { subagentType: "explore" }, async (child) => {
//     await child.emit(events.text("found it"));
//   });
//
// The host gives the child its own run id and a deadline no later than the run's. `body` returning ends the child
// as completed (unless it emitted a terminal event), a throw ends it as failed and is rethrown. When the host ends
// the child first (a cancel request, the parent run's end, its deadline), `emit` and the end reject with Cancelled
// (cancelled, interrupted) or DeadlineExceeded (timed_out); an `emit` after the host failed the child rejects with
// FailedPrecondition. The host tells every end in-band, as the call's last reply (ChildRunFinished).
import type { ClientDuplexStream, ServiceError, StatusObject } from "@grpc/grpc-js";
import { status as grpcStatus } from "@grpc/grpc-js";
import { AgentHostError, Cancelled, DeadlineExceeded, FailedPrecondition, Internal, errorFor, fromServiceError } from "./errors";
import { completed, failed, isTerminal, type RunEvent } from "./events";
import type { ChildRunFinished, ChildRunHeader, ChildRunReply, ChildRunRequest } from "./gen/agenthost/protos/run_api";

export interface ChildRunOptions {
  subagentType?: string;
  toolCallId?: string;
  /** Seconds; ends the child before the run's own deadline, never after. */
  timeout?: number;
}

const HOST_ENDED: Record<string, new (message: string) => AgentHostError> = {
  cancelled: Cancelled,
  interrupted: Cancelled,
  timed_out: DeadlineExceeded,
};

type Reply = ChildRunReply | AgentHostError;

/** Replies in arrival order; an error or the call's end without a reply is an AgentHostError. */
class Replies {
  private queue: Reply[] = [];
  private waiting: ((reply: Reply) => void) | null = null;
  private ended = false;

  constructor(call: ClientDuplexStream<ChildRunRequest, ChildRunReply>) {
    call.on("data", (reply: ChildRunReply) => this.put(reply));
    call.on("error", (err: ServiceError) => this.put(fromServiceError(err)));
    call.on("status", (status: StatusObject) => {
      this.put(status.code === grpcStatus.OK ? new Internal("the host ended the call without a reply") : errorFor(status.code, status.details, status.metadata));
    });
  }

  private put(reply: Reply): void {
    if (this.ended) return;
    if (reply instanceof AgentHostError) this.ended = true;
    const waiting = this.waiting;
    if (waiting) {
      this.waiting = null;
      waiting(reply);
    } else this.queue.push(reply);
  }

  next(): Promise<Reply> {
    const reply = this.queue.shift();
    if (reply !== undefined) return Promise.resolve(reply);
    return new Promise((resolve) => (this.waiting = resolve));
  }
}

export class ChildRun {
  /** A terminal event was emitted. */
  ended = false;
  /** The host's record of the child's end, once it ended. */
  result: ChildRunFinished | undefined;
  private readonly end: Promise<ChildRunFinished | AgentHostError>;
  private endValue: ChildRunFinished | AgentHostError | undefined;

  constructor(
    private readonly call: ClientDuplexStream<ChildRunRequest, ChildRunReply>,
    replies: Replies,
    readonly runId: string,
    readonly deadlineAt: number,
  ) {
    this.end = replies.next().then((reply) => {
      let value: ChildRunFinished | AgentHostError;
      if (reply instanceof AgentHostError) value = reply;
      else if (reply.finished) value = this.result = reply.finished;
      else value = new Internal("the host sent 'started' where a child run's end belongs");
      this.endValue = value;
      return value;
    });
  }

  private endedError(end: ChildRunFinished | AgentHostError): AgentHostError {
    if (end instanceof AgentHostError) return end;
    let why = `child run ${this.runId} ended ${end.status}` + (end.errorCode ? ` (${end.errorCode})` : "");
    if (end.errorMessage) why += `: ${end.errorMessage}`;
    return new (HOST_ENDED[end.status] ?? FailedPrecondition)(why);
  }

  /** Sends the child's events (any kinds a run streams, ending with one completed | failed). */
  async emit(...events: RunEvent[]): Promise<void> {
    if (this.ended) throw new FailedPrecondition(`child run ${this.runId} has ended`);
    if (this.endValue !== undefined) throw this.endedError(this.endValue);
    if (events.some(isTerminal)) this.ended = true;
    const ok = this.call.write({ events: { events } });
    if (!ok) await new Promise<void>((resolve) => this.call.once("drain", resolve));
    // Give a reply the host sent at once (a refusal of these events) the chance to be seen by the next emit.
    await new Promise<void>((resolve) => setImmediate(resolve));
  }

  /** Half-closes and takes the host's end: sets `result`, or rejects if the host ended the child itself. */
  async close(): Promise<void> {
    if (this.endValue === undefined) this.call.end();
    const end = await this.end;
    if (end instanceof AgentHostError) throw end;
    if (end.status in HOST_ENDED) throw this.endedError(end);
  }

  /** Whether the host has told the child's end. */
  get hostEnded(): boolean {
    return this.endValue !== undefined;
  }
}

export async function openChildRun<T>(
  call: ClientDuplexStream<ChildRunRequest, ChildRunReply>,
  header: ChildRunHeader,
  body: (child: ChildRun) => Promise<T>,
): Promise<T> {
  const replies = new Replies(call);
  let child: ChildRun;
  try {
    call.write({ header });
    const first = await replies.next();
    if (first instanceof AgentHostError) throw first;
    if (!first.started) throw new Internal("the host's first reply to ChildRun was not 'started'");
    child = new ChildRun(call, replies, first.started.childRunId, first.started.deadlineAt);
  } catch (err) {
    call.cancel();
    throw err;
  }
  try {
    let value: T;
    try {
      value = await body(child);
    } catch (err) {
      if (!child.ended && !child.hostEnded) {
        const message = `${(err as Error)?.name ?? "Error"}: ${(err as Error)?.message ?? String(err)}`.slice(0, 2000);
        await child.emit(failed("runner_error", message)).catch(() => undefined);
      }
      await child.close().catch(() => undefined);
      throw err;
    }
    if (!child.ended && !child.hostEnded) {
      await child.emit(completed("stop")).catch(() => undefined); // the host ended it meanwhile: read below
    }
    await child.close();
    return value;
  } finally {
    call.cancel(); // no-op once the call ended; frees it otherwise
  }
}
