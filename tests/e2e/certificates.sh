#!/usr/bin/env bash
# Usage: certificates.sh SOURCE_DIR BUILD_DIR
# Certificates of a site's CA, made with the openssl command line as docs/security.md shows:
#   1. hsgd-rendezvous and two hsgd-runs (2 nodes x 1 worker on loopback, DDP, so the data plane
#      between the nodes runs on certificates too) with --tls-cert/--tls-key/--tls-ca and the
#      token file: both hsgd-runs exit 0, the training reaches its last epoch, and hsgd-run's
#      start-up line says certificates.
#   2. Refused at once (well before --rdzv-timeout, and naming why): an hsgd-run with another
#      CA's certificate and the right token; one with the site's certificate and another token;
#      one without certificates. The server logs the refusal of the certificate.
#   3. --tls-cert without --tls-key and --tls-ca is a usage error (exit 2) naming both.
set -euo pipefail
src=$1
build=$2
# shellcheck source=tests/e2e/e2e_lib.sh
source "$src/tests/e2e/e2e_lib.sh"
e2e_init certificates
command -v openssl >/dev/null || { echo "certificates: SKIPPED: no openssl command"; exit 77; }

# $1: name, $2: CA name; a P-256 key and a certificate for CN=name signed by that CA.
issue() {
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$work/$1.key" \
    -out "$work/$1.csr" -subj "/CN=$1" 2>/dev/null
  openssl x509 -req -in "$work/$1.csr" -CA "$work/$2.pem" -CAkey "$work/$2.key" \
    -CAcreateserial -out "$work/$1.pem" -days 2 2>/dev/null
}
for ca in site other; do
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$work/$ca.key" \
    -out "$work/$ca.pem" -days 2 -subj "/CN=$ca CA" 2>/dev/null
done
issue rdzv site
issue node0 site
issue node1 site
issue stranger other

# The server takes its certificate from the environment (hsgd-rendezvous reads HSGD_TLS_*).
export HSGD_TLS_CERT=$work/rdzv.pem HSGD_TLS_KEY=$work/rdzv.key HSGD_TLS_CA=$work/site.pem
e2e_start_rendezvous
unset HSGD_TLS_CERT HSGD_TLS_KEY HSGD_TLS_CA
grep -q "certificates of the site's CA" "$work/rdzv.out" ||
  fail "the server's start-up line does not say certificates: $(cat "$work/rdzv.out")"

# $1: node name (its certificate), $2: output file, $3: job id, rest: more hsgd-run flags.
start_node() {
  local node=$1 out=$2 id=$3
  shift 3
  timeout 120 "$run" --nnodes 2 --nproc-per-node 1 --rdzv-endpoint "$endpoint" --rdzv-id "$id" \
    --tls-cert "$work/$node.pem" --tls-key "$work/$node.key" --tls-ca "$work/site.pem" "$@" \
    -- "$mlp" --synthetic --epochs 2 --mode ddp >"$out" 2>&1 &
  pids+=($!)
  last_pid=$!
}

# ---- 1. a job on certificates
start_node node0 "$work/job.0" job
t0=$last_pid
start_node node1 "$work/job.1" job
t1=$last_pid
expect_exit "$t0" 0 "$work/job.0"
expect_exit "$t1" 0 "$work/job.1"
grep -q "certificates verified against --tls-ca" "$work/job.0" ||
  fail "hsgd-run's start-up line does not say certificates: $(head -3 "$work/job.0")"
# Nodes are ranked by arrival: rank 0's lines are in either file.
cat "$work/job.0" "$work/job.1" | grep -qE '^\[rank 0\] +2 ' ||
  fail "the training did not reach epoch 2: $(tail -5 "$work/job.0" "$work/job.1")"

# ---- 2. strangers: each is refused before its 60 s --rdzv-timeout
# $1: what, $2: expected text in hsgd-run's error, rest: hsgd-run flags after the endpoint.
expect_refused() {
  local what=$1 expected=$2 out="$work/refused.$RANDOM" start rc=0
  shift 2
  start=$(date +%s)
  timeout 90 "$run" --nnodes 2 --nproc-per-node 1 --rdzv-endpoint "$endpoint" --rdzv-id job2 \
    --rdzv-timeout 60 "$@" -- "$mlp" --synthetic --epochs 1 >"$out" 2>&1 || rc=$?
  [ "$rc" -ne 0 ] || fail "$what: hsgd-run exited 0"
  [ $(($(date +%s) - start)) -lt 30 ] || fail "$what: refused only after $(($(date +%s) - start)) s"
  grep -q "$expected" "$out" || fail "$what: no '$expected' in: $(cat "$out")"
}
expect_refused "another CA's certificate" "refused this client's certificate" \
  --tls-cert "$work/stranger.pem" --tls-key "$work/stranger.key" --tls-ca "$work/site.pem"
other_token=$work/other_token
(umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$other_token")
expect_refused "the site's certificate without the token" "refused identity" \
  --token-file "$other_token" \
  --tls-cert "$work/node0.pem" --tls-key "$work/node0.key" --tls-ca "$work/site.pem"
expect_refused "no certificate" "presented a certificate instead of using the job's key"
# (one warning per 10 s: the others are counted in the next one)
grep -q "failed (certificate verify failed)" "$work/rdzv.out" ||
  fail "the server logged no refusal: $(cat "$work/rdzv.out")"

# ---- 3. an incomplete set of flags
rc=0
"$run" --standalone --tls-cert "$work/node0.pem" -- "$mlp" >"$work/usage" 2>&1 || rc=$?
[ "$rc" -eq 2 ] || fail "--tls-cert alone exited $rc, expected 2: $(cat "$work/usage")"
grep -q "missing: --tls-key, --tls-ca" "$work/usage" || fail "usage error: $(cat "$work/usage")"
echo "certificates: OK"
