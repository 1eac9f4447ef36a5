#!/usr/bin/python3
"""Exports the model of an hsgd checkpoint as a PyTorch state_dict file (torch.save).

    /usr/bin/python3 scripts/export_torch.py CHECKPOINT OUT.pt [--rank R] [--prefix model]

CHECKPOINT is one checkpoint (DIR/step_<N>) or a checkpoint directory DIR, whose newest complete
checkpoint is used. The entries "<prefix>.<dotted name>" of rank R's file (default rank 0,
prefix "model", the name the bundled examples register their model under) become the state dict
{"<dotted name>": tensor}, in the checkpoint's order, so that the equivalent PyTorch model loads
it with load_state_dict(..., strict=True):
  - models::MLP "mlp 784-512-256-10": fc1, fc2, fc3 = nn.Linear, ReLU between them (nn.Flatten
    first; it has no state);
  - models::ResNet: tests/golden_resnet/torch_resnet.py (torchvision's names).
  - models::GPT (train_gpt): models/gpt_torch.py's GPT with the same sizes.
Tensors are float32; "num_batches_tracked" (float32 in hsgd) becomes int64 as in torch's
BatchNorm. The model's random streams (entries holding bytes: the state of a generator a module
registered, e.g. "<name>.generator" of nn::Dropout) are left out with a note: torch's modules
hold no such state (torch.nn.Dropout draws from the global generator), so a torch model loads
the state dict strictly without them. Every file is checked as the C++ reader checks it (envelope kind and version, payload
size, crc32, the manifest's crc32 of the rank file, rank and step) before anything is written.
In a run whose replicas differ (local SGD between averagings) each rank holds its own model:
--rank picks one.

Needs Debian's python3-torch, python3-protobuf and protoc (protobuf-compiler): the Python classes
of framework/checkpoint/checkpoint.proto are generated into a temporary directory at each run.
Exit status: 0 on success, 1 with a message naming the file on any error.
"""
import argparse
import collections
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hsgd_checkpoint as ckpt  # noqa: E402

# hsgd keeps every buffer as float32; torch holds these as int64.
INT64_SUFFIXES = ("num_batches_tracked",)


def tensor_of(torch, key, value, path):
    shape = list(value.shape)
    numel = 1
    for d in shape:
        if d < 0:
            raise ckpt.CheckpointError("'%s': entry '%s' has a negative dimension" % (path, key))
        numel *= d
    if len(value.data) != 4 * numel:
        raise ckpt.CheckpointError("'%s': entry '%s' holds %d bytes, its shape needs %d" %
                                   (path, key, len(value.data), 4 * numel))
    if numel == 0:
        return torch.zeros(shape, dtype=torch.float32)
    # The format is little-endian float32, torch's layout on the machines hsgd supports.
    return torch.frombuffer(bytearray(value.data), dtype=torch.float32).reshape(shape)


def export(checkpoint, output, rank=0, prefix="model", proto=ckpt.DEFAULT_PROTO):
    """Writes the state dict to output; returns (checkpoint path used, state dict)."""
    import torch
    if sys.byteorder != "little":
        raise ckpt.CheckpointError("this script reads the little-endian format on little-endian "
                                   "machines only")
    pb = ckpt.load_proto_module(proto)
    checkpoint = ckpt.resolve_checkpoint(checkpoint)
    manifest = ckpt.read_manifest(pb, checkpoint)
    rank_state = ckpt.read_rank_state(pb, checkpoint, manifest, rank)
    path = os.path.join(checkpoint, ckpt.rank_file_name(rank))
    state = collections.OrderedDict()
    skipped = []
    for entry in rank_state.entries:
        if not entry.key.startswith(prefix + "."):
            continue
        name = entry.key[len(prefix) + 1:]
        if entry.value.WhichOneof("kind") == "blob":
            skipped.append(name)  # a generator's state; torch modules hold none
            continue
        if entry.value.WhichOneof("kind") != "tensor":
            raise ckpt.CheckpointError("'%s': entry '%s' holds a %s, a model entry must be a "
                                       "tensor" % (path, entry.key,
                                                   entry.value.WhichOneof("kind")))
        t = tensor_of(torch, entry.key, entry.value.tensor, path)
        if name.endswith(INT64_SUFFIXES):
            if not torch.equal(t, t.round()):
                raise ckpt.CheckpointError("'%s': entry '%s' is not an integer" %
                                           (path, entry.key))
            t = t.to(torch.int64)
        state[name] = t
    if not state:
        prefixes = sorted({e.key.split(".", 1)[0] for e in rank_state.entries})
        raise ckpt.CheckpointError("'%s' has no entries '%s.*' (it has: %s)" %
                                   (path, prefix, ", ".join(prefixes) or "none"))
    if skipped:
        print("export_torch.py: note: left out the state of %d random stream(s) (%s), which "
              "torch modules do not hold" % (len(skipped), ", ".join(skipped)), file=sys.stderr)
    torch.save(state, output)
    return checkpoint, state


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint", help="DIR/step_<N>, or DIR for its newest complete one")
    parser.add_argument("output", help="the state_dict file to write (torch.save)")
    parser.add_argument("--rank", type=int, default=0, help="whose model (default 0)")
    parser.add_argument("--prefix", default="model",
                        help="the name the model was registered under (default: model)")
    parser.add_argument("--proto", default=ckpt.DEFAULT_PROTO, help="checkpoint.proto")
    args = parser.parse_args()
    try:
        checkpoint, state = export(args.checkpoint, args.output, args.rank, args.prefix,
                                   args.proto)
    except ckpt.CheckpointError as e:
        print("export_torch.py: error: %s" % e, file=sys.stderr)
        return 1
    numel = sum(t.numel() for t in state.values())
    print("exported %d tensors (%d values) of rank %d of %s to %s" %
          (len(state), numel, args.rank, checkpoint, args.output))
    return 0


if __name__ == "__main__":
    sys.exit(main())
