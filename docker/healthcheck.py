"""Container HEALTHCHECK: exit 0 when the server answers GET /ready with 200 (model loaded and warm).

The port is the one the server really listens on, read from /proc: the sockets in LISTEN state that belong
to processes this user can see (in the container: the server), so `--port`, BERTSERVE_PORT and `--host`
all work without the check being told. BERTSERVE_PORT, when set, is tried first.
Python's stdlib only (no curl in the image), one plain HTTP/1.0 request: it runs every few seconds.
"""

import os
import socket
import sys

LISTEN = "0A"


def socket_inodes(pids=None) -> set:
    """Inodes of the sockets held by the given processes (default: every process we may look into)."""
    inodes = set()
    for pid in pids or [p for p in os.listdir("/proc") if p.isdigit()]:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:  # another user's process, or gone
            continue
    return inodes


def _address(hex_address: str) -> str:
    raw = bytes.fromhex(hex_address)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    # IPv6: four 32-bit words, each in host (little-endian) byte order
    return socket.inet_ntop(socket.AF_INET6, b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4)))


def listening(inodes: set) -> list:
    """(host to connect to, port) of each listening TCP socket among `inodes`."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = [line.split() for line in f.readlines()[1:]]
        except OSError:
            continue
        for row in rows:
            if len(row) > 9 and row[3] == LISTEN and row[9] in inodes:
                address, port = row[1].split(":")
                host = _address(address)
                host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
                found.append((host, int(port, 16)))
    return found


def ready(host: str, port: int, timeout: float = 3.0) -> bool:
    with socket.create_connection((host, port), timeout=timeout) as conn:
        conn.sendall(b"GET /ready HTTP/1.0\r\nHost: localhost\r\n\r\n")
        status_line = conn.makefile("rb").readline().split()
    return len(status_line) >= 2 and status_line[1] == b"200"


def main() -> int:
    pids = os.environ.get("BERTSERVE_HEALTHCHECK_PIDS", "").split() or None  # tests: whose sockets to probe
    candidates = listening(socket_inodes(pids))
    preferred = os.environ.get("BERTSERVE_PORT", "")
    candidates.sort(key=lambda c: str(c[1]) != preferred)
    if not candidates:
        print("healthcheck: no listening socket yet", file=sys.stderr)
        return 1
    errors = []
    for host, port in dict.fromkeys(candidates):
        try:
            if ready(host, port):
                return 0
            errors.append(f"{host}:{port} not ready")
        except OSError as error:
            errors.append(f"{host}:{port} {error}")
    print("healthcheck: " + "; ".join(errors), file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
