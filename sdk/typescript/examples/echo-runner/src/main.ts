// An agenthost runner plugin in TypeScript: it answers with what you said, counts the turns of the conversation in
// its state (compare-and-set, so two runs never lose a count), and streams the answer word by word.
//
//   npm run build                        # dist/main.js: one file, the SDK and @grpc/grpc-js bundled in
//   agenthost plugins install .          # package.json's "agenthost" names the command: node dist/main.js
import { type RunContext, Runner, errors, events, main } from "@agenthost/runner-sdk";

class Echo extends Runner {
  static manifest = {
    name: "echo",
    description: "Repeats you, word by word, and counts the turns",
    config_schema: { type: "object", properties: { prefix: { type: "string" } }, additionalProperties: false },
  };

  async *run(run: RunContext) {
    const page = await run.api.historyPage({ limit: 20 }); // pull the history you need; none is inlined
    // Compare-and-set: retried when another run of the conversation wrote in between.
    let turns = 0;
    for (;;) {
      const current = await run.api.stateGetVersioned("conversation", "turns");
      turns = (current.found ? Number(JSON.parse(current.valueJson)) : 0) + 1;
      try {
        await run.api.stateSet("conversation", "turns", turns, { ifVersion: current.version });
        break;
      } catch (err) {
        if (!(err instanceof errors.Aborted)) throw err;
      }
    }
    yield events.stateUpdated("conversation", "turns");
    const prefix = typeof run.config.prefix === "string" ? run.config.prefix : "";
    const words = `${prefix}${run.text}`.split(/(?<= )/);
    for (const word of words) yield word; // a string is a text delta; the SDK coalesces them
    yield events.message(`${prefix}${run.text}`);
    yield events.usage(0, words.length, { model: `echo (turn ${turns}, ${page.items.length} earlier items seen)` });
  }
}

main([Echo]);
