// The runner side of a plugin process: serves agenthost.v1.Runner and grpc.health.v1 (agenthost.runners.sdk.server).
// One Run RPC per run: the host cancelling it aborts the run's signal; its events go back coalesced, everything
// that piled up since the last send in one RunEventBatch (at most MAX_BATCH events, MAX_BATCH_BYTES bytes), so a
// trickle goes out event by event and a flood in few messages, without waiting on a timer.
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import {
  credentials,
  Server,
  ServerCredentials,
  type ServerWritableStream,
  type ServiceDefinition,
  type UntypedServiceImplementation,
  status,
} from "@grpc/grpc-js";
import { RunAPI } from "./api";
import { AgentHostError, statusName } from "./errors";
import { completed, failed, kindOf, type RunEvent } from "./events";
import { RunEvent as RunEventCodec } from "./gen/agenthost/protos/common";
import { AgentRunAPIProxyClient } from "./gen/agenthost/protos/run_api";
import {
  type DescribeResponse,
  type ListModelsResponse,
  type RunRequest,
  RunnerService,
  type ValidateConfigResponse,
} from "./gen/agenthost/protos/runner";
import { Health, ServingStatus } from "./health";
import { type Runner, type RunnerClass, RunContext } from "./runner";
import {
  CHANNEL_OPTIONS,
  MAX_BATCH,
  MAX_BATCH_BYTES,
  MAX_EVENT_BYTES,
  PROTOCOL_VERSION,
  RUNNER_HEALTH_SERVICE,
  SHORT_TEXT_BYTES,
} from "./wire";

export const SDK_VERSION = "typescript-0.1.0";
/** The batch cut, in events: wire.MAX_BATCH. Benchmarks lower it to compare SDKs at equal batch sizes (as
 * benchmarks/bench-plugin sets the Python SDK's server.MAX_BATCH); runners leave it alone. */
export const batching = { maxEvents: MAX_BATCH };
/** Below the host's own deadline for the call, so the runner's answer says what happened. */
const LIST_MODELS_TIMEOUT_MS = 20_000;

function log(message: string): void {
  process.stderr.write(`${new Date().toISOString()} agenthost.runner ${message.replace(/[\x00-\x08\x0b-\x1f\x7f]/g, "?")}\n`);
}

/** A serialized RunEvent as one `events` entry of a serialized RunEventBatch (agenthost.protos.wire.batch_entry):
 * concatenated entries are a RunEventBatch, so a batch is never re-encoded. */
function batchEntry(event: Uint8Array): Buffer {
  let n = event.length;
  const head: number[] = [0x0a];
  while (n > 0x7f) {
    head.push((n & 0x7f) | 0x80);
    n >>>= 7;
  }
  head.push(n);
  const out = Buffer.allocUnsafe(head.length + event.length);
  out.set(head, 0);
  out.set(event, head.length);
  return out;
}

/** An event (or a string: a text delta) as a batch entry, or the `failed` event replacing one too large. */
function encoded(event: RunEvent | string): Buffer {
  const ev: RunEvent = typeof event === "string" ? { textDelta: { text: event }, seq: 0, createdAt: 0 } : event;
  const data = RunEventCodec.encode(ev).finish();
  if (data.length <= MAX_EVENT_BYTES) return batchEntry(data);
  return encoded(
    failed(
      "event_too_large",
      `RESOURCE_EXHAUSTED: the runner emitted a ${kindOf(ev)} event of ${data.length} bytes; the limit is ` +
        `MAX_EVENT_BYTES = ${MAX_EVENT_BYTES} bytes (put large outputs in an artifact)`,
    ),
  );
}

/** A text delta yielded as a plain string, framed as its batch entry directly: what `encoded(events.text(s))`
 * returns, at a fraction of its cost (no RunEvent object, no generic encoder), because streamed text is most of
 * what runners send. The framing is the wire contract's (agenthost.protos.wire.SHORT_TEXT_BYTES: RunEvent.text_delta
 * and TextDelta.text are both field 1); longer texts take the generated encoder. */
