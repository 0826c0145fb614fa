#!/usr/bin/env bash
# Installs the pinned real harness CLIs (Claude Code, Codex) into a repo-local npm prefix for the
# external-harness end-to-end tests and benchmark. Idempotent: exits in milliseconds when the pinned
# versions are already there.
#
# Pins matter: on node < 22 an unpinned `npm install @anthropic-ai/claude-code` silently picks an old
# release (newer ones declare engines.node >= 22 although the shipped binary does not use node at run time).
set -euo pipefail

CLAUDE_VERSION="2.1.332"
CODEX_VERSION="0.169.0"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PREFIX="${AGENTHOST_HARNESS_PREFIX:-$ROOT/.tools/npm}"

installed_version() {  # $1 = package name; prints the installed version or nothing
  local pkg_json="$PREFIX/node_modules/$1/package.json"
  [ -f "$pkg_json" ] && sed -n 's/^[[:space:]]*"version":[[:space:]]*"\([^"]*\)".*/\1/p' "$pkg_json" | head -n1
}

need=()
[ "$(installed_version @anthropic-ai/claude-code)" = "$CLAUDE_VERSION" ] && [ -x "$PREFIX/node_modules/.bin/claude" ] \
  || need+=("@anthropic-ai/claude-code@$CLAUDE_VERSION")
[ "$(installed_version @openai/codex)" = "$CODEX_VERSION" ] && [ -x "$PREFIX/node_modules/.bin/codex" ] \
  || need+=("@openai/codex@$CODEX_VERSION")

if [ "${#need[@]}" -eq 0 ]; then
  echo "harness CLIs already installed in $PREFIX"
else
  command -v npm >/dev/null || { echo "npm is required to install ${need[*]}" >&2; exit 1; }
  echo "installing ${need[*]} into $PREFIX"
  mkdir -p "$PREFIX"
  # Both pins every time, recorded in the prefix's package.json, so npm never prunes one as extraneous.
  # EBADENGINE warnings on node < 22 are expected: the shipped binaries do not run on node.
  npm install --prefix "$PREFIX" --save-exact --no-audit --no-fund --loglevel=error \
    "@anthropic-ai/claude-code@$CLAUDE_VERSION" "@openai/codex@$CODEX_VERSION"
fi

# Claude Code's postinstall swaps its 500-byte stub for the platform binary; if scripts were skipped
# (npm config ignore-scripts), run that step now.
if ! "$PREFIX/node_modules/.bin/claude" --version >/dev/null 2>&1; then
  (cd "$PREFIX/node_modules/@anthropic-ai/claude-code" && node install.cjs)
fi
"$PREFIX/node_modules/.bin/claude" --version >/dev/null
"$PREFIX/node_modules/.bin/codex" --version >/dev/null
echo "claude: $PREFIX/node_modules/.bin/claude ($("$PREFIX/node_modules/.bin/claude" --version))"
echo "codex:  $PREFIX/node_modules/.bin/codex ($("$PREFIX/node_modules/.bin/codex" --version))"
