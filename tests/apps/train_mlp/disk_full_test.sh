#!/usr/bin/env bash
# A checkpoint directory on a full disk (a 1 MiB tmpfs; train_mlp's checkpoint needs about 4 MB):
# the worker stops at its first checkpoint with exit code 78 (kExitWillRepeat: a restart would
# fail the same way), its error names the file, the bytes it needs and the bytes free, and no
# step_N/ is left behind; the same under hsgd-run with 2 workers, where the root cause is that
# exit code. Needs root for the mount: skipped (exit 77) otherwise.
# Usage: disk_full_test.sh BUILD_DIR
set -euo pipefail
build=$1
mlp=$build/apps/train_mlp/train_mlp
run=$build/apps/hsgd-run/hsgd-run
if [ "$(id -u)" -ne 0 ]; then
  echo "disk_full_test: skipped: mounting a small tmpfs needs root"
  exit 77
fi
tmp=$(mktemp -d)
mnt=$tmp/mnt
mkdir -p "$mnt"
if ! mount -t tmpfs -o size=1m tmpfs "$mnt" 2> "$tmp/mount.log"; then
  echo "disk_full_test: skipped: cannot mount a tmpfs: $(cat "$tmp/mount.log")"
  rm -rf "$tmp"
  exit 77
fi
cleanup() {
  umount -l "$mnt" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

fail() {
  cat "$tmp/run.log"
  echo "disk_full_test: $1"
  exit 1
}
no_step_dirs() {
  local left
  left=$(find "$mnt/ckpt" -mindepth 1 -maxdepth 1 -name 'step_*' 2>/dev/null)
  [ -z "$left" ] || fail "$1: half-made checkpoints left: $left"
}
train=(--synthetic --max-steps 3 --checkpoint-dir "$mnt/ckpt" --checkpoint-every 1)

rc=0
timeout 100 "$mlp" "${train[@]}" > "$tmp/run.log" 2>&1 || rc=$?
[ "$rc" -eq 78 ] || fail "one process: exit code $rc, expected 78"
grep -Eq "error: checkpoint: no space for '$mnt/ckpt/step_1/rank_0': it needs [0-9]{7} bytes, the file system of '[^']*' has [0-9]+ bytes free" "$tmp/run.log" ||
  fail "one process: the error does not name the file, the bytes needed and the bytes free"
no_step_dirs "one process"

rc=0
timeout 150 "$run" --nproc-per-node 2 --max-restarts 2 -- "$mlp" "${train[@]}" > "$tmp/run.log" 2>&1 || rc=$?
[ "$rc" -eq 78 ] || fail "hsgd-run: exit code $rc on a full disk, expected 78"
grep -q "stopped without restarting (2 of 2 --max-restarts left unused)" "$tmp/run.log" ||
  fail "hsgd-run spent restarts on a failure that a restart would repeat"
grep -Eq "Root cause: rank [01] .* failed with exit code 78" "$tmp/run.log" ||
  fail "hsgd-run: the root cause is not a worker's exit code 78"
no_step_dirs "hsgd-run"
echo "disk_full_test: ok"