function textEntry(text: string): Buffer {
  const n = Buffer.byteLength(text);
  if (n === 0 || n > SHORT_TEXT_BYTES) return encoded(text);
  const out = Buffer.allocUnsafe(n + 6);
  out[0] = 0x0a; // RunEventBatch.events
  out[1] = n + 4;
  out[2] = 0x0a; // RunEvent.text_delta
  out[3] = n + 2;
  out[4] = 0x0a; // TextDelta.text
  out[5] = n;
  out.write(text, 6);
  return out;
}

/** Encoded events → the Run call, coalesced: what piled up until the producer yields to the event loop goes out
 * as one message (cut at MAX_BATCH / MAX_BATCH_BYTES). `push` returns a promise when the caller must wait (HTTP/2
 * flow control: the host reads slower than the runner produces). */
class Batches {
  private pending: Buffer[] = [];
  private bytes = 0;
  private scheduled = false;
  private blocked: Promise<void> | null = null;

  constructor(private readonly call: ServerWritableStream<RunRequest, Buffer>) {}

  push(entry: Buffer): Promise<void> | null {
    if (
      this.pending.length > 0 &&
      (this.pending.length >= batching.maxEvents || this.bytes + entry.length > MAX_BATCH_BYTES)
    ) {
      this.flush();
    }
    this.pending.push(entry);
    this.bytes += entry.length;
    if (!this.scheduled) {
      this.scheduled = true;
      setImmediate(this.flushScheduled);
    }
    return this.blocked;
  }

  private readonly flushScheduled = (): void => {
    this.scheduled = false;
    this.flush();
  };

  flush(): void {
    if (this.pending.length === 0) return;
    const batch = this.pending.length === 1 ? this.pending[0] : Buffer.concat(this.pending, this.bytes);
    this.pending = [];
    this.bytes = 0;
    if (!this.call.write(batch) && this.blocked === null) {
      this.blocked = new Promise<void>((resolve) =>
        this.call.once("drain", () => {
          this.blocked = null;
          resolve();
        }),
      );
    }
  }
}

/** Runs one runner generator to its terminal event; a throw becomes a `failed` event. Returns at once when `signal`
 * is aborted (the host cancelled the call; nothing more is written), even from a runner that ignores the signal:
 * its generator is then returned, which runs its `finally` when it next resumes. */
async function drive(runner: Runner, run: RunContext, out: Batches, signal: AbortSignal): Promise<void> {
  let onAbort: (() => void) | undefined;
  // One race for the whole run: a race per event would pile a reaction per event onto the abort's promise.
  const aborted = new Promise<void>((resolve) => {
    onAbort = () => resolve();
    if (signal.aborted) resolve();
    else signal.addEventListener("abort", onAbort, { once: true });
  });
  const iterator = runner.run(run)[Symbol.asyncIterator]();
  try {
    await Promise.race([pump(runner, run, iterator, out, signal, aborted), aborted]);
  } finally {
    signal.removeEventListener("abort", onAbort!);
    // The generator's own `finally` runs now (or when it next resumes), not whenever the garbage collector gets to it.
    if (iterator.return) void Promise.resolve(iterator.return()).catch(() => undefined);
  }
}

