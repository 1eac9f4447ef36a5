#!/usr/bin/env python3
"""An outsider on a node of a job (started in the node's network namespace), without the token.

    outsider.py --log FILE --ready FILE --rdzv HOST:PORT [--replay PCAP] [--rdzv-attacks]
                [--store-outsider PROGRAM --job JOB]

What it does, logging one line per attempt to FILE (flushed at once: it is killed, not stopped):
  1. Notes the TCP ports listening in this namespace, then creates FILE given by --ready.
  2. Races to the set-up ports: polls /proc/net/tcp and /proc/net/tcp6 every 2 ms, and connects
     to every port that starts listening afterwards (the job's workers set up their process
     groups there) as soon as it sees it, sends 256 random bytes and holds the connection until
     the job closes it:        race ADDR:PORT connected, sent 256 | race ADDR:PORT failed: ERROR
                               race ADDR:PORT ENDING by the job after S s (got M bytes)
  3. Replays a sniffed capture (--replay): the bytes each client sent on the connections of the
     capture that did not go to the rendezvous port (the data plane; their first 64 KiB), to
     every new port:           replay-data ADDR:PORT connected | replay-data ADDR:PORT failed: E
                               replay-data ADDR:PORT sent N, got M, ENDING
  4. With --rdzv-attacks, at once (so while the agents meet): sends the client bytes of every
     connection to the rendezvous port in the capture again, and 256 random bytes:
                               replay-rdzv HOST:PORT sent N, got M, ENDING
                               garbage-rdzv HOST:PORT sent 256, got M, ENDING
     (each after a line "... connected", as in 3)
  5. With --store-outsider: runs PROGRAM HOST PORT JOB wrong-token, then no-token (a TcpStore
     writing the failure record hsgd-run/attempt/0/failed):
                               store MODE exit RC: ITS OUTPUT
N counts the bytes sent before the job closed the connection. ENDING is "closed" (the job
closed it), "reset", or "open after T s" (10 s, a held race connection 60 s). Runs until
killed.
"""

import argparse
import os
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pcap_streams import tcp_connections  # noqa: E402

_lock = threading.Lock()
_log = None


def log(line):
    with _lock:
        _log.write(line + "\n")
        _log.flush()


def listening():
    """(address, port) of every listening TCP socket in this namespace."""
    out = set()
    for path, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
        try:
            lines = open(path).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] != "0A":  # TCP_LISTEN
                continue
            addr_hex, port_hex = fields[1].split(":")
            raw = bytes.fromhex(addr_hex)
            if v6:
                # Little-endian 32-bit words; the tests' jobs listen on IPv4 (v4-mapped here).
                raw = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
                addr = socket.inet_ntop(socket.AF_INET6, raw)
                if addr.startswith("::ffff:"):
                    addr = addr[7:]
            else:
                addr = socket.inet_ntoa(raw[::-1])
            out.add((addr, int(port_hex, 16)))
    return out


def target_of(addr, port, own_addr):
    # A socket bound to every address is reached at this node's own address.
    return (own_addr if addr in ("0.0.0.0", "::") else addr, port)


def drain(sock, seconds):
    """Reads until the peer closes; returns (bytes read, ending)."""
    sock.settimeout(seconds)
    got = 0
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return got, "closed"
            got += len(chunk)
    except socket.timeout:
        return got, f"open after {seconds} s"
    except ConnectionResetError:
        return got, "reset"
    except OSError as e:
        return got, f"error {e}"


def send_and_drain(what, target, payload):
    try:
        s = socket.create_connection(target, timeout=5)
    except OSError as e:
        log(f"{what} {target[0]}:{target[1]} failed: {e}")
        return
    log(f"{what} {target[0]}:{target[1]} connected")
    with s:
        sent = 0
        try:
            # In pieces, so that a job closing the connection midway is seen as such.
            while sent < len(payload):
                sent += s.send(payload[sent:sent + 4096])
            got, ending = drain(s, 10)
        except (ConnectionResetError, BrokenPipeError):
            got, ending = 0, "reset"
        except OSError as e:
            got, ending = 0, f"error {e}"
    log(f"{what} {target[0]}:{target[1]} sent {sent}, got {got}, {ending}")


