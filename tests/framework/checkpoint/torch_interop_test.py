#!/usr/bin/python3
"""scripts/export_torch.py and scripts/import_torch.py against PyTorch (ctest, one case per run).

    torch_interop_test.py CASE BUILD_DIR SOURCE_DIR

Cases:
  export_mlp       train_mlp (784-512-256-10, 32 steps) writes checkpoints; the export loads
                   strictly into the torch MLP, whose logits on a fixed batch equal hsgd's
                   (tests/.../checkpoint_logits) to 1e-5; a model that did not load differs; a
                   flipped byte in the rank file makes the export fail naming the file.
  export_resnet20  the same for train_resnet --model resnet20 --max-steps 2 (eval mode: BatchNorm
                   with the trained running statistics) and tests/golden_resnet/torch_resnet.py.
  export_generator_state
                   an entry holding a module generator's bytes is left out of the export (the
                   torch model loads it strictly), another non-tensor entry is refused.
  import_mlp       a torch MLP 784-64-32-10 -> import_torch.py -> hsgd's logits equal torch's;
                   train_mlp --resume it at --lr 0 for one epoch (the partial checkpoint loads
                   the model, the optimizer starts fresh) -> its checkpoint exported again equals
                   the torch weights exactly, names and order included.
  import_mlp_hierarchical
                   the imported MLP resumes train_mlp --mode hierarchical --hierarchy 2:2,8:world
                   alone and under hsgd-run with 2 workers at --lr 0: every rank's exported
                   model equals the torch weights exactly.
  import_resnet20  the same with ResNet-20 whose BatchNorm statistics are randomised; after one
                   train_resnet step at --lr 0 the parameters are exactly the torch ones and
                   num_batches_tracked advanced by one (the imported buffers were loaded).
Exit 0 on success, 1 on a failed check (the message says which values), 77 (skip) when
/usr/bin/python3 cannot import torch or protobuf.
"""
import os
import shutil
import struct
import subprocess
import sys
import tempfile

try:
    import torch
    import torch.nn as nn
    import google.protobuf  # noqa: F401
except ImportError as e:
    print("SKIP: %s (needs python3-torch and python3-protobuf)" % e)
    sys.exit(77)

TOLERANCE = 1e-5


class Failure(Exception):
    pass


def check(cond, message):
    if not cond:
        raise Failure(message)


def run(cmd, timeout=180):
    """Runs cmd; fails with its output when the exit status is not 0. Returns stdout."""
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout,
                       text=True)
    check(p.returncode == 0, "exit status %d of %s:\n%s" % (p.returncode, " ".join(cmd), p.stdout))
    return p.stdout


class TorchMLP(nn.Module):
    """hsgd's models::MLP: Flatten, then fc1..fck = Linear with ReLU between them."""

    def __init__(self, sizes):
        super().__init__()
        self.num_layers = len(sizes) - 1
        for i in range(self.num_layers):
            setattr(self, "fc%d" % (i + 1), nn.Linear(sizes[i], sizes[i + 1]))

    def forward(self, x):
        h = x.flatten(1)
        for i in range(self.num_layers):
            h = getattr(self, "fc%d" % (i + 1))(h)
            if i + 1 < self.num_layers:
                h = torch.relu(h)
        return h


class Env:
    def __init__(self, build, source):
        self.build, self.source = build, source
        self.tmp = tempfile.mkdtemp(prefix="hsgd_torch_interop_")
        sys.path.insert(0, os.path.join(source, "tests", "golden_resnet"))

    def app(self, name):
        return os.path.join(self.build, "apps", name, name)

    def script(self, name):
        return [sys.executable, os.path.join(self.source, "scripts", name)]

    def path(self, name):
        return os.path.join(self.tmp, name)

    def export(self, checkpoint, out):
        run(self.script("export_torch.py") + [checkpoint, out])
        return torch.load(out)

    def hsgd_logits(self, checkpoint, x):
        """checkpoint_logits on x: hsgd's eval-mode logits of the checkpoint's model."""
        inp, out = self.path("input.bin"), self.path("logits.bin")
        with open(inp, "wb") as f:
            f.write(struct.pack("<q", x.dim()) + struct.pack("<%dq" % x.dim(), *x.shape))
            f.write(x.contiguous().numpy().astype("<f4").tobytes())
        run([os.path.join(self.build, "tests", "framework", "checkpoint", "checkpoint_logits"),
             checkpoint, inp, out])
        with open(out, "rb") as f:
            data = f.read()
        ndim = struct.unpack_from("<q", data)[0]
        shape = struct.unpack_from("<%dq" % ndim, data, 8)
        values = torch.frombuffer(bytearray(data[8 + 8 * ndim:]), dtype=torch.float32)
        return values.reshape(shape)


