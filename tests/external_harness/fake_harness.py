#!/usr/bin/env python3
"""A stand-in for `claude -p --output-format stream-json`: fast, deterministic, and able to misbehave on cue.

Sessions live in $CLAUDE_CONFIG_DIR/fake-sessions/<id>, so `--resume` of an id it never created fails the way
Claude Code does. FAKE_HARNESS_MODE picks the behaviour; FAKE_HARNESS_LOG appends one JSON line per turn (a
relative path is taken from $HOME: the harness's sandbox shows it little else that outlives the run). With
`--input-format stream-json` it answers one message per stdin line in the same process, and a prompt starting
with "[hang]", "[noise]" or "[spawn]" misbehaves for that message only (hangs; prints after its result; leaves a
process running); one starting with "[net]" tries 127.0.0.1:$FAKE_HARNESS_NET_PORT and says `net=open|closed`.
A prompt "[sh] <command>" is a model that runs a shell command: the reply is its output. Every log entry names
the files in $CLAUDE_CONFIG_DIR when it was made (`config_files`): what the process loaded.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid

# Names this process in the log: pids repeat across sandboxes, each with its own pid namespace.
PROCESS = uuid.uuid4().hex


def config_files():
    return sorted(os.listdir(os.environ["CLAUDE_CONFIG_DIR"]))


def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main():
    args = sys.argv[1:]
    resume = args[args.index("--resume") + 1] if "--resume" in args else None
    new_id = args[args.index("--session-id") + 1] if "--session-id" in args else None
    store = os.path.join(os.environ["CLAUDE_CONFIG_DIR"], "fake-sessions")
    os.makedirs(store, exist_ok=True)
    if "--input-format" in args and args[args.index("--input-format") + 1] == "stream-json":
        if os.environ.get("FAKE_HARNESS_LOG"):  # when it started: a spare starts before its first message
            with open(os.path.join(os.environ.get("HOME", "/"), os.environ["FAKE_HARNESS_LOG"]), "a") as fh:
                boot = {"boot": PROCESS, "at": time.time(), "cwd": os.getcwd(), "config_files": config_files()}
                fh.write(json.dumps(boot) + "\n")
        # One JSON user message per line, one turn each, until stdin ends (as `claude -p --input-format
        # stream-json` does); the cost it reports is the process's running total, as Claude Code's is.
        session = None
        for n, line in enumerate(sys.stdin, start=1):
            content = json.loads(line)["message"]["content"]
            session = turn(args, content, resume if session is None else session, new_id, store, cost=0.01 * n)
            if session is None:
                return
        return
    turn(args, sys.stdin.read(), resume, new_id, store, cost=0.01)


def turn(args, prompt, resume, new_id, store, *, cost):
    """One turn; returns the session id, or None when the process must end (it exits on its own failures)."""
    mode = os.environ.get("FAKE_HARNESS_MODE", "ok")
    log = os.path.join(os.environ.get("HOME", "/"), os.environ.get("FAKE_HARNESS_LOG", ""))
    if os.environ.get("FAKE_HARNESS_LOG"):
        with open(log, "a") as fh:
            fh.write(
                json.dumps(
                    {
                        "pid": os.getpid(),
                        "process": PROCESS,
                        "start": time.time(),
                        "argv": args,
                        "prompt": prompt,
                        "cwd": os.getcwd(),
                        "env": sorted(os.environ),
                        "config_files": config_files(),
                    }
                )
                + "\n"
            )
    if mode == "crash":
        sys.stderr.write("fatal: the fake harness crashed on purpose\n")
        sys.exit(3)
    if resume and not os.path.exists(os.path.join(store, resume)):
        sys.stderr.write(f"No conversation found with session ID: {resume}\n")
        sys.exit(1)
    session = resume or new_id or str(uuid.uuid4())
    with open(os.path.join(store, session), "a") as fh:
        fh.write(prompt + "\n")
    emit({"type": "system", "subtype": "init", "session_id": session, "model": "fake-model", "mcp_servers": []})
    if mode in ("hang", "stubborn") or prompt.startswith("[hang]"):
        if mode == "stubborn":
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    "import signal,time; signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(120)",
                ]
            )
        time.sleep(120)
    if prompt.startswith("[spawn]"):  # a command that leaves a process behind, in a session of its own
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    if mode == "slow":
        time.sleep(0.6)
    if mode == "is_error":
        emit(
            {
                "type": "result",
                "subtype": "success",
                "is_error": True,
                "result": "API Error: 401 invalid x-api-key",
                "session_id": session,
                "usage": {},
                "api_error_status": 401,
            }
        )
        return session
    if mode == "bigtool":
        tool = {"type": "tool_use", "id": "toolu_big", "name": "Read", "input": {"file_path": "big.txt"}}
        emit({"type": "assistant", "message": {"id": "msg_t", "content": [tool]}, "parent_tool_use_id": None})
        result = {"type": "tool_result", "tool_use_id": "toolu_big", "content": "R" * 100_000}
        emit({"type": "user", "message": {"role": "user", "content": [result]}, "parent_tool_use_id": None})
    with open(os.path.join(store, session)) as fh:
        turns = fh.read().count("\n")
    text = f"echo[{turns}]: {prompt}"
    if prompt.startswith("[sh] "):  # not echoed: the reply is what the command printed
        done = subprocess.run(["/bin/sh", "-c", prompt[5:]], capture_output=True, text=True, timeout=30)
        text = f"echo[{turns}]: sh\n{done.stdout}{done.stderr}"
    elif prompt.startswith("[net]"):  # a command reaching for a port on the host's loopback
        try:
            socket.create_connection(("127.0.0.1", int(os.environ["FAKE_HARNESS_NET_PORT"])), timeout=5).close()
            text += " net=open"
        except OSError:
            text += " net=closed"
    if mode == "bigline":
        text = "B" * (3 * 1024 * 1024)
    msg = {"id": f"msg_{uuid.uuid4().hex}", "role": "assistant", "content": [{"type": "text", "text": text}]}
    emit({"type": "assistant", "message": msg, "parent_tool_use_id": None, "session_id": session})
    emit(
        {
            "type": "result",
            "subtype": "success",
            "is_error": False,
            "result": text,
            "session_id": session,
            "usage": {"input_tokens": 3, "output_tokens": 4},
            "total_cost_usd": cost,
        }
    )
    if os.environ.get("FAKE_HARNESS_LOG"):
        with open(log, "a") as fh:
            fh.write(json.dumps({"pid": os.getpid(), "end": time.time()}) + "\n")
    if prompt.startswith("[noise]"):
        # Prints while waiting for the next message, which Claude Code should never do.
        threading.Timer(0.2, emit, [{"type": "system", "subtype": "stray", "session_id": session}]).start()
    return session


if __name__ == "__main__":
    main()
