#!/usr/bin/env python3
"""Looks for a job's secrets in the raw bytes of a capture of its traffic.

    capture_needles.py PCAP --token-file F --weights W.f32 --key hsgd-run/ --key /pg/gloo/

Prints what the capture holds ("capture: B bytes, F frames", "connections: N, payload bytes P":
the TCP connections it saw open and the bytes they carried both ways), then one line per kind
of needle, "NAME: FOUND/TOTAL":
  token       the token file's text (hex) and the 32 bytes it encodes
  key:K       the store key text K
  weights     runs of 16 consecutive float32 values (64 bytes) of the model's initial weights,
              taken at 64 places spread over W.f32 (raw little-endian float32, as
              initial_weights writes them)
Exit code 0; 2 on a usage error or an unreadable file.
"""

import argparse
import sys

from pcap_streams import packets, tcp_connections

RUN = 16  # float32 values per weight needle
PLACES = 64


def weight_needles(path):
    data = open(path, "rb").read()
    n = len(data) // 4
    if n < RUN * PLACES:
        sys.exit(f"capture_needles: {path} holds {n} float32 values, fewer than {RUN * PLACES}")
    starts = [(i * (n - RUN)) // (PLACES - 1) for i in range(PLACES)]
    # A run of zeros (a bias initialised to 0) would match any zero-filled buffer: skip it.
    needles = [data[4 * s:4 * (s + RUN)] for s in starts]
    return [x for x in needles if x.count(0) < len(x) // 2]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("pcap")
    p.add_argument("--token-file", required=True)
    p.add_argument("--weights", required=True)
    p.add_argument("--key", action="append", default=[])
    args = p.parse_args()

    raw = open(args.pcap, "rb").read()
    frames = sum(1 for _ in packets(args.pcap))
    print(f"capture: {len(raw)} bytes, {frames} frames")
    conns = tcp_connections(args.pcap)
    payload = sum(len(c.client_bytes) + len(c.server_bytes) for c in conns)
    print(f"connections: {len(conns)}, payload bytes {payload}")

    token = open(args.token_file).read().strip()
    token_needles = [token.encode(), bytes.fromhex(token)]
    print(f"token: {sum(1 for x in token_needles if x in raw)}/{len(token_needles)}")
    for key in args.key:
        times = raw.count(key.encode())
        print(f"key:{key}: {min(times, 1)}/1 ({times} times)")
    needles = weight_needles(args.weights)
    print(f"weights: {sum(1 for x in needles if x in raw)}/{len(needles)}")


if __name__ == "__main__":
    main()