def torch_logits(model, x):
    model.eval()
    with torch.no_grad():
        return model(x)


def compare_logits(env, checkpoint, model, x, what):
    ours, theirs = env.hsgd_logits(checkpoint, x), torch_logits(model, x)
    check(ours.shape == theirs.shape, "%s: logits shape %s (hsgd) vs %s (torch)" %
          (what, tuple(ours.shape), tuple(theirs.shape)))
    diff = (ours - theirs).abs()
    worst = int(diff.flatten().argmax())
    print("%s: logits %s, max |hsgd - torch| = %.3g (tolerance %g)" %
          (what, tuple(ours.shape), float(diff.max()), TOLERANCE))
    check(float(diff.max()) <= TOLERANCE,
          "%s: logits differ at flat index %d: hsgd %.8g, torch %.8g" %
          (what, worst, float(ours.flatten()[worst]), float(theirs.flatten()[worst])))
    check(float(theirs.std()) > 1e-3, "%s: degenerate logits (std %g)" % (what, theirs.std()))
    return ours


def newest(root):
    steps = [int(n[5:]) for n in os.listdir(root)
             if n.startswith("step_") and os.path.exists(os.path.join(root, n, "manifest"))]
    check(steps, "no complete checkpoint in %s: %s" % (root, os.listdir(root)))
    return os.path.join(root, "step_%d" % max(steps))


