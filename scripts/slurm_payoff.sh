#!/usr/bin/env bash
# The payoff of hierarchical averaging under a real scheduler: a real 2-node Slurm cluster on this
# machine (tests/e2e/slurm_cluster.sh) whose node 1 sits behind a tbf-limited link, and the same
# sbatch script (scripts/slurm/hsgd_run_per_node.sbatch: one hsgd-run per node, 2 workers each)
# submitted twice, DDP and then hierarchical averaging, from the same start. Prints, side by side,
# rank 0's time for the epoch, the job's wall time, the bytes across node 1's link and the final
# accuracy, with the ratios hierarchical / DDP, and the link's physical limit for each job (its
# bytes at the rate).
#
#   scripts/slurm_payoff.sh                       # 100mbit, 30,000 Fashion-MNIST images
#   scripts/slurm_payoff.sh --rate 1gbit --subset 8192
#   scripts/slurm_payoff.sh --build DIR           # where the programs are (default: build)
#
# Needs root, network namespaces and the Slurm packages (installed with apt-get when missing);
# exits 77, saying why, where it cannot run. Everything it starts stops by pid.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build
rate=100mbit
subset=30000
hierarchical=(--mode hierarchical --subgroup-size 1 --hierarchy "1:2,16:4" --warmup-steps 20)
while [ $# -gt 0 ]; do
  case "$1" in
    --rate) rate=$2; shift 2 ;;
    --subset) subset=$2; shift 2 ;;
    --build) build=$(cd "$2" && pwd); shift 2 ;;
    -h | --help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "slurm_payoff.sh: unknown argument '$1' (expected --rate, --subset, --build)" >&2
       exit 2 ;;
  esac
done
[[ $rate =~ ^([0-9]+)(mbit|gbit)$ ]] ||
  { echo "slurm_payoff.sh: --rate '$rate': expected N followed by mbit or gbit" >&2; exit 2; }
rate_bytes_per_s=$((BASH_REMATCH[1] * 125000))
[ "${BASH_REMATCH[2]}" = gbit ] && rate_bytes_per_s=$((rate_bytes_per_s * 1000))
for p in hsgd-run/hsgd-run train_mlp/train_mlp; do
  [ -x "$build/apps/$p" ] ||
    { echo "slurm_payoff.sh: $build/apps/$p not built (build first: scripts/test.sh)" >&2; exit 2; }
done
[ -d /usr/share/datasets/fashion-mnist ] || {
  echo "slurm_payoff.sh: needs Fashion-MNIST in /usr/share/datasets/fashion-mnist (scripts/setup.sh)" >&2
  exit 2
}

# shellcheck source=tests/e2e/slurm_cluster.sh
source "$root/tests/e2e/slurm_cluster.sh"
work=""
finish() {
  local rc=$?
  slurm_cluster_stop || true
  [ -n "$work" ] && rm -rf "$work"
  exit "$rc"
}
trap finish EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
slurm_cluster_prepare slurm_payoff
work=$(mktemp -d "/tmp/hsgd-slurm-$$.payoff.XXXXXX")
chmod 755 "$work"
slurm_cluster_start 2

# Node 1's link, both ways: tbf on its end of the veth (what it sends) and on the bridge's port
# (what it receives); burst 10 ms at the rate, at least 32 KiB, as scripts/emulated_cluster.sh.
burst=$((rate_bytes_per_s / 100))
[ "$burst" -lt 32768 ] && burst=32768
tc -n "${SC_NS[1]}" qdisc add dev eth0 root tbf rate "$rate" burst "$burst" latency 100ms
tc -n "$SC_SWITCH" qdisc add dev p1 root tbf rate "$rate" burst "$burst" latency 100ms

train=(--train-subset "$subset" --epochs 1 --max-eval 2000)
declare -A epoch_s wall_s link_b accuracy
run_job() {  # run_job NAME TRAIN_MLP_ARGS...
  local name=$1 id state="" code tx0 rx0 tx1 rx1 t0 t1 out=$work/$1.out
  shift
  read -r tx0 rx0 <<<"$(slurm_cluster_link_bytes 1)"
  t0=$(date +%s.%N)
  # The nodes declare the machine's CPUs; 2 per hsgd-run task fits a 2-core machine.
  id=$(HSGD_APPS=$build/apps HSGD_NPROC_PER_NODE=2 sbatch --parsable -t 10 -o "$out" \
    --nodes=2 --cpus-per-task=2 "$root/scripts/slurm/hsgd_run_per_node.sbatch" \
    "${train[@]}" "$@") || { echo "slurm_payoff.sh: sbatch refused the $name job" >&2; exit 1; }
  for _ in $(seq 6000); do
    state=$(scontrol -o show job "$id" | grep -o 'JobState=[A-Z_]*' || true)
    case "$state" in JobState=PENDING | JobState=RUNNING | JobState=CONFIGURING | \
      JobState=COMPLETING | "") sleep 0.1 ;; *) break ;; esac
  done
  t1=$(date +%s.%N)
  read -r tx1 rx1 <<<"$(slurm_cluster_link_bytes 1)"
  code=$(scontrol -o show job "$id" | grep -o ' ExitCode=[0-9:]*' || true)
  if [ "$state" != JobState=COMPLETED ] || [ "$code" != " ExitCode=0:0" ]; then
    cat "$out"
    echo "slurm_payoff.sh: the $name job ended $state$code, expected COMPLETED, 0:0" >&2
    exit 1
  fi
  # rank 0's epoch line: "    1  STEPS  LOSS  ACC%  TEST_LOSS  TEST_ACC%  TIME_S  IMAGES/S"
  epoch_s[$name]=$(grep -E '\[rank 0\] +1 +[0-9]+ ' "$out" | awk '{print $(NF-1)}' | tail -1)
  accuracy[$name]=$(grep -E '\[rank 0\] final test accuracy' "$out" | grep -Eo '[0-9.]+%' | tail -1)
  wall_s[$name]=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
  link_b[$name]=$((tx1 - tx0 + rx1 - rx0))
  echo "slurm_payoff.sh: $name: epoch ${epoch_s[$name]} s, job ${wall_s[$name]} s," \
    "$((link_b[$name] / 1000000)) MB across node 1's link, accuracy ${accuracy[$name]}"
}

echo "slurm_payoff.sh: 2 Slurm nodes x 2 workers; node 1's link at $rate; train_mlp on $subset images"
run_job ddp --mode ddp
run_job hierarchical "${hierarchical[@]}"

echo
printf '| job | epoch s (rank 0) | job s (sbatch to end) | MB across node 1 link | link limit s | accuracy |\n'
printf '|---|---:|---:|---:|---:|---|\n'
for name in ddp hierarchical; do
  awk -v n="$name" -v e="${epoch_s[$name]}" -v w="${wall_s[$name]}" -v b="${link_b[$name]}" \
    -v r="$rate_bytes_per_s" -v a="${accuracy[$name]}" 'BEGIN {
      # the link carries both directions at the rate: the larger direction bounds the time;
      # with symmetric traffic that is half the total at the rate
      printf "| %s | %.1f | %.1f | %.0f | %.1f | %s |\n", n, e, w, b / 1e6, b / 2 / r, a }'
done
awk -v e1="${epoch_s[ddp]}" -v e2="${epoch_s[hierarchical]}" -v b1="${link_b[ddp]}" \
  -v b2="${link_b[hierarchical]}" 'BEGIN {
    printf "| hierarchical / DDP | %.2fx | | %.2fx | | |\n", e2 / e1, b2 / b1 }'
