#!/usr/bin/env bash
# scripts/check_layers.py must (1) pass on this repository and (2) fail on an include that points
# up a layer, naming the file and line. Usage: check_layers_test.sh SOURCE_DIR
set -euo pipefail
src=$1
check=$src/scripts/check_layers.py
python=/usr/bin/python3
[ -x "$python" ] || python=python3

"$python" "$check" "$src"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp"/{comm/store,comm/process_group/detail,framework,optim,models,apps,tests/comm/process_group}
printf '#pragma once\n' > "$tmp/comm/process_group/detail/queue.h"
printf '#include "comm/process_group/detail/queue.h"\n' > "$tmp/comm/process_group/ok.cpp"
printf '#include "comm/process_group/detail/queue.h"\n' > "$tmp/tests/comm/process_group/ok_test.cpp"
printf '#include "comm/error.h"\n#include "comm/process_group/detail/queue.h"\n' > "$tmp/comm/store/bad.cpp"
printf '#include "comm/process_group/detail/queue.h"\n' > "$tmp/apps/bad.cpp"
printf '#pragma once\n#include "comm/error.h"\n#include <vector>\n' > "$tmp/framework/ok.h"
printf '#include "framework/ok.h"\n#include "optim/sgd.h"\n' > "$tmp/models/bad.cpp"
printf '// a comment\n#include "comm/log.h"\n#include "framework/tensor/tensor.h"\n' > "$tmp/comm/bad.h"
printf '#include "hsgd.h"\n' > "$tmp/optim/umbrella.cpp"
set +e
out=$("$python" "$check" "$tmp")
rc=$?
set -e
echo "$out"
fail() { echo "check_layers_test: $*"; exit 1; }
[ "$rc" -eq 1 ] || fail "exit code $rc on a tree with upward includes, expected 1"
grep -q '^models/bad.cpp:2: models includes "optim/sgd.h"' <<<"$out" || fail "models -> optim not named"
grep -q '^comm/bad.h:3: comm includes "framework/tensor/tensor.h"' <<<"$out" || fail "comm -> framework not named"
grep -q '^optim/umbrella.cpp:1: optim includes "hsgd.h"' <<<"$out" || fail "optim -> hsgd.h not named"
grep -q '^comm/store/bad.cpp:2: includes "comm/process_group/detail/queue.h" (internal to comm/process_group/' <<<"$out" \
  || fail "store -> process_group's detail/ not named"
grep -q '^apps/bad.cpp:1: includes "comm/process_group/detail/queue.h"' <<<"$out" \
  || fail "apps -> process_group's detail/ not named"
if grep -q 'framework/ok.h\|ok.cpp\|ok_test.cpp' <<<"$out"; then fail "an allowed include was reported"; fi
echo "check_layers_test: ok"
