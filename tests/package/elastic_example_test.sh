#!/usr/bin/env bash
# Usage: elastic_example_test.sh SOURCE_DIR BUILD_DIR PACKAGE_BUILD_DIR
# docs/elastic.md's "Your own program", built against the exported package
# (tests/package/elastic_example.cpp, which must equal the page's block), runs under
# hsgd-run --nnodes 1:2 on two loopback nodes of one worker each: both hsgd-runs exit 0, both
# workers print the same replica hash at the same step (the runtime keeps the average of the
# replicas at the end), and ckpt/ holds a complete checkpoint. Every process is stopped by pid.
set -euo pipefail
src=$1
build=$2
package=$3
# shellcheck source=tests/e2e/e2e_lib.sh
source "$src/tests/e2e/e2e_lib.sh"
e2e_init elastic_example
program=$package/elastic_example
[ -x "$program" ] || fail "$program was not built (package_find_package builds it)"
/usr/bin/python3 - "$src" <<'PY' || fail "tests/package/elastic_example.cpp differs from docs/elastic.md's program"
import re, sys
src = sys.argv[1]
page = open(f"{src}/docs/elastic.md").read()
block = re.search(r"```cpp\n(.*?)```", page[page.index("## Your own program"):], re.S).group(1)
code = open(f"{src}/tests/package/elastic_example.cpp").read()
sys.exit(0 if code.endswith(block) else 1)
PY
e2e_start_rendezvous
cd "$work"
for n in 0 1; do
  timeout 200 "$run" --nnodes 1:2 --nproc-per-node 1 --rdzv-endpoint "$endpoint" \
    --rdzv-last-call 2 --heartbeat-timeout 3 --rdzv-id example -- "$program" >"$work/node.$n" 2>&1 &
  pids+=($!)
  if [ "$n" -eq 0 ]; then wait_registered "$work/node.0"; fi
done
expect_exit "${pids[-2]}" 0 "$work/node.0"
expect_exit "${pids[-1]}" 0 "$work/node.1"
h0=$(grep -Eo 'replica hash [0-9]+ at step [0-9]+' "$work/node.0" || true)
h1=$(grep -Eo 'replica hash [0-9]+ at step [0-9]+' "$work/node.1" || true)
[ -n "$h0" ] || fail "node 0 printed no replica hash: $(tail -n 20 "$work/node.0")"
[ "$h0" = "$h1" ] || fail "the replicas differ at the end: node 0 '$h0', node 1 '$h1'"
ls "$work"/ckpt/step_*/manifest >/dev/null 2>&1 || fail "no complete checkpoint in $work/ckpt"
echo "elastic_example: 2 nodes, $h0 on both"
