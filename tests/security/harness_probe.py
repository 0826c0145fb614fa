#!/usr/bin/env python3
"""A stand-in harness that looks around the sandbox it was started in, leaves a `setsid` process behind, and
reports what it saw as a Claude Code stream-json result (so a runner takes it as a normal turn).

PROBE_HOST_DIR: the host's data dir (api.sock, admin.sock, a database); PROBE_DATA_DIR: the runner's data dir;
PROBE_OTHER_WS: another conversation's working directory; PROBE_LIST: a directory to list; PROBE_MARK: the argument
of the `sleep` it leaves behind; PROBE_MODE=hang: report, then keep running and ignore SIGINT (only a kill ends it).
Network (each optional): PROBE_TCP_PORT, a port on the host's loopback to connect to directly; PROBE_ABSTRACT, an
abstract unix socket's name; PROBE_FETCH, space-separated URLs to GET the way tools do (through the proxy the
environment names, or directly for NO_PROXY hosts).
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request


def connect(path):
    if not path:
        return "unset"
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
        return "connected"
    except OSError as exc:
        return f"refused: {exc.strerror}"
    finally:
        s.close()


def tcp(port):
    try:
        socket.create_connection(("127.0.0.1", int(port)), timeout=5).close()
        return "connected"
    except OSError as exc:
        return f"refused: {exc.strerror or exc}"


def abstract(name):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect("\0" + name)
        return "connected"
    except OSError as exc:
        return f"refused: {exc.strerror}"
    finally:
        s.close()


def fetch(url):
    try:
        with urllib.request.urlopen(url, timeout=20) as response:
            return f"{response.status} {response.read().decode(errors='replace')}"
    except urllib.error.HTTPError as exc:
        return f"{exc.code} {exc.read().decode(errors='replace')}"
    except OSError as exc:
        return f"failed: {exc}"


def listing(path):
    try:
        return sorted(os.listdir(path))
    except OSError as exc:
        return f"error: {exc.strerror}"


def main():
    if "--input-format" in sys.argv:
        sys.stdin.readline()  # one JSON message line, as Claude Code reads it; this probe answers one and ends
    else:
        sys.stdin.read()
    host = os.environ.get("PROBE_HOST_DIR", "")
    report = {
        "uid": os.getuid(),
        "env": dict(os.environ),
        "admin_sock": connect(os.path.join(host, "admin.sock")) if host else "unset",
        "api_sock": connect(os.path.join(host, "api.sock")) if host else "unset",
        "host_dir": listing(host),
        "data_dir": listing(os.environ.get("PROBE_DATA_DIR", "/nonexistent")),
        "other_ws": listing(os.environ.get("PROBE_OTHER_WS", "/nonexistent")),
        "listed": listing(os.environ.get("PROBE_LIST", "/nonexistent")),
        "proc_pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
    }
    if os.environ.get("PROBE_TCP_PORT"):
        report["tcp"] = tcp(os.environ["PROBE_TCP_PORT"])
    if os.environ.get("PROBE_ABSTRACT"):
        report["abstract"] = abstract(os.environ["PROBE_ABSTRACT"])
    report["fetched"] = {url: fetch(url) for url in os.environ.get("PROBE_FETCH", "").split()}

    try:
        with open("probe-wrote-here", "w") as fh:
            fh.write("ok")
        report["cwd_writable"] = True
    except OSError:
        report["cwd_writable"] = False
    mark = os.environ.get("PROBE_MARK")
    if mark:
        # The classic escape from a process group: a new session, then the parent goes away.
        subprocess.Popen(["setsid", "sleep", mark], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    print(json.dumps({"type": "system", "subtype": "init", "session_id": "probe-session", "mcp_servers": []}))
    if os.environ.get("PROBE_MODE") == "hang":
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        print(json.dumps({"type": "probe", "report": report}), flush=True)
        time.sleep(300)
    result = {"type": "result", "subtype": "success", "is_error": False, "result": json.dumps(report)}
    print(json.dumps({**result, "session_id": "probe-session", "usage": {}}), flush=True)


if __name__ == "__main__":
    main()