def expect_damage_named(env, checkpoint):
    damaged = env.path("damaged")
    shutil.copytree(checkpoint, damaged)
    rank_file = os.path.join(damaged, "rank_0")
    with open(rank_file, "r+b") as f:
        f.seek(os.path.getsize(rank_file) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x20]))
    p = subprocess.run(env.script("export_torch.py") + [damaged, env.path("damaged.pt")],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    check(p.returncode == 1 and rank_file in p.stdout and "corrupt" in p.stdout,
          "a flipped byte: expected exit 1 naming %s as corrupt, got %d: %s" %
          (rank_file, p.returncode, p.stdout))
    check(not os.path.exists(env.path("damaged.pt")), "a damaged checkpoint was exported")


def case_export_mlp(env):
    root = env.path("mlp")
    run([env.app("train_mlp"), "--synthetic", "--epochs", "1", "--batch-size", "256",
         "--checkpoint-dir", root, "--checkpoint-every", "8"])
    checkpoint = newest(root)
    state = env.export(root, env.path("mlp.pt"))  # the directory: its newest checkpoint
    model = TorchMLP([784, 512, 256, 10])
    model.load_state_dict(state, strict=True)
    x = torch.randn(16, 1, 28, 28, generator=torch.Generator().manual_seed(1))
    compare_logits(env, checkpoint, model, x, "export mlp 784-512-256-10")
    fresh = TorchMLP([784, 512, 256, 10])
    check(float((torch_logits(fresh, x) - torch_logits(model, x)).abs().max()) > 1e-3,
          "a torch model that did not load the export has the same logits")
    expect_damage_named(env, checkpoint)


def case_export_resnet20(env):
    import torch_resnet
    root = env.path("resnet20")
    run([env.app("train_resnet"), "--synthetic", "--model", "resnet20", "--max-steps", "2",
         "--batch-size", "32", "--max-eval", "32", "--checkpoint-dir", root,
         "--checkpoint-every", "2"])
    checkpoint = newest(root)
    state = env.export(checkpoint, env.path("resnet20.pt"))
    check(state["bn1.num_batches_tracked"].dtype == torch.int64 and
          int(state["bn1.num_batches_tracked"]) == 2,
          "bn1.num_batches_tracked: %r, expected int64 2" % state["bn1.num_batches_tracked"])
    model = torch_resnet.resnet_cifar(20)
    model.load_state_dict(state, strict=True)
    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    compare_logits(env, checkpoint, model, x, "export resnet20")


def import_and_compare(env, model, name, x):
    """Saves model's state dict, imports it, compares hsgd's logits; returns the checkpoint."""
    torch.save(model.state_dict(), env.path("torch.pt"))
    root = env.path("imported")
    out = run(env.script("import_torch.py") + [env.path("torch.pt"), root, "--model", name])
    check("step_0" in out, "import_torch.py printed: %s" % out)
    checkpoint = os.path.join(root, "step_0")
    compare_logits(env, checkpoint, model, x, "import " + name)
    return checkpoint


def expect_resumed(out, checkpoint):
    check("resumed from %s" % checkpoint in out, "no 'resumed from %s' line in:\n%s" %
          (checkpoint, out))


def case_import_mlp(env):
    torch.manual_seed(3)
    model = TorchMLP([784, 64, 32, 10])
    x = torch.randn(8, 784, generator=torch.Generator().manual_seed(4))
    checkpoint = import_and_compare(env, model, "mlp 784-64-32-10", x)
    root = env.path("finetune")
    out = run([env.app("train_mlp"), "--synthetic", "--epochs", "1", "--hidden", "64,32",
               "--batch-size", "256", "--lr", "0", "--checkpoint-dir", root, "--resume",
               checkpoint])
    expect_resumed(out, checkpoint)
    state = env.export(root, env.path("roundtrip.pt"))
    original = model.state_dict()
    check(list(state) == list(original), "names after the round trip: %s, expected %s" %
          (list(state), list(original)))
    for name, t in original.items():
        check(torch.equal(state[name], t), "%s changed in the round trip (max diff %g)" %
              (name, float((state[name] - t).abs().max())))


def case_import_mlp_hierarchical(env):
    """The imported (partial, one-rank) checkpoint starts a hierarchical run alone and on 2
    workers under hsgd-run: neither the hierarchy nor the world size it was written with (none,
    1) constrains it. At --lr 0 every rank's final model equals the torch weights exactly."""
    torch.manual_seed(7)
    model = TorchMLP([784, 64, 32, 10])
    x = torch.randn(8, 784, generator=torch.Generator().manual_seed(8))
    checkpoint = import_and_compare(env, model, "mlp 784-64-32-10", x)
    original = model.state_dict()
    train = [env.app("train_mlp"), "--synthetic", "--epochs", "1", "--hidden", "64,32",
             "--batch-size", "256", "--lr", "0", "--mode", "hierarchical", "--hierarchy",
             "2:2,8:world", "--resume", checkpoint]
    runs = [("alone", [], 1),
            ("2 workers", [os.path.join(env.build, "apps", "hsgd-run", "hsgd-run"),
                           "--nproc-per-node", "2", "--"], 2)]
    for what, launcher, world in runs:
        root = env.path("hierarchical_%d" % world)
        out = run(launcher + train + ["--checkpoint-dir", root])
        expect_resumed(out, checkpoint)
        for rank in range(world):
            out_pt = env.path("hierarchical_%d_rank%d.pt" % (world, rank))
            run(env.script("export_torch.py") + [root, out_pt, "--rank", str(rank)])
            state = torch.load(out_pt)
            check(list(state) == list(original), "%s, rank %d: names %s, expected %s" %
                  (what, rank, list(state), list(original)))
            for name, t in original.items():
                check(torch.equal(state[name], t), "%s, rank %d: %s is not the imported "
                      "weight (max diff %g)" % (what, rank, name,
                                                float((state[name] - t).abs().max())))
        print("import mlp, hierarchical run %s: every rank starts from the torch weights" % what)


def case_export_generator_state(env):
    """A model entry holding bytes (a module's generator, e.g. nn::Dropout's "2.generator") is
    left out of the export, so the torch model still loads it strictly; an entry of another
    non-tensor kind is still refused naming it."""
    sys.path.insert(0, os.path.join(env.source, "scripts"))
    import hsgd_checkpoint as ckpt
    torch.manual_seed(9)
    model = TorchMLP([784, 16, 10])
    torch.save(model.state_dict(), env.path("torch.pt"))
    root = env.path("with_generator")
    run(env.script("import_torch.py") + [env.path("torch.pt"), root, "--model", "mlp"])
    checkpoint = os.path.join(root, "step_0")
    pb = ckpt.load_proto_module(os.path.join(env.source, "framework", "checkpoint",
                                             "checkpoint.proto"))

    def add_entry(key, **value):
        manifest = ckpt.read_manifest(pb, checkpoint)
        state = ckpt.read_rank_state(pb, checkpoint, manifest, 0)
        entry = state.entries.add()
        entry.key = key
        for kind, v in value.items():
            setattr(entry.value, kind, v)
        size, crc = ckpt.write_envelope(pb, os.path.join(checkpoint, "rank_0"), ckpt.RANK_KIND,
                                        state.SerializeToString())
        manifest.files[0].size, manifest.files[0].crc32 = size, crc
        ckpt.write_envelope(pb, os.path.join(checkpoint, "manifest"), ckpt.MANIFEST_KIND,
                            manifest.SerializeToString())

    add_entry("model.1.generator", blob=bytes(range(41)))
    p = subprocess.run(env.script("export_torch.py") + [checkpoint, env.path("out.pt")],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    check(p.returncode == 0, "export with a generator entry failed: %s" % p.stdout)
    check("1.generator" in p.stdout, "no note naming the left-out generator: %s" % p.stdout)
    state = torch.load(env.path("out.pt"))
    TorchMLP([784, 16, 10]).load_state_dict(state, strict=True)
    check(all(torch.equal(state[k], v) for k, v in model.state_dict().items()),
          "the exported tensors are not the imported ones")
    add_entry("model.count", integer=3)
    p = subprocess.run(env.script("export_torch.py") + [checkpoint, env.path("bad.pt")],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    check(p.returncode == 1 and "model.count" in p.stdout,
          "an integer model entry: expected exit 1 naming it, got %d: %s" %
          (p.returncode, p.stdout))


def case_import_resnet20(env):
    import torch_resnet
    torch.manual_seed(5)
    model = torch_resnet.resnet_cifar(20)
    for m in model.modules():  # statistics that matter in eval mode
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            m.num_batches_tracked.fill_(7)
    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(6))
    checkpoint = import_and_compare(env, model, "resnet20", x)
    root = env.path("finetune")
    out = run([env.app("train_resnet"), "--synthetic", "--model", "resnet20", "--max-steps", "1",
               "--batch-size", "16", "--max-eval", "16", "--lr", "0", "--checkpoint-dir", root,
               "--checkpoint-every", "1", "--resume", checkpoint])
    expect_resumed(out, checkpoint)
    state = env.export(root, env.path("roundtrip.pt"))
    original = model.state_dict()
    check(list(state) == list(original), "names after the round trip differ")
    for name, p in model.named_parameters():
        check(torch.equal(state[name], p.detach()), "parameter %s changed at --lr 0 (max diff %g)"
              % (name, float((state[name] - p.detach()).abs().max())))
    check(int(state["bn1.num_batches_tracked"]) == 8,
          "bn1.num_batches_tracked %d after one step from the imported 7, expected 8" %
          int(state["bn1.num_batches_tracked"]))


CASES = {"export_mlp": case_export_mlp, "export_resnet20": case_export_resnet20,
         "export_generator_state": case_export_generator_state,
         "import_mlp": case_import_mlp, "import_mlp_hierarchical": case_import_mlp_hierarchical,
         "import_resnet20": case_import_resnet20}


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in CASES:
        print("usage: torch_interop_test.py {%s} BUILD_DIR SOURCE_DIR" % ",".join(CASES))
        return 2
    torch.set_num_threads(1)
    env = Env(sys.argv[2], sys.argv[3])
    try:
        CASES[sys.argv[1]](env)
    except Failure as e:
        print("FAILED: %s" % e)
        return 1
    finally:
        shutil.rmtree(env.tmp, ignore_errors=True)
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
