# shellcheck shell=bash disable=SC2154,SC2034  # build: the sourcing script's; run, mlp: for it
# What the loopback end-to-end scripts share (sourced after `src` and `build` are set; not a
# test). Every wait is bounded.
#
#   e2e_init NAME         sets run, rdzv, mlp (the programs under $build), work (a new directory),
#                         pids (what the script starts; killed at exit) and the EXIT trap
#   fail MESSAGE          prints "NAME: FAILED: MESSAGE" and exits 1
#   e2e_finish RC         the EXIT trap: kills what `pids` holds, keeps `work` on failure, runs
#                         e2e_cleanup if the script defined it, exits RC
#   e2e_start_rendezvous [HOST PORT [NETNS]]
#                         starts hsgd-rendezvous (default 127.0.0.1, a free port; in network
#                         namespace NETNS when given) with the job's token file; sets `endpoint`
#                         and `rdzv_pid`
#   token_file            $work/token (mode 0600, made by e2e_init), exported as HSGD_TOKEN_FILE:
#                         every hsgd-run of the script keys its TLS with it
#   wait_for_line FILE REGEX WHAT  waits (60 s at most) until FILE has a line matching REGEX;
#                         fails "WHAT within 60 s" with FILE's last lines otherwise
#   node_id_of FILE       the node id that the hsgd-run writing FILE registered first
#   highest_step FILE     the highest "] step N loss" printed in FILE, 0 when none
#   wait_for_step FILE N  waits (60 s at most) until FILE printed step N or higher
#   wait_registered FILE  waits (10 s) until the hsgd-run writing FILE registered its node
#   hsgd_run_of PID       the hsgd-run under `timeout` pid PID
#   check_steps FILE      FILE's step lines are 1..N once each, in order; prints N
#   workers_of PID        the workers (children) of hsgd-run pid PID, sorted, on one line
#   expect_exit PID CODE FILE  waits for PID (an hsgd-run writing FILE); fails with FILE's last
#                         lines unless it exited CODE
#   need_tcpdump          installs Debian's tcpdump when it is missing (as root, bounded); exits
#                         77 (skip) saying why when it cannot be had

e2e_init() {
  e2e_name=$1
  run=$build/apps/hsgd-run/hsgd-run
  rdzv=$build/apps/hsgd-rendezvous/hsgd-rendezvous
  mlp=$build/apps/train_mlp/train_mlp
  work=$(mktemp -d "/tmp/hsgd-$1.XXXXXX")
  pids=()
  trap 'e2e_finish $?' EXIT
  token_file=$work/token
  (umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$token_file")
  export HSGD_TOKEN_FILE=$token_file
}

fail() { echo "$e2e_name: FAILED: $*" >&2; exit 1; }

e2e_finish() {
  local rc=$1 pid
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  if declare -F e2e_cleanup >/dev/null; then e2e_cleanup; fi
  if [ "$rc" -eq 0 ] || [ "$rc" -eq 77 ]; then
    rm -rf "$work"
  else
    echo "$e2e_name: output kept in $work" >&2
  fi
  exit "$rc"
}

e2e_start_rendezvous() {
  local host=${1:-127.0.0.1} port=${2:-0} netns=${3:-} out="$work/rdzv.out"
  [ -e "$out" ] && out="$work/rdzv.$(date +%s%N).out"
  if [ -n "$netns" ]; then
    ip netns exec "$netns" "$rdzv" --host "$host" --port "$port" --token-file "$token_file" \
      >"$out" 2>&1 &
  else
    "$rdzv" --host "$host" --port "$port" --token-file "$token_file" >"$out" 2>&1 &
  fi
  rdzv_pid=$!
  pids+=("$rdzv_pid")
  # The very line parsed below, whole: the log line "rendezvous: listening on ..." comes first.
  for _ in $(seq 100); do grep -qE '^listening on [^ ]+:[0-9]+$' "$out" && break; sleep 0.1; done
  endpoint=$(grep -E '^listening on ' "$out" | head -1 | awk '{print $3}')
  [ -n "$endpoint" ] || fail "hsgd-rendezvous did not start on $host:$port: $(cat "$out")"
}

wait_for_line() {
  for _ in $(seq 600); do
    grep -qE "$2" "$1" && return 0
    sleep 0.1
  done
  fail "$3 within 60 s: $(tail -n 5 "$1")"
}

node_id_of() {
  grep -oE "node [^ ]+ \('[^']*'\) registered" "$1" | head -n 1 | awk '{print $2}'
}

highest_step() {
  { grep -Eo '\] +step [0-9]+ loss' "$1" || true; } | grep -Eo '[0-9]+' | sort -n | tail -1 |
    { read -r s && echo "$s" || echo 0; }
}

wait_for_step() {
  for _ in $(seq 600); do
    [ "$(highest_step "$1")" -ge "$2" ] && return 0
    sleep 0.1
  done
  fail "no step $2 in $1 within 60 s: $(tail -n 5 "$1")"
}

# The order of registration is the order of node ranks, and rank 0 prints the step lines: a
# script that starts node 1 after wait_registered of node 0 knows where rank 0 is.
wait_registered() {
  for _ in $(seq 200); do
    grep -qE "registered \(slot [0-9]+\)" "$1" 2>/dev/null && return 0
    sleep 0.05
  done
  fail "the hsgd-run writing $1 did not register within 10 s: $(tail -n 5 "$1")"
}

# timeout forwards SIGTERM, not SIGUSR1 or SIGKILL: signals go to hsgd-run itself.
hsgd_run_of() {
  local child
  for _ in $(seq 50); do
    child=$(pgrep -P "$1" -x hsgd-run || true)
    [ -n "$child" ] && { echo "$child"; return 0; }
    sleep 0.1
  done
  fail "no hsgd-run under pid $1"
}

check_steps() {
  local got last
  last=$(highest_step "$1")
  got=$(grep -Eo '\] +step [0-9]+ loss' "$1" | grep -Eo '[0-9]+' | tr '\n' ' ')
  [ "$got" = "$(seq -s ' ' 1 "$last") " ] ||
    fail "rank 0's steps in $1 are not 1..$last once each: $(echo "$got" | head -c 300)"
  echo "$last"
}

workers_of() { pgrep -P "$1" | sort -n | tr '\n' ' '; }

expect_exit() {
  local rc=0
  wait "$1" || rc=$?
  [ "$rc" -eq "$2" ] || fail "hsgd-run ($3) exited $rc, expected $2: $(tail -n 30 "$3")"
}

need_tcpdump() {
  command -v tcpdump >/dev/null && return 0
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
    echo "$e2e_name: SKIPPED: no tcpdump, and no apt-get as root to install it"
    exit 77
  fi
  export DEBIAN_FRONTEND=noninteractive
  if ! timeout 90 apt-get install -y -qq --no-install-recommends tcpdump >/dev/null 2>&1; then
    timeout 45 apt-get update -qq >/dev/null 2>&1 || true
    timeout 90 apt-get install -y -qq --no-install-recommends tcpdump >/dev/null 2>&1 || true
  fi
  command -v tcpdump >/dev/null ||
    { echo "$e2e_name: SKIPPED: apt-get could not install tcpdump"; exit 77; }
}
