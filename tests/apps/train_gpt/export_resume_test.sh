#!/usr/bin/env bash
# train_gpt's checkpoints: a run resumed mid-epoch from a checkpoint ends with the same model as
# the uninterrupted run (hsgd-checkpoint diff, tolerance 0: the dropout masks and the shuffle
# resume exactly), and the exported model (scripts/export_torch.py) loads strictly into
# models/gpt_torch.py, where its validation loss over the same windows equals the "final test
# ... test_loss" that train_gpt printed. ~30 s.
# Usage: export_resume_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
src=$2
gpt=$build/apps/train_gpt/train_gpt
tool=$build/apps/hsgd-checkpoint/hsgd-checkpoint
text=$build/data/kjv.txt
[ -f "$text" ] || { echo "skip: $text was not built (no bible-kjv)"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
train=("$gpt" --text "$text" --d-model 32 --layers 2 --heads 2 --context 32 --batch-size 8
       --train-subset 96 --epochs 2 --max-eval 16 --log-every 4 --checkpoint-every 4
       --keep-checkpoints 10 --sample-tokens 0 --threads 1)

timeout 120 "${train[@]}" --checkpoint-dir "$tmp/reference" > "$tmp/reference.log" 2>&1 ||
  { cat "$tmp/reference.log"; echo "reference run failed"; exit 1; }
timeout 120 "${train[@]}" --checkpoint-dir "$tmp/resumed" --resume "$tmp/reference/step_16" \
  > "$tmp/resumed.log" 2>&1 || { cat "$tmp/resumed.log"; echo "resumed run failed"; exit 1; }
grep -q "resumed from $tmp/reference/step_16" "$tmp/resumed.log" ||
  { cat "$tmp/resumed.log"; echo "did not resume from step_16"; exit 1; }
"$tool" diff "$tmp/resumed/step_24" "$tmp/reference/step_24" --only model. --tolerance 0 |
  tail -1 || { echo "the resumed run's model differs from the uninterrupted run's"; exit 1; }
if "$tool" diff "$tmp/reference/step_20" "$tmp/reference/step_24" --only model. --tolerance 0 \
    > /dev/null 2>&1; then
  echo "two steps of one run have the same model: the diff cannot tell models apart"; exit 1
fi

loss=$(sed -n 's/^final test accuracy: [0-9.]*% test_loss \([0-9.]*\)$/\1/p' "$tmp/reference.log")
[ -n "$loss" ] || { cat "$tmp/reference.log"; echo "no final test_loss line"; exit 1; }
/usr/bin/python3 "$src/scripts/export_torch.py" "$tmp/reference/step_24" "$tmp/gpt.pt" \
  > "$tmp/export.log" 2>&1 || { cat "$tmp/export.log"; echo "export failed"; exit 1; }
/usr/bin/python3 - "$src/models" "$tmp/gpt.pt" "$text" "$loss" <<'PY'
import sys
import torch
import torch.nn.functional as F
sys.path.insert(0, sys.argv[1])
from gpt_torch import GPT
model = GPT(vocab_size=256, context=32, d_model=32, n_layers=2, n_heads=2, dropout=0.1)
model.load_state_dict(torch.load(sys.argv[2]), strict=True)
model.eval()
data = open(sys.argv[3], "rb").read()
val = data[int(len(data) * (1 - 0.1)):]
ids = torch.tensor(list(val[:16 * 32 + 1]), dtype=torch.long)
x = torch.stack([ids[i * 32:(i + 1) * 32] for i in range(16)])
y = torch.stack([ids[i * 32 + 1:(i + 1) * 32 + 1] for i in range(16)])
with torch.no_grad():
    loss = F.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1)).item()
printed = float(sys.argv[4])
print("PyTorch validation loss %.6f, train_gpt printed %.4f" % (loss, printed))
sys.exit(0 if abs(loss - printed) < 1e-3 else 1)
PY
echo "export_resume_test: ok"
