#!/usr/bin/env bash
# The new user's path, from a wheel, far from the checkout: build the wheel once, then for the lowest and the
# highest supported Python (3.11, 3.13) install it into a fresh venv in a scratch directory and run
#   agenthost --version, agenthost demo, agenthost serve, plugins install ./notes-runner --offline (a relative
#   path, the example copied out of the installed package), a bind the runner refuses, a good bind, send,
#   status, runs list --json (checked: it parses, numbers are numbers).
# Nothing from the checkout is importable there: the scratch dir is outside it and PYTHONPATH is cleared.
# Called by .ci/run after `make test`; prints which Python versions were tested and which could not be.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ $# -gt 0 ]; then VERSIONS=("$@"); else VERSIONS=(3.11 3.13); fi
BUILD_PY="${BUILD_PY:-python3}"
[ -x "$ROOT/.venv/bin/python" ] && BUILD_PY="$ROOT/.venv/bin/python"
SCRATCH="$(mktemp -d "${TMPDIR:-/tmp}/agenthost-wheel-check.XXXXXX")"
unset PYTHONPATH PYTHONHOME VIRTUAL_ENV AGENTHOST_HOME ANTHROPIC_API_KEY OPENAI_API_KEY

trap 'rm -rf "$SCRATCH"' EXIT

say() { printf '\n\033[1m$ %s\033[0m\n' "$*"; }

find_python() {  # $1 = "3.13": prints an interpreter of that version, or nothing
  local v="$1" candidate
  for candidate in "python$v" "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$v"*/bin/"python$v" /usr/bin/"python$v" \
    /usr/local/bin/"python$v"; do
    # pyenv's shims exist for versions that are not selected and then fail, so each candidate must really run.
    if "$candidate" -c "import sys, venv; assert sys.version_info[:2] == tuple(map(int, '$v'.split('.')))" \
      >/dev/null 2>&1; then
      command -v "$candidate" || echo "$candidate"
      return 0
    fi
  done
  return 0
}

apt_python() {  # $1 = "3.13": installs python3.13 (+ venv) from the distribution when it has a candidate
  local v="$1"
  command -v apt-get >/dev/null && [ "$(id -u)" = 0 ] || return 0
  apt-get update -qq >/dev/null 2>&1 || true
  if apt-cache policy "python$v" 2>/dev/null | grep -q 'Candidate: [0-9]'; then
    echo "installing python$v from apt"
    apt-get install -y -qq "python$v" "python$v-venv" >/dev/null || true
  else
    echo "apt has no python$v on this machine"
  fi
}

say "pip wheel --no-deps -w dist/ .   (in $ROOT)"
"$BUILD_PY" -m pip wheel --quiet --no-deps -w "$SCRATCH/dist" "$ROOT" 2>&1 | grep -v "^WARNING: Location" || true
WHEEL="$(ls "$SCRATCH"/dist/agenthost-*.whl)"
echo "built $(basename "$WHEEL")"

check_one() {  # $1 = interpreter; runs in a subshell, which stops the host it started however it ends
  local py="$1" dir
  HOST_PID=""
  trap '[ -z "$HOST_PID" ] || { kill -TERM "$HOST_PID" 2>/dev/null; wait "$HOST_PID" 2>/dev/null; }' EXIT
  dir="$SCRATCH/user-$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
  mkdir -p "$dir"
  cd "$dir"
  say "$py -m venv venv && venv/bin/pip install $(basename "$WHEEL")   (in $dir)"
  "$py" -m venv venv
  # (this machine's pip configuration may name local mirrors that do not exist: pip warns about each, noise)
  venv/bin/python -m pip install --quiet --disable-pip-version-check "$WHEEL" 2>&1 | grep -v "^WARNING: Location" \
    || true
  venv/bin/python -c "import agenthost.host.cli.main" || { echo "FAIL: the wheel did not install" >&2; return 1; }
  export PATH="$dir/venv/bin:$PATH"
  say "agenthost --version"
  agenthost --version
  say "agenthost demo"
  agenthost demo

  export AGENTHOST_HOME="$dir/home"
  say "agenthost serve &"
  agenthost serve >"$dir/serve.log" 2>&1 &
  HOST_PID=$!
  for _ in $(seq 1 300); do
    agenthost status >/dev/null 2>&1 && break
    kill -0 "$HOST_PID" 2>/dev/null || { cat "$dir/serve.log"; return 1; }
    sleep 0.1
  done
  agenthost status

  # The example ships inside the package; a user starting a plugin copies it, then installs it by relative path.
  cp -r "$(venv/bin/python -c 'import agenthost.host.cli.demo as d; print(d.example_plugin())')" ./notes-runner
  say "agenthost plugins install ./notes-runner --offline"
  agenthost plugins install ./notes-runner --offline
  say "agenthost runners show agenthost-notes/notes"
  agenthost runners show agenthost-notes/notes
  say "agenthost bots create support"
  agenthost bots create support
  for bad in "model=gpt-4o" "max_iterations=900" 'tools=["read_file","fly"]'; do
    say "agenthost bots bind support --runner agenthost/local-agent --config '$bad'"
    if agenthost bots bind support --runner agenthost/local-agent --config "$bad"; then
      echo "FAIL: a bad config was accepted" >&2
      return 1
    fi
  done
  say 'agenthost bots bind support --runner agenthost-notes/notes --config greeting="Noted."'
  agenthost bots bind support --runner agenthost-notes/notes --config greeting="Noted."
  say 'agenthost send support "note buy milk"'
  agenthost send support "note buy milk" | tee "$dir/send.out"
  grep -q "Noted. (1 notes)" "$dir/send.out"
  say "agenthost status"
  agenthost status
  say "agenthost runs list --json"
  agenthost runs list --json | tee "$dir/runs.json"
  venv/bin/python - "$dir/runs.json" <<'EOF'
import json, sys
runs = json.load(open(sys.argv[1]))
assert len(runs) == 1 and runs[0]["status"] == "completed", runs
assert isinstance(runs[0]["usage"]["input_tokens"], int) and isinstance(runs[0]["created_at"], float), runs[0]
EOF
  say "agenthost runs list --json | head -1   (the rest of the output has nowhere to go: no traceback)"
  { agenthost runs list --json 2>"$dir/pipe.err" || true; } | head -1
  if [ -s "$dir/pipe.err" ]; then cat "$dir/pipe.err"; return 1; fi

  kill -TERM "$HOST_PID"
  wait "$HOST_PID"
  HOST_PID=""
  unset AGENTHOST_HOME
  cd "$ROOT"
}

tested=()
missing=()
for v in "${VERSIONS[@]}"; do
  py="$(find_python "$v")"
  if [ -z "$py" ]; then
    apt_python "$v"
    py="$(find_python "$v")"
  fi
  if [ -z "$py" ]; then
    missing+=("$v")
    echo "!! no Python $v here (not on PATH, not in pyenv, not in apt): NOT tested" >&2
    continue
  fi
  echo
  echo "==== wheel check on Python $v ($py) ===="
  (check_one "$py")
  tested+=("$v")
done

echo
echo "wheel check passed on Python: ${tested[*]:-none}"
[ "${#missing[@]}" -eq 0 ] || echo "NOT tested (interpreter unavailable): ${missing[*]}"
[ "${#tested[@]}" -gt 0 ]
