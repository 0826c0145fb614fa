"""The in-sandbox half of agenthost.runners.sdk.egress: listens on 127.0.0.1 ports of the sandbox's own network
namespace and relays each connection to a unix socket bound in from outside (the runner's egress proxy, or a
bridge endpoint), optionally opening with `CONNECT host:port` to the proxy.

Run as `python -I -S egress_forward.py PORT SOCKET TARGET [PORT SOCKET TARGET ...] -- command...` (TARGET `-` for
a plain relay) as the sandbox's first process. It binds every port, forks, and execs the command in the parent:
the command keeps the sandbox's first pid (what the runner signals and watches) and never races the ports, and the
child serves until the sandbox's pid namespace ends. Being the namespace's first fork, the child is always its
pid FORWARDER_PID, which is how a kept process's watch (process.left_running) tells it from a process a model's
command left behind. It holds none of the command's pipes.

Every process pays its start-up, so it imports only built-in modules (_socket, _thread, posix): `socket`,
`threading` and `json` would triple it.
"""

import _signal
import _socket
import _thread
import posix
import sys

CHUNK = 65536
HEAD_LIMIT = 65536


def relay(src, dst):
    try:
        while True:
            data = src.recv(CHUNK)
            if not data:
                break
            dst.sendall(data)
        dst.shutdown(_socket.SHUT_WR)
    except OSError:
        for s in (src, dst):
            try:
                s.shutdown(_socket.SHUT_RDWR)
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
    upstream = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        upstream.connect(path)
        if target and not connect_through(upstream, target, client):
            return
        done = _thread.allocate_lock()
        done.acquire()

        def back():
            try:
                relay(upstream, client)
            finally:
                done.release()

        _thread.start_new_thread(back, ())
        relay(client, upstream)
        done.acquire()
    except OSError:
        pass
    finally:
        upstream.close()
        client.close()


def accept_loop(listener, path, target):
    while True:
        try:
            fd, _ = listener._accept()
        except OSError:
            continue
        _thread.start_new_thread(serve_one, (_socket.socket(fileno=fd), path, target))


def main():
    args = sys.argv[1:]
    if "--" not in args:
        sys.exit("usage: egress_forward.py PORT SOCKET TARGET ... -- COMMAND...")
    cut = args.index("--")
    spec, command = args[:cut], args[cut + 1 :]
    if not command or len(spec) % 3:
        sys.exit("usage: egress_forward.py PORT SOCKET TARGET ... -- COMMAND...")
    listeners = []
    for i in range(0, len(spec), 3):
        port, path, target = int(spec[i]), spec[i + 1], spec[i + 2]
        target = "" if target == "-" else target
        for family, host in ((_socket.AF_INET, "127.0.0.1"), (_socket.AF_INET6, "::1")):
            try:
                s = _socket.socket(family, _socket.SOCK_STREAM)
                s.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
                s.bind((host, port))
                s.listen(128)
            except OSError as exc:
                if family == _socket.AF_INET:
                    sys.stderr.write(f"agenthost: the egress forwarder cannot listen on {host}:{port}: {exc}\n")
                    posix._exit(125)
                continue  # no IPv6 in this namespace: 127.0.0.1 is enough
            listeners.append((s, path, target))
    if posix.fork() != 0:
        for s, _, _ in listeners:
            s.close()
        # Python ignores these at start; the command gets the defaults a shell would (`yes | head` ends quietly).
        for name in ("SIGPIPE", "SIGXFSZ"):
            if hasattr(_signal, name):
                _signal.signal(getattr(_signal, name), _signal.SIG_DFL)
        try:
            if "/" in command[0]:
                posix.execv(command[0], command)
            for directory in posix.environ.get(b"PATH", b"/usr/bin:/bin").split(b":"):
                try:
                    posix.execv(directory.decode() + "/" + command[0], command)
                except OSError:
                    continue
            raise FileNotFoundError(2, "not found on PATH")
        except OSError as exc:
            sys.stderr.write(f"agenthost: cannot run {command[0]}: {exc.strerror}\n")
            posix._exit(127)
    null = posix.open("/dev/null", posix.O_RDWR)
    for fd in (0, 1, 2):
        posix.dup2(null, fd)
    for item in listeners[1:]:
        _thread.start_new_thread(accept_loop, item)
    accept_loop(*listeners[0])


if __name__ == "__main__":
    main()
