// The TypeScript side of benchmarks/bench_typescript_sdk.py, the twin of benchmarks/bench-plugin (Python). Command
// (the message text): `deltas <n> <batch>` streams n ~50-byte text deltas, yielded as strings, at most <batch>
// per gRPC message.
import { type RunContext, Runner, batching, main } from "@agenthost/runner-sdk";

const DELTA = "x".repeat(48) + " \n";

class Bench extends Runner {
  static manifest = { name: "bench", description: "benchmark helper" };

  async *run(run: RunContext) {
    const [command, n, batch] = run.text.split(/\s+/);
    if (command !== "deltas") throw new Error(`unknown command ${command}`);
    batching.maxEvents = Number(batch);
    for (let i = Number(n); i > 0; i--) yield DELTA;
  }
}

main([Bench]);
