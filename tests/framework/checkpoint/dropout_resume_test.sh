#!/usr/bin/env bash
# A model with nn::Dropout, 2 workers under hsgd-run: one worker is SIGKILLed mid-run, hsgd-run
# restarts the job, which resumes from its newest complete checkpoint (dropout streams included)
# and finishes. Checks:
#   - hsgd-run exits 0 and the restarted attempt says "resumed from step N" with 0 < N < 64;
#   - every rank's final model equals an uninterrupted run's bitwise (hsgd-checkpoint diff,
#     tolerance 0); a control run with another seed differs, so the diff can fail;
#   - the manifest records the launcher's 2 workers per node ("local 2"), though the program
#     leaves RunInfo::local_world_size to the process group.
# Usage: dropout_resume_test.sh BUILD_DIR
set -euo pipefail
build=$1
run=$build/apps/hsgd-run/hsgd-run
worker=$build/tests/framework/checkpoint/dropout_worker
tool=$build/apps/hsgd-checkpoint/hsgd-checkpoint
tmp=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
steps=64
every=8
kill_step=29

timeout 120 "$run" --nproc-per-node 2 -- "$worker" "$tmp/reference" "$steps" "$every" 5 \
  > "$tmp/reference.log" 2>&1 || { cat "$tmp/reference.log"; echo "reference run failed"; exit 1; }

"$run" --nproc-per-node 2 --max-restarts 1 -- "$worker" "$tmp/killed" "$steps" "$every" 5 30 \
  > "$tmp/killed.log" 2>&1 &
launcher=$!
pids+=("$launcher")
deadline=$((SECONDS + 90))
until grep -q "^\[rank 0\] step $kill_step\$" "$tmp/killed.log" 2>/dev/null; do
  if ! kill -0 "$launcher" 2>/dev/null || [ $SECONDS -gt $deadline ]; then
    cat "$tmp/killed.log"; echo "rank 0 never reported step $kill_step"; exit 1
  fi
  sleep 0.01
done
mapfile -t workers < <(ps -o pid= --ppid "$launcher" | tr -d ' ')
[ ${#workers[@]} -eq 2 ] || { echo "expected 2 workers, found ${#workers[@]}"; exit 1; }
kill -9 "${workers[1]}"
echo "killed worker pid ${workers[1]} (rank 1) at rank 0's step $kill_step"
set +e
timeout 120 tail --pid="$launcher" -f /dev/null
wait "$launcher"
rc=$?
set -e
grep -v '\] step ' "$tmp/killed.log" || true
[ "$rc" -eq 0 ] || { echo "hsgd-run exited $rc after the kill, expected 0"; exit 1; }
resumed=$(sed -n 's/.*resumed from step \([0-9]*\)$/\1/p' "$tmp/killed.log" | head -1)
[ -n "$resumed" ] && [ "$resumed" -gt 0 ] && [ "$resumed" -lt "$steps" ] ||
  { echo "the restarted attempt did not resume mid-run (resumed: '${resumed}')"; exit 1; }
echo "resumed from step $resumed"
for rank in 0 1; do
  "$tool" diff "$tmp/killed/step_$steps" "$tmp/reference/step_$steps" --rank "$rank" \
    --only model. --tolerance 0 | tail -1 ||
    { echo "rank $rank's resumed model differs from the uninterrupted run's"; exit 1; }
done
"$tool" show "$tmp/killed/step_$steps" | head -1 | grep "world size 2 (local 2)" ||
  { "$tool" show "$tmp/killed/step_$steps" | head -1; echo "the manifest's local world size is not 2"; exit 1; }

timeout 120 "$run" --nproc-per-node 2 -- "$worker" "$tmp/control" "$steps" "$every" 6 \
  > "$tmp/control.log" 2>&1 || { cat "$tmp/control.log"; echo "control run failed"; exit 1; }
if "$tool" diff "$tmp/control/step_$steps" "$tmp/reference/step_$steps" --only model. \
    --tolerance 0 > "$tmp/control_diff.log" 2>&1; then
  echo "a run with another seed has the same model: the diff cannot tell runs apart"; exit 1
fi
echo "dropout_resume_test: ok"