async function pump(
  runner: Runner,
  run: RunContext,
  iterator: AsyncIterator<RunEvent | string>,
  out: Batches,
  signal: AbortSignal,
  aborted: Promise<void>,
): Promise<void> {
  try {
    for (;;) {
      const next = await iterator.next();
      if (signal.aborted) return;
      if (next.done) break;
      const event = next.value;
      let wait: Promise<void> | null;
      if (typeof event === "string") {
        wait = out.push(textEntry(event));
      } else if (event !== null && typeof event === "object") {
        wait = out.push(encoded(event));
        if (event.completed !== undefined || event.failed !== undefined) return;
      } else {
        throw new TypeError(
          `${runner.constructor.name}.run yielded a ${typeof event}; a runner yields RunEvents (made with events.*) or a string for a text delta`,
        );
      }
      if (wait !== null) {
        await Promise.race([wait, aborted]);
        if (signal.aborted) return;
      }
    }
    out.push(encoded(completed()));
  } catch (err) {
    if (signal.aborted) return;
    if (err instanceof AgentHostError) {
      out.push(encoded(failed(`host_${statusName(err.code)}`, err.message)));
    } else {
      const e = err as Error;
      log(`runner ${(runner.constructor as RunnerClass).manifest.name} failed in run ${run.runId}: ${e?.stack ?? e}`);
      out.push(encoded(failed("runner_error", `${e?.name ?? "Error"}: ${e?.message ?? String(err)}`)));
    }
  }
}

export interface ServeOptions {
  pluginId: string;
  listen: string;
  hostAddress: string;
  pluginSecret: string;
  dataDir: string;
  /** Resolves when the host asks the process to stop (SIGTERM, SIGINT, the lifeline's EOF). */
  stop: Promise<void>;
  /** Write the handshake line on stdout once serving (the spawn protocol), then point stdout at stderr. */
  handshake?: boolean;
  /** Called once the process serves. */
  ready?: () => void;
}

/** Serves until `stop` resolves or the host calls Shutdown; then health NOT_SERVING, runs aborted, the server
 * stopped within a second, and the runners closed. */
