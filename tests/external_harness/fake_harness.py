#!/usr/bin/env python3
"""A stand-in for `claude -p --output-format stream-json`: fast, deterministic, and able to misbehave on cue.

Sessions live in $CLAUDE_CONFIG_DIR/fake-sessions/<id>, so `--resume` of an id it never created fails the way
Claude Code does. FAKE_HARNESS_MODE picks the behaviour; FAKE_HARNESS_LOG appends one JSON line per start (a
relative path is taken from $HOME: the harness's sandbox shows it little else that outlives the run).
"""

import json
import os
import signal
import subprocess
import sys
import time
import uuid


def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main():
    args = sys.argv[1:]
    resume = args[args.index("--resume") + 1] if "--resume" in args else None
    new_id = args[args.index("--session-id") + 1] if "--session-id" in args else None
    prompt = sys.stdin.read()
    mode = os.environ.get("FAKE_HARNESS_MODE", "ok")
    store = os.path.join(os.environ["CLAUDE_CONFIG_DIR"], "fake-sessions")
    os.makedirs(store, exist_ok=True)
    log = os.path.join(os.environ.get("HOME", "/"), os.environ.get("FAKE_HARNESS_LOG", ""))
    if os.environ.get("FAKE_HARNESS_LOG"):
        with open(log, "a") as fh:
            fh.write(
                json.dumps(
                    {
                        "pid": os.getpid(),
                        "start": time.time(),
                        "argv": args,
                        "prompt": prompt,
                        "cwd": os.getcwd(),
                        "env": sorted(os.environ),
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
    if mode in ("hang", "stubborn"):
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
        return
    if mode == "bigtool":
        tool = {"type": "tool_use", "id": "toolu_big", "name": "Read", "input": {"file_path": "big.txt"}}
        emit({"type": "assistant", "message": {"id": "msg_t", "content": [tool]}, "parent_tool_use_id": None})
        result = {"type": "tool_result", "tool_use_id": "toolu_big", "content": "R" * 100_000}
        emit({"type": "user", "message": {"role": "user", "content": [result]}, "parent_tool_use_id": None})
    with open(os.path.join(store, session)) as fh:
        turns = fh.read().count("\n")
    text = f"echo[{turns}]: {prompt}"
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
            "total_cost_usd": 0.01,
        }
    )
    if os.environ.get("FAKE_HARNESS_LOG"):
        with open(log, "a") as fh:
            fh.write(json.dumps({"pid": os.getpid(), "end": time.time()}) + "\n")


if __name__ == "__main__":
    main()
