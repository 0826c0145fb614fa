// The plugin process's side of the host's spawn protocol, as agenthost.plugins.plugin_process states it:
//
//   node main.js serve      what the host's supervisor spawns: one JSON configuration line on stdin (plugin_id,
//                           distribution, listen, host, secret, data_dir); a bad line is said on stderr and the
//                           process exits 2. It serves the Runner and health services on `listen`, writes the
//                           handshake line `AGENTHOST|1|<listen>` on stdout, and serves until SIGTERM, SIGINT or
//                           the lifeline (EOF on stdin: only the host holds the pipe's write end) or Shutdown.
//   node main.js describe   the runners' manifests as one JSON line (the host's install-time check); a plugin whose
//                           runners cannot be described exits 3 with {"error"}.
import { readSync } from "node:fs";
import { Socket } from "node:net";
import type { RunnerClass } from "./runner";
import { serve } from "./server";
import { EXIT_BAD_CONFIG, EXIT_DISCOVERY } from "./wire";

const REQUIRED = ["plugin_id", "distribution", "listen", "host", "secret", "data_dir"] as const;
type Config = Record<(typeof REQUIRED)[number], string>;

/** The configuration line, read from the raw descriptor: nothing may sit in a buffer, because what follows on stdin
 * is only the lifeline's EOF. */
export function readConfigLine(fd = 0): Config {
  const chunks: Buffer[] = [];
  const chunk = Buffer.alloc(65536);
  for (;;) {
    let n: number;
    try {
      n = readSync(fd, chunk, 0, chunk.length, null);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === "EAGAIN") {
        Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 10);
        continue;
      }
      throw err;
    }
    if (n === 0) break;
    chunks.push(Buffer.from(chunk.subarray(0, n)));
    if (chunk.subarray(0, n).includes(0x0a)) break;
  }
  const line = Buffer.concat(chunks).toString("utf8").split("\n", 1)[0];
  const config: unknown = JSON.parse(line);
  if (config === null || typeof config !== "object" || Array.isArray(config)) throw new Error("not a JSON object");
  for (const key of REQUIRED) {
    if (typeof (config as Record<string, unknown>)[key] !== "string") throw new Error(`KeyError: '${key}'`);
  }
  return config as Config;
}

/** Resolves when the host asks the process to stop: SIGTERM or SIGINT (the supervisor's stop), or EOF on stdin
 * (the host died or let go of us, kill -9 included). Installed before anything that can take long, so a stop that
 * comes meanwhile is kept, not lost to the default handler's kill. */
export function hostStop(fd = 0): Promise<void> {
  return new Promise<void>((resolve) => {
    process.once("SIGTERM", () => resolve());
    process.once("SIGINT", () => resolve());
    try {
      const lifeline = new Socket({ fd, readable: true, writable: false });
      lifeline.on("data", () => undefined);
      lifeline.on("end", () => resolve());
      lifeline.on("error", () => resolve());
      lifeline.unref(); // the lifeline alone must not keep a finished process alive
    } catch {
      // Not a pipe (a terminal, a file): there is no host holding it, so no lifeline to watch.
    }
  });
}

function checkManifests(classes: RunnerClass[]): void {
  const names = new Set<string>();
  if (classes.length === 0) throw new Error("the plugin registered no runners");
  for (const cls of classes) {
    const name = cls.manifest?.name;
    if (typeof name !== "string") throw new Error(`${cls.name} has no \`static manifest = { name: ... }\``);
    if (names.has(name)) throw new Error(`two runners are named ${JSON.stringify(name)}`);
    names.add(name);
  }
}

/** The command line of a runner plugin: `serve` (what the host spawns) or `describe`. Call it from the plugin's
 * entry file: `main([MyRunner])`. Exits the process when done. */
export function main(classes: RunnerClass[], argv: string[] = process.argv.slice(2)): void {
  if (argv.length === 1 && argv[0] === "describe") {
    try {
      checkManifests(classes);
    } catch (err) {
      process.stdout.write(JSON.stringify({ error: (err as Error).message }) + "\n");
      process.exit(EXIT_DISCOVERY);
    }
    process.stdout.write(JSON.stringify({ runners: classes.map((cls) => cls.manifest) }) + "\n");
    return;
  }
  if (argv.length !== 1 || argv[0] !== "serve") {
    process.stderr.write("usage: main.js serve | describe\n");
    process.exit(EXIT_BAD_CONFIG);
  }
  let config: Config;
  try {
    config = readConfigLine();
  } catch (err) {
    process.stderr.write(`agenthost runner: bad configuration line on stdin: ${(err as Error).message}\n`);
    process.exit(EXIT_BAD_CONFIG);
  }
  const stop = hostStop();
  try {
    checkManifests(classes);
  } catch (err) {
    process.stderr.write(`agenthost runner: ${(err as Error).message}\n`);
    process.exit(EXIT_DISCOVERY);
  }
  serve(classes, {
    pluginId: config.plugin_id,
    listen: config.listen,
    hostAddress: config.host,
    pluginSecret: config.secret,
    dataDir: config.data_dir,
    stop,
    handshake: true,
  }).then(
    () => process.exit(0),
    (err) => {
      process.stderr.write(`agenthost runner: ${(err as Error)?.stack ?? err}\n`);
      process.exit(1);
    },
  );
}
