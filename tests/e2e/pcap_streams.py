"""Reads a pcap file of Ethernet frames (tcpdump -w) and reassembles its TCP connections.

Only what the end-to-end security tests need: IPv4 over Ethernet, TCP, classic pcap (either byte
order, micro- or nanosecond stamps). A truncated last record (a capture still being written) is
ignored.

    for c in tcp_connections("job.pcap"):
        print(c.client, c.server, len(c.client_bytes))
"""

import struct
from dataclasses import dataclass, field

_MAGICS = {b"\xd4\xc3\xb2\xa1": "<", b"\xa1\xb2\xc3\xd4": ">",
           b"\x4d\x3c\xb2\xa1": "<", b"\xa1\xb2\x3c\x4d": ">"}
_ETHERNET = 1


def packets(path):
    """Yields the bytes of every captured frame of the pcap file at path."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 24 or data[:4] not in _MAGICS:
        raise ValueError(f"{path} is not a classic pcap file (magic {data[:4].hex()})")
    order = _MAGICS[data[:4]]
    link = struct.unpack(order + "I", data[20:24])[0]
    if link != _ETHERNET:
        raise ValueError(f"{path}: link type {link}, expected Ethernet ({_ETHERNET})")
    off = 24
    while off + 16 <= len(data):
        incl = struct.unpack(order + "I", data[off + 8:off + 12])[0]
        if off + 16 + incl > len(data):
            break
        yield data[off + 16:off + 16 + incl]
        off += 16 + incl


@dataclass
class Connection:
    """One TCP connection: who opened it (client) and the bytes each side sent, in order."""
    client: tuple  # (ip, port)
    server: tuple
    client_bytes: bytes = b""
    server_bytes: bytes = b""


@dataclass
class _Half:
    isn: int = None  # sequence number of the SYN
    segments: dict = field(default_factory=dict)  # seq -> payload

    def data(self):
        if self.isn is None:
            return b""
        out = bytearray()
        next_seq = (self.isn + 1) & 0xFFFFFFFF
        for seq, payload in sorted(self.segments.items(),
                                   key=lambda kv: (kv[0] - next_seq) & 0xFFFFFFFF):
            skip = (next_seq - seq) & 0xFFFFFFFF
            if skip >= len(payload):
                continue  # a retransmission of bytes already taken
            if skip > 0x7FFFFFFF:
                break  # a gap: a segment the capture lacks
            out += payload[skip:]
            next_seq = (seq + len(payload)) & 0xFFFFFFFF
        return bytes(out)


def tcp_connections(path):
    """The TCP connections whose SYN the capture holds, in the order they were opened."""
    halves = {}  # (src, dst) -> _Half
    opened = []  # (client, server) in order of their SYN
    for frame in packets(path):
        if len(frame) < 14 + 20 or frame[12:14] != b"\x08\x00":
            continue
        ip = frame[14:]
        ihl = (ip[0] & 0x0F) * 4
        if ip[9] != 6:
            continue
        total = struct.unpack(">H", ip[2:4])[0]
        src_ip = ".".join(map(str, ip[12:16]))
        dst_ip = ".".join(map(str, ip[16:20]))
        tcp = ip[ihl:total]
        if len(tcp) < 20:
            continue
        sport, dport, seq = struct.unpack(">HHI", tcp[:8])
        flags = tcp[13]
        payload = tcp[(tcp[12] >> 4) * 4:]
        src, dst = (src_ip, sport), (dst_ip, dport)
        half = halves.setdefault((src, dst), _Half())
        if flags & 0x02:  # SYN
            half.isn = seq
            if not flags & 0x10:  # SYN without ACK: src opened the connection
                opened.append((src, dst))
        elif payload:
            half.segments[seq] = payload
    return [Connection(c, s, halves[(c, s)].data(), halves.get((s, c), _Half()).data())
            for c, s in opened]