def race(target, data_streams):
    try:
        s = socket.create_connection(target, timeout=2)
    except OSError as e:
        log(f"race {target[0]}:{target[1]} failed: {e}")
        return
    start = time.monotonic()
    try:
        s.sendall(os.urandom(256))
        log(f"race {target[0]}:{target[1]} connected, sent 256")
    except OSError as e:
        log(f"race {target[0]}:{target[1]} connected, send failed: {e}")
    threading.Thread(target=hold, args=(s, target, start), daemon=True).start()
    for stream in data_streams:
        threading.Thread(target=send_and_drain, args=("replay-data", target, stream),
                         daemon=True).start()


def hold(sock, target, start):
    got, ending = drain(sock, 60)
    sock.close()
    log(f"race {target[0]}:{target[1]} {ending} by the job after "
        f"{time.monotonic() - start:.1f} s (got {got} bytes)")


def store_attacks(program, host, port, job):
    for mode in ("wrong-token", "no-token"):
        try:
            p = subprocess.run([program, host, str(port), job, mode], capture_output=True,
                               text=True, timeout=30)
            text = (p.stdout + p.stderr).strip().replace("\n", " | ")
            log(f"store {mode} exit {p.returncode}: {text}")
        except subprocess.TimeoutExpired:
            log(f"store {mode} exit timeout: no answer within 30 s")


def rdzv_attacks(rdzv, streams):
    for stream in streams:
        send_and_drain("replay-rdzv", rdzv, stream)
    send_and_drain("garbage-rdzv", rdzv, os.urandom(256))


def main():
    global _log
    p = argparse.ArgumentParser()
    p.add_argument("--log", required=True)
    p.add_argument("--ready", required=True)
    p.add_argument("--rdzv", required=True, help="HOST:PORT of the rendezvous server")
    p.add_argument("--replay", help="a capture of an earlier run of the job")
    p.add_argument("--rdzv-attacks", action="store_true")
    p.add_argument("--store-outsider")
    p.add_argument("--job")
    args = p.parse_args()
    _log = open(args.log, "a")
    host, port = args.rdzv.rsplit(":", 1)
    rdzv = (host, int(port))

    rdzv_streams, data_streams = [], []
    if args.replay:
        for c in tcp_connections(args.replay):
            if not c.client_bytes:
                continue
            if c.server[1] == rdzv[1]:
                rdzv_streams.append(c.client_bytes)
            else:
                # The handshake and the first records are what could open a connection.
                data_streams.append(c.client_bytes[:65536])
        log(f"capture: {len(rdzv_streams)} rendezvous and {len(data_streams)} data-plane "
            f"client streams to replay")

    known = listening()
    # This node's address: the one its veth holds (the job's sockets are bound to it).
    own = subprocess.run(["ip", "-4", "-o", "addr", "show", "dev", "veth0"], capture_output=True,
                         text=True).stdout or subprocess.run(
        ["ip", "-4", "-o", "addr", "show", "dev", "veth1"], capture_output=True, text=True).stdout
    own_addr = own.split()[3].split("/")[0] if own else "127.0.0.1"
    open(args.ready, "w").close()

    if args.rdzv_attacks:
        threading.Thread(target=rdzv_attacks, args=(rdzv, rdzv_streams), daemon=True).start()
    if args.store_outsider:
        threading.Thread(target=store_attacks,
                         args=(args.store_outsider, host, rdzv[1], args.job),
                         daemon=True).start()
    while True:
        now = listening()
        for addr, lport in sorted(now - known):
            race(target_of(addr, lport, own_addr), data_streams)
        known |= now
        time.sleep(0.002)


if __name__ == "__main__":
    main()
