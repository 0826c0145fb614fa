#!/usr/bin/env bash
# Installs and builds the TypeScript runner SDK's npm workspace (sdk/typescript) inside the repository: `npm ci`
# from the committed package-lock.json into sdk/typescript/node_modules (no root, nothing global), then
# `npm run build` (protobuf code generated from protos/, the SDK compiled, the example runners bundled).
# Without Node.js 18+ and npm it says what is missing and exits 0: the TypeScript tests then skip, saying why.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORKSPACE="$ROOT/sdk/typescript"

missing=""
if ! command -v node >/dev/null; then
  missing="node is not on PATH"
elif ! node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 18 ? 0 : 1)'; then
  missing="node $(node --version) is older than 18"
elif ! command -v npm >/dev/null; then
  missing="npm is not on PATH"
fi
if [ -n "$missing" ]; then
  echo "TypeScript SDK not built: $missing. Install Node.js 18 or newer with npm (Debian: apt-get install nodejs npm;" \
    "or from https://nodejs.org) to run its tests; they are skipped until then." >&2
  exit 0
fi

cd "$WORKSPACE"
if [ ! -f node_modules/.package-lock.json ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  npm ci --no-audit --no-fund
fi
npm run build --silent
echo "TypeScript SDK built in $WORKSPACE (node $(node --version))"
