#!/usr/bin/python3
"""Imports a PyTorch state_dict into an hsgd checkpoint, to fine-tune a PyTorch model with hsgd.

    /usr/bin/python3 scripts/import_torch.py STATE_DICT.pt DIR --model NAME [--step 0]

STATE_DICT.pt is a torch.save'd state dict (or a whole nn.Module; --key K picks a sub-dict such
as "state_dict" of a training checkpoint). The script writes DIR/step_<step>/rank_0 and
DIR/step_<step>/manifest: a single-rank checkpoint whose entries are "<prefix>.<name>" (prefix
"model", what the bundled examples and a Checkpointer's add_module("model", ...) load).

NAME must be what the run that loads it records as its model, since load() compares it:
train_resnet's --model ("resnet20", "resnet18", ...), train_mlp's "mlp <sizes>" (e.g.
"mlp 784-512-256-10" for --hidden 512,256; its start-up line prints the sizes).

What happens to the rest of the run's state: the checkpoint holds the model only and its
manifest is marked partial, so Checkpointer::load restores the model and leaves every other
registered object as it is: the optimizer starts fresh (no momentum, the --lr of the command
line), the LR schedule, the data loader and any averager start from step 0, and a module's random
streams (nn::Dropout's generator; torch holds none) start from their seeds. Being partial, it
starts a run of any --mode and --hierarchy; being one rank (one replica; also marked
replicas_equal), it starts a run on any number of workers: every worker starts from these
weights. The step written (default 0) is the step the run continues from.

    import_torch.py resnet20.pt imported --model resnet20
    train_resnet --model resnet20 --checkpoint-dir runs/ft --resume imported/step_0 ...

Tensors are stored as float32 (the format's only type): integer tensors (BatchNorm's
num_batches_tracked) are converted when exact; other floating types are converted with a note.
Files are written atomically (temporary file, fsync, rename, fsync of the directory), rank file
first, then the manifest, as the C++ writer does. An existing DIR/step_<step> is refused.

Needs Debian's python3-torch, python3-protobuf and protoc (protobuf-compiler).
Exit status: 0 on success, 1 with a message on any error.
"""
import argparse
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hsgd_checkpoint as ckpt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def hsgd_version():
    """The project version of this checkout's CMakeLists.txt, as the C++ writer records it."""
    try:
        with open(os.path.join(HERE, "..", "CMakeLists.txt")) as f:
            m = re.search(r"project\(hsgd VERSION ([0-9.]+)", f.read())
            return m.group(1) if m else "unknown"
    except OSError:
        return "unknown"


def state_dict_of(torch, path, key):
    try:
        obj = torch.load(path, map_location="cpu")
    except Exception as e:
        raise ckpt.CheckpointError("cannot load '%s' with torch.load: %s" % (path, e))
    if key is not None:
        if not isinstance(obj, dict) or key not in obj:
            raise ckpt.CheckpointError("'%s' has no key '%s'" % (path, key))
        obj = obj[key]
    if isinstance(obj, torch.nn.Module):
        obj = obj.state_dict()
    if not isinstance(obj, dict) or not obj:
        raise ckpt.CheckpointError("'%s' holds a %s, expected a non-empty state dict (use --key "
                                   "to pick one inside it)" % (path, type(obj).__name__))
    for name, value in obj.items():
        if not isinstance(value, torch.Tensor):
            raise ckpt.CheckpointError("'%s': entry '%s' is a %s, expected a tensor (use --key "
                                       "to pick the state dict inside it)" %
                                       (path, name, type(value).__name__))
    return obj


def as_float32(torch, name, t):
    t = t.detach().cpu()
    if t.dtype == torch.float32:
        return t.contiguous()
    if t.dtype in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        f = t.to(torch.float32)
        if not torch.equal(f.to(t.dtype), t):
            raise ckpt.CheckpointError("entry '%s' (%s) is not exact in float32" % (name, t.dtype))
        return f.contiguous()
    if t.is_floating_point():
        print("import_torch.py: note: entry '%s' converted from %s to float32" % (name, t.dtype),
              file=sys.stderr)
        return t.to(torch.float32).contiguous()
    raise ckpt.CheckpointError("entry '%s' has type %s, which hsgd cannot hold" % (name, t.dtype))


