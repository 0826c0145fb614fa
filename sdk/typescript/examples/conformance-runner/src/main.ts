// The conformance suite's runner on the TypeScript SDK: the twin of tests/conformance/py_runner.py (whose docstring
// lists the steps). Both obey the same script, carried in the run's input text as JSON {"steps": [...]}, and end
// with one message whose text is the JSON list of what each step observed.
import { createHash } from "node:crypto";
import { RunAPI, type RunContext, Runner, type Scope, errors, events, main, sleep } from "@agenthost/runner-sdk";

type Step = Record<string, any>;

async function rejected(run: RunContext, kase: string): Promise<{ error: string | null }> {
  const api = run.api;
  const other = (runId = api.runId, runToken = api.runToken) =>
    new RunAPI(api.client, { runId, runToken, pluginSecret: api.pluginSecret, deadlineAt: run.deadlineAt });
  const calls: Record<string, () => Promise<unknown>> = {
    bad_token: () => other(api.runId, "rt_not_a_token").stateGet("run", "k"),
    other_run: () => other("run_000000000000").stateGet("run", "k"),
    foreign_conversation: () => api.historyPage({ conversationId: "someone-elses" }),
    limit_out_of_range: () => api.historyPage({ limit: 1000 }),
    stale_version: () => api.stateSet("conversation", "cas", 1, { ifVersion: 987654 }),
    missing_artifact: () => api.artifactMetadata("art_doesnotexist"),
    empty_tool_name: () => api.requestApproval(""),
    state_write_not_granted: () => api.stateSet("conversation", "k", 1),
  };
  try {
    await calls[kase]();
  } catch (err) {
    if (err instanceof errors.AgentHostError) return { error: err.name };
    throw err;
  }
  return { error: null };
}

class Conformance extends Runner {
  static manifest = { name: "conformance", description: "Obeys the conformance suite's scripts" };

  override validateConfig(config: Record<string, unknown>): string[] {
    return "refuse" in config ? [`refuse: ${config.refuse}`] : [];
  }

  override async listModels(config: Record<string, unknown>) {
    return [{ provider: "conformance", model: String(config.model ?? "m1") }];
  }

  async *run(run: RunContext) {
    const observed: unknown[] = [];
    const api = run.api;
    for (const step of JSON.parse(run.text).steps as Step[]) {
      const scope = step.scope as Scope;
      switch (step.op) {
        case "deltas":
          for (let i = 0; i < step.n; i++) yield step.text as string;
          observed.push(step.n);
          break;
        case "tool":
          yield events.toolStarted(step.id, step.name, { x: 1 });
          yield events.toolFinished(step.id, step.name, "ok");
          observed.push("tool");
          break;
        case "state_set":
          try {
            observed.push({ version: await api.stateSet(scope, step.key, step.value, { ifVersion: step.if_version ?? undefined }) });
          } catch (err) {
            if (!(err instanceof errors.AgentHostError)) throw err;
            observed.push({ error: err.name });
          }
          break;
        case "state_get": {
          const value = await api.stateGetVersioned(scope, step.key);
          observed.push({ found: value.found, value: value.found ? JSON.parse(value.valueJson) : null, version: value.version });
          break;
        }
        case "state_delete":
          observed.push({ deleted: await api.stateDelete(scope, step.key) });
          break;
        case "state_list":
          observed.push({ keys: (await api.stateList(scope, { prefix: step.prefix ?? "" })).keys });
          break;
        case "history": {
          const page = await api.historyPage({ limit: step.limit ?? 50, direction: step.direction ?? "backward" });
          observed.push({ items: page.items.map((i) => [i.role, i.text]), has_more: page.hasMore });
          break;
        }
        case "history_search":
          observed.push({ texts: (await api.historySearch(step.query)).map((i) => i.text) });
          break;
        case "event_get_trigger": {
          const event = await api.eventGet(run.context.event!.eventId);
          observed.push({ type: event.eventType, text: event.text });
          break;
        }
        case "event_page":
          observed.push({ types: (await api.eventPage({ limit: step.limit ?? 50 })).events.map((e) => e.eventType) });
          break;
        case "artifact": {
          const data = Buffer.from(step.data as string);
          const ref = await api.artifactCreate(data, { name: step.name, mimeType: step.mime });
          yield events.artifactCreated(ref);
          const meta = await api.artifactMetadata(ref.artifactId);
          const read = await api.artifactReadAll(ref.artifactId);
          const chunk = await api.artifactReadRange(ref.artifactId, 1, 3);
          observed.push({
            name: meta.name,
            mime: meta.mimeType,
            size: meta.sizeBytes,
            sha256: meta.sha256 === createHash("sha256").update(data).digest("hex"),
            read: read.toString(),
            range: Buffer.from(chunk.data).toString(),
          });
          break;
        }
        case "approval": {
          const decision = await run.requestApproval(step.tool, { summary: step.summary ?? "", timeoutSeconds: step.timeout ?? 0 });
          observed.push({ outcome: decision.outcome, approved: decision.approved, note: decision.note });
          break;
        }
        case "child": {
          let status = "";
          await run.childRun(step.description, { subagentType: "conformance" }, async (child) => {
            await child.emit(events.text(step.text), events.message(step.text));
            return child;
          }).then((child) => (status = child.result?.status ?? ""));
          observed.push({ status });
          break;
        }
        case "child_timeout":
          try {
            await run.childRun("slow", { timeout: step.timeout }, async (child) => {
              await sleep((step.timeout + 1.5) * 1000);
              await child.emit(events.text("too late"));
            });
            observed.push({ error: null });
          } catch (err) {
            if (!(err instanceof errors.AgentHostError)) throw err;
            observed.push({ error: err.name });
          }
          break;
        case "park":
          yield events.progress("parked");
          await sleep(3600_000, run.signal);
          break;
        case "kb_search": {
          const found = await api.kbSearch(step.query);
          observed.push({ hits: found.hits.length, keyword_only: found.keywordOnly });
          break;
        }
        case "reject":
          observed.push(await rejected(run, step.case));
          break;
        case "fail":
          throw new Error(step.message);
        default:
          throw new Error(`unknown op ${JSON.stringify(step.op)}`);
      }
    }
    yield events.message(JSON.stringify(observed));
  }
}

main([Conformance]);
