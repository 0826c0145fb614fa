// Generates src/gen/ from the repository's protos/ (the one source of the wire contract) and gRPC's standard
// health.proto (shipped in the grpc-health-check package), with ts-proto run by buf: no hand-written protobuf, and
// nothing generated is committed, so the TypeScript code can never drift from the .proto files.
import { cpSync, mkdirSync, readdirSync, rmSync } from "node:fs";
import { createRequire } from "node:module";
import { execFileSync } from "node:child_process";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const pkg = resolve(here, "..");
const repo = resolve(pkg, "../../..");
const require = createRequire(import.meta.url);
const scratch = join(pkg, "build", "proto");
rmSync(join(pkg, "build"), { recursive: true, force: true });
// The .proto files import each other as agenthost/protos/*.proto, the path they have in the installed package.
mkdirSync(join(scratch, "agenthost", "protos"), { recursive: true });
for (const name of readdirSync(join(repo, "protos")).filter((n) => n.endsWith(".proto"))) {
  cpSync(join(repo, "protos", name), join(scratch, "agenthost", "protos", name));
}
const health = join(dirname(require.resolve("grpc-health-check/package.json")), "proto", "health", "v1");
cpSync(health, join(scratch, "grpc", "health", "v1"), { recursive: true });

const out = join(pkg, "src", "gen");
rmSync(out, { recursive: true, force: true });
const template = {
  version: "v2",
  plugins: [
    {
      local: ["node", require.resolve("ts-proto/protoc-gen-ts_proto")],
      out,
      opt: [
        "outputServices=grpc-js",
        "esModuleInterop=true",
        "env=node",
        "forceLong=number",
        "outputJsonMethods=false",
        "useOptionals=messages",
      ],
    },
  ],
};
const buf = require.resolve("@bufbuild/buf/bin/buf");
execFileSync(process.execPath, [buf, "generate", scratch, "--template", JSON.stringify(template)], {
  stdio: "inherit",
  cwd: pkg,
});