def import_state_dict(source, root, model, step=0, prefix="model", key=None, mode="torch-import",
                      hierarchy="", proto=ckpt.DEFAULT_PROTO):
    """Writes root/step_<step>; returns its path."""
    import torch
    if step < 0:
        raise ckpt.CheckpointError("--step %d must not be negative" % step)
    if not model:
        raise ckpt.CheckpointError("--model must name the model the loading run builds")
    if sys.byteorder != "little":
        raise ckpt.CheckpointError("this script writes the little-endian format on "
                                   "little-endian machines only")
    pb = ckpt.load_proto_module(proto)
    state = state_dict_of(torch, source, key)
    checkpoint = ckpt.step_dir(root, step)
    if os.path.exists(checkpoint):
        raise ckpt.CheckpointError("'%s' exists already; choose another --step or directory" %
                                   checkpoint)

    rank_state = pb.RankState(rank=0, step=step)
    for name, t in state.items():
        t = as_float32(torch, name, t)
        entry = rank_state.entries.add()
        entry.key = prefix + "." + name
        entry.value.tensor.shape.extend(list(t.shape))
        entry.value.tensor.data = t.numpy().tobytes()
    try:
        os.makedirs(checkpoint)
    except OSError as e:
        raise ckpt.CheckpointError("cannot create the directory '%s': %s" %
                                   (checkpoint, e.strerror))
    size, crc = ckpt.write_envelope(pb, os.path.join(checkpoint, ckpt.rank_file_name(0)),
                                    ckpt.RANK_KIND, rank_state.SerializeToString())

    manifest = pb.Manifest(step=step, replicas_equal=True, partial=True,
                           unix_time_ms=int(time.time() * 1000))
    manifest.run.world_size = 1
    manifest.run.local_world_size = 1
    manifest.run.mode = mode
    manifest.run.hierarchy = hierarchy
    manifest.run.model = model
    manifest.run.hsgd_version = hsgd_version()
    manifest.files.add(name=ckpt.rank_file_name(0), size=size, crc32=crc)
    ckpt.write_envelope(pb, os.path.join(checkpoint, ckpt.MANIFEST_NAME), ckpt.MANIFEST_KIND,
                        manifest.SerializeToString())
    return checkpoint, len(state)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("state_dict", help="a torch.save'd state dict (or nn.Module)")
    parser.add_argument("dir", help="the checkpoint directory; DIR/step_<step> is written")
    parser.add_argument("--model", required=True,
                        help="the model name the loading run records, e.g. resnet20 or "
                        "'mlp 784-512-256-10'")
    parser.add_argument("--step", type=int, default=0, help="the step to continue from")
    parser.add_argument("--prefix", default="model", help="registered name of the model")
    parser.add_argument("--key", default=None, help="take the state dict under this key")
    parser.add_argument("--hierarchy", default="",
                        help="recorded hierarchy, for information (a partial checkpoint "
                        "constrains no run's hierarchy)")
    parser.add_argument("--proto", default=ckpt.DEFAULT_PROTO, help="checkpoint.proto")
    args = parser.parse_args()
    try:
        checkpoint, count = import_state_dict(args.state_dict, args.dir, args.model, args.step,
                                              args.prefix, args.key, hierarchy=args.hierarchy,
                                              proto=args.proto)
    except ckpt.CheckpointError as e:
        print("import_torch.py: error: %s" % e, file=sys.stderr)
        return 1
    print("imported %d tensors of %s into %s (model '%s'; a partial checkpoint: the optimizer "
          "and the rest start fresh)" % (count, args.state_dict, checkpoint, args.model))
    return 0


if __name__ == "__main__":
    sys.exit(main())
