"""The in-sandbox half of agenthost.runners.sdk.egress: listens on 127.0.0.1 ports of the sandbox's own network
namespace and relays each connection to a unix socket bound in from outside (the runner's egress proxy, or a
bridge endpoint), optionally opening with `CONNECT host:port` to the proxy.

Run as `python -I -S egress_forward.py '[[port, socket, target], ...]' -- command...` as the sandbox's first
process, with the standard library only (it starts in a few milliseconds). It binds every port, forks, and execs
the command in the parent: the command keeps the sandbox's first pid (what the runner signals and watches) and
never races the ports, and the child serves until the sandbox's pid namespace ends. Being the namespace's first
fork, the child is always its pid FORWARDER_PID, which is how a kept process's watch (process.left_running) tells
it from a process a model's command left behind. It holds none of the command's pipes.
"""

import json
import os
import signal
import socket
import sys
import threading

CHUNK = 65536
HEAD_LIMIT = 65536


def relay(src, dst):
    try:
        while True:
            data = src.recv(CHUNK)
            if not data:
                break
            dst.sendall(data)
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def connect_through(upstream, target, client):
    """Opens the tunnel; on a refusal hands the proxy's answer (a 403 naming the setting) to the client."""
    upstream.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head and len(head) < HEAD_LIMIT:
        data = upstream.recv(CHUNK)
        if not data:
            break
        head += data
    status = head.split(b"\r\n", 1)[0].split(b" ")
    if len(status) >= 2 and status[1] == b"200":
        rest = head.split(b"\r\n\r\n", 1)[1]
        if rest:
            client.sendall(rest)
        return True
    client.sendall(head)
    return False


def serve_one(client, path, target):
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(path)
        if target and not connect_through(upstream, target, client):
            return
        back = threading.Thread(target=relay, args=(upstream, client), daemon=True)
        back.start()
        relay(client, upstream)
        back.join()
    except OSError:
        pass
    finally:
        upstream.close()
        client.close()


def accept_loop(listener, path, target):
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            continue
        threading.Thread(target=serve_one, args=(client, path, target), daemon=True).start()


def main():
    spec = json.loads(sys.argv[1])
    if sys.argv[2:3] != ["--"] or not sys.argv[3:]:
        sys.exit("usage: egress_forward.py SPEC -- COMMAND...")
    command = sys.argv[3:]
    listeners = []
    for port, path, target in spec:
        for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
            try:
                s = socket.socket(family, socket.SOCK_STREAM)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind((host, port))
                s.listen(128)
            except OSError:
                if family == socket.AF_INET:
                    raise
                continue  # no IPv6 in this namespace: 127.0.0.1 is enough
            listeners.append((s, path, target))
    if os.fork() != 0:
        for s, _, _ in listeners:
            s.close()
        # Python ignores these at start; the command gets the defaults a shell would (`yes | head` ends quietly).
        for name in ("SIGPIPE", "SIGXFSZ"):
            if hasattr(signal, name):
                signal.signal(getattr(signal, name), signal.SIG_DFL)
        try:
            os.execvp(command[0], command)
        except OSError as exc:
            sys.stderr.write(f"agenthost: cannot run {command[0]}: {exc.strerror}\n")
            os._exit(127)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    threads = [threading.Thread(target=accept_loop, args=item, daemon=True) for item in listeners]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


if __name__ == "__main__":
    main()
