#!/usr/bin/env bash
# scripts/check_layers.py must (1) pass on this repository and (2) fail on an include that points
# up a layer, up the order of comm/'s subsystems or into another's detail/, naming the file and
# line. Usage: check_layers_test.sh SOURCE_DIR
set -euo pipefail
src=$1
check=$src/scripts/check_layers.py
python=/usr/bin/python3
[ -x "$python" ] || python=python3

"$python" "$check" "$src"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp"/{comm/store,comm/rendezvous,comm/process_group/detail,comm/elastic,comm/launcher} \
  "$tmp"/{comm/extra,framework,optim,models,apps,tests/comm/process_group}
printf '#pragma once\n' > "$tmp/comm/process_group/detail/queue.h"
printf '#include "comm/process_group/detail/queue.h"\n' > "$tmp/comm/process_group/ok.cpp"
printf '#include "comm/process_group/detail/queue.h"\n' > "$tmp/tests/comm/process_group/ok_test.cpp"
printf '#include "comm/error.h"\n#include "comm/process_group/detail/queue.h"\n' > "$tmp/comm/store/bad.cpp"
printf '#include "comm/process_group/detail/queue.h"\n' > "$tmp/apps/bad.cpp"
printf '#pragma once\n#include "comm/error.h"\n#include <vector>\n' > "$tmp/framework/ok.h"
printf '#include "framework/ok.h"\n#include "optim/sgd.h"\n' > "$tmp/models/bad.cpp"
printf '// a comment\n#include "comm/log.h"\n#include "framework/tensor/tensor.h"\n' > "$tmp/comm/bad.h"
printf '#include "hsgd.h"\n' > "$tmp/optim/umbrella.cpp"
# comm/'s order: base < store < rendezvous < process_group < elastic < launcher.
printf '#include "comm/error.h"\n#include "comm/launcher/agent.h"\n' > "$tmp/comm/process_group/up.cpp"
printf '#include "comm/rendezvous/proto/rendezvous.pb.h"\n' > "$tmp/comm/store/up.h"
printf '#include "comm/log.h"\n#include "comm/store/store.h"\n' > "$tmp/comm/up.cpp"
printf '#include "comm/extra/thing.h"\n' > "$tmp/comm/launcher/unplaced.cpp"
printf '#pragma once\n' > "$tmp/comm/extra/thing.h"
printf '#include "comm/process_group/process_group.h"\n#include "comm/store/store.h"\n' \
  > "$tmp/comm/elastic/ok.cpp"
printf '#include "comm/elastic/membership.h"\n#include "comm/format_ranks.h"\n' > "$tmp/comm/launcher/ok.cpp"
printf '#include "comm/rendezvous/proto/rendezvous.pb.h"\n#include "comm/store/store.h"\n' \
  > "$tmp/comm/rendezvous/ok.cpp"
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
grep -q '^comm/process_group/up.cpp:2: comm/process_group includes "comm/launcher/agent.h" (subsystem launcher is above process_group' <<<"$out" \
  || fail "process_group -> launcher not named"
grep -q '^comm/store/up.h:1: comm/store includes "comm/rendezvous/proto/rendezvous.pb.h" (subsystem rendezvous is above store' <<<"$out" \
  || fail "store -> rendezvous/proto not named"
grep -q "^comm/up.cpp:2: comm's base includes \"comm/store/store.h\"" <<<"$out" || fail "base -> store not named"
grep -q '^comm/extra/thing.h:1: comm/extra/ is not a subsystem of comm/' <<<"$out" || fail "unplaced comm/extra/ not named"
grep -q '^comm/launcher/unplaced.cpp:1: comm/launcher includes "comm/extra/thing.h" (comm/extra/ is not a subsystem' <<<"$out" \
  || fail "include of unplaced comm/extra/ not named"
n=$(grep -c '^comm/' <<<"$out")
[ "$n" -eq 8 ] || fail "$n violations under comm/, expected 8 (2 on comm/store/bad.cpp, none on ok.cpp)"
if grep -q 'framework/ok.h\|ok.cpp\|ok_test.cpp' <<<"$out"; then fail "an allowed include was reported"; fi
echo "check_layers_test: ok"
