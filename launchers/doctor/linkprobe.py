"""One node's side of the link test: in each round, a TCP stream to that round's peer, then one
from it (or the other way round); printed as one JSON line for ``doctor.links``.

Sent as the source of ``<python> -c`` to every node at once (through pdsh/ssh, or inside a lab
node's namespace), like ``launchers.config.probe``: standard library only, any Python 3.8+. Its
one argument is a JSON request ``{"peers", "first", "port", "seconds", "warmup_s",
"timeout_s", "bind"}``: ``peers[r]`` is the node's peer in round ``r`` (None: idle that round),
``first[r]`` whether it sends first. The node listens on ``port + r`` for every round from the
start, then goes through the rounds in order: it connects to its peer's ``port + r`` and waits
for the peer's go byte, so a pair starts together whatever round the other nodes are in (each
node is in one pair per round, so no link carries two tests). The first sends for ``seconds``
while the other counts, then the other way: one direction at a time, so each figure is that
direction's alone (both at once, a 25 Mbit/s lab link read 23.6 Mbit/s one way and 11.8 the
other). The received rate leaves out the first ``warmup_s`` after the first byte (TCP slow
start, a shaper's bucket) and ends at the last byte. ``bind`` (default all addresses) is the
address to listen on. Output: ``MDS-DOCTOR {"rounds": [...]}``, per round ``rx_mbit`` (the
rate from the peer) with the bytes and seconds it comes from, ``tx_bytes``, or what went wrong
(``rx_error``, ``tx_error``); or ``error``.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time

MARKER = "MDS-DOCTOR "
"""Prefix of the output line (the same as the node probe's, so the transports read it)."""

CHUNK = 256 * 1024
"""Bytes per send and per receive call."""

GO = b"g"
"""The byte each side sends on the connection it accepted when it enters the round."""


def _receive(server, out, timeout_s, warmup_s):
    """Accept the peer's connection, send it the go byte, count its stream (a thread)."""
    try:
        server.settimeout(timeout_s)
        conn, _ = server.accept()
        conn.settimeout(timeout_s)
        buf = bytearray(CHUNK)
        first = start = None
        counted = 0
        last = time.monotonic()
        with conn:
            conn.sendall(GO)
            while True:
                n = conn.recv_into(buf)
                now = time.monotonic()
                if n == 0:
                    break
                if first is None:
                    first = now
                    start = first + warmup_s
                if now >= start:
                    counted += n
                last = now
        seconds = last - start if start is not None else 0.0
        out["rx_bytes"] = counted
        out["rx_seconds"] = round(seconds, 6)
        if counted and seconds > 0:
            out["rx_mbit"] = round(counted * 8 / seconds / 1e6, 3)
        else:
            out["rx_error"] = "the peer's stream ended within the warm-up: no rate"
    except OSError as exc:
        out["rx_error"] = f"receiving from the peer: {type(exc).__name__}: {exc}"


def _connect(peer, port, timeout_s):
    """Connect to the peer's listener, retrying until ``timeout_s`` (it may start later)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return socket.create_connection((peer, port), timeout=timeout_s)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _send(peer, port, seconds, timeout_s, out):
    """Connect, wait for the peer's go byte, send for ``seconds``, close."""
    try:
        sock = _connect(peer, port, timeout_s)
        with sock:
            sock.settimeout(timeout_s)
            if sock.recv(1) != GO:
                raise OSError(f"{peer}:{port} closed before the round started")
            payload = b"\0" * CHUNK
            sent = 0
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                sock.sendall(payload)
                sent += CHUNK
            sock.shutdown(socket.SHUT_WR)
            sock.recv(1)  # the peer's close: everything sent was read
        out["tx_bytes"] = sent
    except OSError as exc:
        out["tx_error"] = f"sending to {peer}:{port}: {type(exc).__name__}: {exc}"


def run(request):
    """Every round from this node's side; the facts as a dict."""
    peers, port = request["peers"], int(request["port"])
    first = request.get("first") or [True] * len(peers)
    seconds = float(request.get("seconds", 1.0))
    warmup_s = float(request.get("warmup_s", 0.2))
    timeout_s = float(request.get("timeout_s", 60.0))
    servers = {}
    try:
        for r, peer in enumerate(peers):
            if peer is None:
                continue
            server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            servers[r] = server
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind((request.get("bind", ""), port + r))
            server.listen(1)
    except OSError as exc:
        for server in servers.values():
            server.close()
        last = port + len(peers) - 1
        return {"error": f"cannot listen on ports {port}-{last}: {exc}: pick free ones "
                         "(--links-port)"}  # fmt: skip
    rounds = []
    for r, peer in enumerate(peers):
        out = {"round": r, "peer": peer}
        rounds.append(out)
        if peer is None:
            continue
        receiver = threading.Thread(target=_receive, args=(servers[r], out, timeout_s, warmup_s))
        receiver.start()
        if not first[r]:  # the peer's stream first
            receiver.join(timeout_s + seconds)
        _send(peer, port + r, seconds, timeout_s, out)
        receiver.join(timeout_s + seconds)
        servers[r].close()
    return {"hostname": socket.gethostname(), "rounds": rounds}


def command(python, request):
    """argv running this file with ``python`` for ``request`` (the source goes in ``-c``)."""
    with open(__file__, encoding="utf-8") as f:
        source = f.read()
    return [python, "-c", source, json.dumps(request, sort_keys=True)]


def main(argv):
    """Print ``MDS-DOCTOR <json>`` for the JSON request in ``argv[1]``."""
    try:
        facts = run(json.loads(argv[1]))
    except BaseException as exc:  # say it rather than die silently: the doctor shows it
        facts = {"error": f"{type(exc).__name__}: {exc}"}
    sys.stdout.write(MARKER + json.dumps(facts, sort_keys=True) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