export async function serve(classes: RunnerClass[], options: ServeOptions): Promise<void> {
  const runners = new Map<string, Runner>();
  const described: string[] = [];
  for (const cls of classes) {
    const name = cls.manifest.name;
    const dir = join(options.dataDir, name);
    mkdirSync(dir, { recursive: true });
    const runner = new cls(dir);
    await runner.setup(); // before serving: a failing setup is a failed start
    runners.set(name, runner);
    described.push(JSON.stringify(cls.manifest));
  }
  let shutdown!: () => void;
  const stopped = new Promise<void>((resolve) => (shutdown = resolve));
  options.stop.then(shutdown, shutdown);

  const client = new AgentRunAPIProxyClient(options.hostAddress, credentials.createInsecure(), CHANNEL_OPTIONS);
  const active = new Set<AbortController>();
  const drives = new Set<Promise<void>>();

  const unknown = (name: string) => ({ code: status.NOT_FOUND, details: `this plugin has no runner ${JSON.stringify(name)}` });

  const impl: UntypedServiceImplementation = {
    describe: (_call: unknown, callback: (err: null, res: DescribeResponse) => void) =>
      callback(null, {
        pluginId: options.pluginId,
        sdkVersion: SDK_VERSION,
        protocolVersion: PROTOCOL_VERSION,
        manifestsJson: described,
        entryPoints: {}, // none: the host keeps no description of a plugin that names no entry points
      }),
    validateConfig: async (call: { request: { runnerName: string; configJson: string } }, callback: Function) => {
      const runner = runners.get(call.request.runnerName);
      if (!runner) return callback(unknown(call.request.runnerName));
      let problems: string[];
      try {
        problems = (await runner.validateConfig(JSON.parse(call.request.configJson || "{}"))).map(String);
      } catch (err) {
        // A check that crashes has not accepted the config: refuse it, with the reason, rather than fail open.
        problems = [`the runner could not check this config: ${(err as Error)?.name}: ${(err as Error)?.message}`];
      }
      callback(null, { problems } satisfies ValidateConfigResponse);
    },
    listModels: async (
      call: { request: { runnerName: string; configJson: string; secrets: Record<string, string> } },
      callback: Function,
    ) => {
      const runner = runners.get(call.request.runnerName);
      if (!runner) return callback(unknown(call.request.runnerName));
      let timer: NodeJS.Timeout | undefined;
      try {
        const timeout = new Promise<"timeout">((resolve) => (timer = setTimeout(() => resolve("timeout"), LIST_MODELS_TIMEOUT_MS)));
        const found = await Promise.race([runner.listModels(JSON.parse(call.request.configJson || "{}"), { ...call.request.secrets }), timeout]);
        if (found === "timeout") {
          return callback(null, { models: [], error: `the runner did not list its models within ${LIST_MODELS_TIMEOUT_MS / 1000}s` });
        }
        const models = (found ?? []).map((m) => ({
          provider: String(m.provider ?? ""),
          model: String(m.model ?? ""),
          baseUrl: String(m.base_url ?? ""),
          error: String(m.error ?? ""),
        }));
        callback(null, { models, error: "" } satisfies ListModelsResponse);
      } catch (err) {
        callback(null, { models: [], error: `the runner could not list models: ${(err as Error)?.name}: ${(err as Error)?.message}` });
      } finally {
        clearTimeout(timer);
      }
    },
    shutdown: (_call: unknown, callback: Function) => {
      callback(null, {});
      shutdown();
    },
    run: (call: ServerWritableStream<RunRequest, Buffer>) => {
      const request = call.request;
      const runner = runners.get(request.runnerName);
      if (!runner) {
        call.emit("error", unknown(request.runnerName));
        return;
      }
      const context = request.context!;
      const abort = new AbortController();
      active.add(abort);
      call.on("cancelled", () => abort.abort(new Error("the run was cancelled")));
      const api = new RunAPI(client, {
        runId: context.runId,
        runToken: request.runToken,
        pluginSecret: options.pluginSecret,
        deadlineAt: context.runtime?.deadlineAt ?? 0,
      });
      const run = new RunContext(context, api, abort.signal, runner.dataDir, request.toolToken, { ...request.secrets });
      const out = new Batches(call);
      const driven = drive(runner, run, out, abort.signal).finally(() => {
        active.delete(abort);
        drives.delete(driven);
        if (!abort.signal.aborted) {
          out.flush();
          call.end();
        }
      });
      drives.add(driven);
    },
  };
  // Run's batches leave `Batches` encoded already: its serializer passes them through.
  const definition = {
    ...RunnerService,
    run: { ...RunnerService.run, responseSerialize: (batch: Buffer) => batch },
  } as unknown as ServiceDefinition;

  const server = new Server({
    ...CHANNEL_OPTIONS,
    "grpc.max_connection_idle_ms": 5 * 60 * 1000,
  });
  const health = new Health();
  health.addTo(server);
  server.addService(definition, impl);
  await new Promise<void>((resolve, reject) =>
    server.bindAsync(options.listen, ServerCredentials.createInsecure(), (err) =>
      err ? reject(new Error(`could not listen on ${options.listen}: ${err.message}`)) : resolve(),
    ),
  );
  try {
    health.set("", ServingStatus.SERVING);
    health.set(RUNNER_HEALTH_SERVICE, ServingStatus.SERVING);
    if (options.handshake) {
      process.stdout.write(`AGENTHOST|${PROTOCOL_VERSION}|${options.listen}\n`);
      // A stray print must never be mistaken for protocol: from here on, stdout is stderr.
      process.stdout.write = process.stderr.write.bind(process.stderr) as typeof process.stdout.write;
    }
    options.ready?.();
    await stopped;
  } finally {
    health.enterGracefulShutdown();
    for (const abort of active) abort.abort(new Error("the runner process is stopping"));
    await Promise.race([Promise.allSettled([...drives]), new Promise((r) => setTimeout(r, 1000))]);
    await new Promise<void>((resolve) => {
      const force = setTimeout(() => {
        server.forceShutdown();
        resolve();
      }, 1000);
      server.tryShutdown(() => {
        clearTimeout(force);
        resolve();
      });
    });
    client.close();
    for (const runner of runners.values()) await runner.close().catch(() => undefined);
  }
}
