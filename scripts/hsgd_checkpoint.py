"""Reading and writing hsgd checkpoint files from Python, for scripts/export_torch.py and
scripts/import_torch.py (Debian's /usr/bin/python3 with python3-protobuf).

The format is framework/checkpoint/checkpoint.proto: DIR/step_<N>/rank_<r> and
DIR/step_<N>/manifest, each one serialized Envelope whose payload (a RankState or a Manifest) is
checked against the envelope's payload_size and zlib crc32 before it is parsed, as the C++ reader
does (framework/checkpoint/checkpoint_file.cpp). The Python classes are generated at run time
with `protoc --python_out` into a temporary directory from the .proto next to the C++ code, so
that no generated code is committed and the scripts always read the format of their checkout.
"""
import importlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zlib

FORMAT_VERSION = 1
RANK_KIND = "hsgd-checkpoint-rank"
MANIFEST_KIND = "hsgd-checkpoint-manifest"
MANIFEST_NAME = "manifest"

DEFAULT_PROTO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "framework",
                             "checkpoint", "checkpoint.proto")


class CheckpointError(Exception):
    """A checkpoint file is missing, damaged or not what was expected; the message names it."""


def load_proto_module(proto_path=DEFAULT_PROTO):
    """Compiles checkpoint.proto with protoc into a temporary directory and imports it."""
    proto_path = os.path.abspath(proto_path)
    if not os.path.isfile(proto_path):
        raise CheckpointError("cannot find the format '%s' (pass --proto)" % proto_path)
    if shutil.which("protoc") is None:
        raise CheckpointError("protoc is not installed (Debian package protobuf-compiler)")
    try:
        import google.protobuf  # noqa: F401
    except ImportError:
        raise CheckpointError("the Python protobuf runtime is missing (Debian package "
                              "python3-protobuf; run with /usr/bin/python3)")
    out_dir = tempfile.mkdtemp(prefix="hsgd_proto_")
    try:
        subprocess.run(["protoc", "--proto_path=" + os.path.dirname(proto_path),
                        "--python_out=" + out_dir, proto_path], check=True,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
        sys.path.insert(0, out_dir)
        try:
            name = os.path.splitext(os.path.basename(proto_path))[0] + "_pb2"
            return importlib.import_module(name)
        finally:
            sys.path.remove(out_dir)
    except subprocess.CalledProcessError as e:
        raise CheckpointError("protoc failed on '%s': %s" % (proto_path, e.stderr.decode()))
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


def step_dir(root, step):
    return os.path.join(root, "step_%d" % step)


def rank_file_name(rank):
    return "rank_%d" % rank


def complete_steps(root):
    """Steps of the complete checkpoints (those with a manifest) in root, ascending."""
    steps = []
    for name in os.listdir(root):
        m = re.fullmatch(r"step_([0-9]+)", name)
        if m and os.path.exists(os.path.join(root, name, MANIFEST_NAME)):
            steps.append(int(m.group(1)))
    return sorted(steps)


def resolve_checkpoint(path):
    """path is one checkpoint (it holds a manifest) or a checkpoint directory, whose newest
    complete checkpoint is returned."""
    if os.path.exists(os.path.join(path, MANIFEST_NAME)):
        return path
    if not os.path.isdir(path):
        raise CheckpointError("'%s' is neither a checkpoint nor a directory of checkpoints" % path)
    steps = complete_steps(path)
    if not steps:
        raise CheckpointError("'%s' holds no complete checkpoint (no step_<N>/manifest)" % path)
    return step_dir(path, steps[-1])


def read_envelope(pb, path, kind):
    """The payload of the file at path, after the checks of the C++ read_envelope; returns
    (payload bytes, crc32)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise CheckpointError("cannot open '%s': %s" % (path, e.strerror))
    envelope = pb.Envelope()
    try:
        envelope.ParseFromString(data)
        parsed = True
    except Exception:  # google.protobuf.message.DecodeError
        parsed = False
    if not parsed or envelope.kind != kind:
        raise CheckpointError("'%s' is not a complete %s file (%d bytes: truncated, or another "
                              "kind of file)" % (path, kind, len(data)))
    if envelope.format_version != FORMAT_VERSION:
        raise CheckpointError("'%s' has format version %d, this script reads %d" %
                              (path, envelope.format_version, FORMAT_VERSION))
    if len(envelope.payload) != envelope.payload_size:
        raise CheckpointError("'%s' is truncated: %d of %d payload bytes" %
                              (path, len(envelope.payload), envelope.payload_size))
    crc = zlib.crc32(envelope.payload)
    if crc != envelope.crc32:
        raise CheckpointError("'%s' is corrupt: checksum %d of its payload, expected %d" %
                              (path, crc, envelope.crc32))
    return envelope.payload, crc


def read_manifest(pb, checkpoint):
    path = os.path.join(checkpoint, MANIFEST_NAME)
    payload, _ = read_envelope(pb, path, MANIFEST_KIND)
    manifest = pb.Manifest()
    manifest.ParseFromString(payload)
    if manifest.run.world_size < 1 or len(manifest.files) != manifest.run.world_size:
        raise CheckpointError("'%s' lists %d files for world size %d" %
                              (path, len(manifest.files), manifest.run.world_size))
    return manifest


def read_rank_state(pb, checkpoint, manifest, rank):
    """Rank `rank`'s RankState, checked against the manifest like the C++ loader does."""
    if not 0 <= rank < manifest.run.world_size:
        raise CheckpointError("rank %d is not in '%s' (world size %d)" %
                              (rank, checkpoint, manifest.run.world_size))
    path = os.path.join(checkpoint, rank_file_name(rank))
    payload, crc = read_envelope(pb, path, RANK_KIND)
    if crc != manifest.files[rank].crc32:
        raise CheckpointError("'%s' has checksum %d, the manifest recorded %d (a file from "
                              "another write)" % (path, crc, manifest.files[rank].crc32))
    state = pb.RankState()
    state.ParseFromString(payload)
    if state.rank != rank or state.step != manifest.step:
        raise CheckpointError("'%s' holds rank %d of step %d, expected rank %d of step %d" %
                              (path, state.rank, state.step, rank, manifest.step))
    return state


def write_envelope(pb, path, kind, payload):
    """Writes payload in an Envelope atomically (temporary file, fsync, rename, fsync of the
    directory), as the C++ write_envelope does; returns (file size, crc32)."""
    envelope = pb.Envelope(kind=kind, format_version=FORMAT_VERSION, crc32=zlib.crc32(payload),
                           payload_size=len(payload), payload=payload)
    data = envelope.SerializeToString()
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, ".%s.tmp.%d" % (os.path.basename(path), os.getpid()))
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, path)
    except OSError as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise CheckpointError("cannot write '%s': %s" % (path, e.strerror))
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return len(data), envelope.crc32
