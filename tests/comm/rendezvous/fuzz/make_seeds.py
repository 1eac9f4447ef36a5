#!/usr/bin/env python3
"""Writes the seed corpus of the rendezvous fuzz target (corpus/*), one file per protocol path.

Input format (rendezvous_fuzz_input.h): byte 0 chooses the size of the chunks the byte stream is
fed in (1 + byte % 64); the rest is what one client connection sends. Protobuf messages are
encoded by hand here (the fields of comm/rendezvous/proto/rendezvous.proto), so the script needs nothing
but Python. Run it from any directory; it rewrites the files it owns.
"""
import os
import struct

MAGIC = 0x48534744
VERSION = 2
OP = {"set": 1, "get": 2, "add": 3, "compare_set": 4, "wait": 5, "check": 6, "delete_key": 7,
      "num_keys": 8, "multi_get": 9, "multi_set": 10, "ping": 11}


def varint(n):
    n &= (1 << 64) - 1
    out = b""
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out += bytes([byte | 0x80])
        else:
            return out + bytes([byte])


def field_bytes(number, data):
    return varint(number << 3 | 2) + varint(len(data)) + data


def field_varint(number, value):
    return varint(number << 3) + varint(value)


def hello(job, version=VERSION, magic=MAGIC):
    return (varint(1 << 3 | 5) + struct.pack("<I", magic) + field_varint(2, version) +
            field_bytes(3, job))


def request(rid, op, keys=(), values=(), delta=0, timeout_ms=0):
    out = field_varint(1, rid) + field_varint(2, OP[op])
    for k in keys:
        out += field_bytes(3, k)
    for v in values:
        out += field_bytes(4, v)
    if delta:
        out += field_varint(5, delta)
    if timeout_ms:
        out += field_varint(6, timeout_ms)
    return out


def frame(payload):
    return struct.pack(">I", len(payload)) + payload


def login(job=b"fuzz"):
    return frame(hello(job))


SEEDS = {
    "hello_set_get": b"\x3f" + login() + frame(request(1, "set", [b"k"], [b"v"])) +
                     frame(request(2, "get", [b"k"], timeout_ms=1000)),
    # The harness's connection proved job "fuzz" (its TLS identity): another job is refused.
    "hello_unproven_job": b"\x00" + login(b"other") + frame(request(1, "num_keys")),
    "hello_old_version": b"\x07" + frame(hello(b"fuzz", version=1)),
    "hello_bad_job_id": b"\x3f" + frame(hello(b"bad job\n")),
    "prelogin_8mib": b"\x3f" + struct.pack(">I", 8 << 20),
    "garbage_after_hello": b"\x3f" + login() + frame(b"\xff\xff\xff\xff garbage"),
    "wait_then_set": b"\x3f" + login() + frame(request(1, "wait", [b"a", b"b"], timeout_ms=60000)) +
                     frame(request(2, "multi_set", [b"a", b"b"], [b"1", b"2"])),
    "huge_timeout": b"\x3f" + login() + frame(request(1, "get", [b"never"], timeout_ms=(1 << 63) - 1)),
    "zero_timeout": b"\x3f" + login() + frame(request(1, "multi_get", [b"x", b"y"], timeout_ms=0)),
    "quota_keys": b"\x3f" + login() + frame(request(1, "multi_set", [b"k%d" % i for i in range(65)],
                                                    [b"v"] * 65)),
    "add_compare_delete": b"\x05" + login() + frame(request(1, "add", [b"c"], delta=5)) +
                          frame(request(2, "compare_set", [b"c"], [b"5", b"9"])) +
                          frame(request(3, "check", [b"c", b"d"])) +
                          frame(request(4, "delete_key", [b"c"])) + frame(request(5, "ping")),
}


def main():
    corpus = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
    os.makedirs(corpus, exist_ok=True)
    for name, data in SEEDS.items():
        with open(os.path.join(corpus, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
