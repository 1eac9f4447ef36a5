#!/usr/bin/env bash
# scripts/check_links.py must (1) pass on this repository: every relative link of README.md and
# docs/**/*.md resolves, anchors included, and (2) on a tree with broken links, name each broken
# one by FILE:LINE and no other: a missing file, a missing anchor in another page and in the page
# itself, an absolute path; while good links, directories, repeated headings, external links
# and links inside code are accepted.
# Usage: check_links_test.sh SOURCE_DIR
set -euo pipefail
src=$1
check=$src/scripts/check_links.py
python=/usr/bin/python3
[ -x "$python" ] || python=python3

"$python" "$check" "$src"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/docs" "$tmp/scripts/slurm"
touch "$tmp/scripts/run.sh"
cat > "$tmp/README.md" <<'M'
# Project

See [the guide](docs/guide.md), [its setup](docs/guide.md#set-up-the-machine-fast),
[the scripts](scripts/slurm) and [run.sh](scripts/run.sh "a title").
Broken: [missing page](docs/missing.md).
[External](https://example.com/x.md) and `[code](docs/nowhere.md)` are not checked.
M
cat > "$tmp/docs/guide.md" <<'M'
# Guide

## Set up the machine: *fast*

## Usage
## Usage

Good: [back](../README.md#project), [second usage](#usage-1), [self](#guide),
![plot](../scripts/run.sh).
Broken: [no heading](#no-such-heading), [no heading there](../README.md#nope).
Broken: [absolute](/docs/guide.md).

```sh
echo "[not a link](missing.md)"
```

[ref]: missing_reference.md
M
set +e
out=$("$python" "$check" "$tmp")
rc=$?
set -e
echo "$out"
fail() { echo "check_links_test: $*"; exit 1; }
[ "$rc" -eq 1 ] || fail "exit code $rc on a tree with broken links, expected 1"
grep -q "^README.md:5: broken link 'docs/missing.md': docs/missing.md does not exist" <<<"$out" ||
  fail "the missing page was not named"
grep -q "^docs/guide.md:10: broken link '#no-such-heading': no heading" <<<"$out" ||
  fail "the missing anchor in the page itself was not named"
grep -q "^docs/guide.md:10: broken link '../README.md#nope': no heading" <<<"$out" ||
  fail "the missing anchor in another page was not named"
grep -q "^docs/guide.md:11: broken link '/docs/guide.md': absolute path" <<<"$out" ||
  fail "the absolute path was not named"
grep -q "^docs/guide.md:17: broken link 'missing_reference.md'" <<<"$out" ||
  fail "the broken reference definition was not named"
[ "$(grep -c 'broken link' <<<"$out")" -eq 5 ] || fail "a good link was reported as broken"
grep -q '5 of 14 links in 2 pages are broken' <<<"$out" || fail "summary wrong"
echo "check_links_test: ok"
