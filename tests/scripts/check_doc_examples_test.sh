#!/usr/bin/env bash
# scripts/check_doc_examples.py must (1) pass on this repository: every usage example of the
# headers and Markdown pages compiles, and (2) on a tree with broken examples, name each broken
# one by FILE:LINE and no other, skip the ones marked "not compiled", and report code in a
# comment without a "Usage:" line, a Markdown fence without a language and a shell block that
# does not parse (while a shell block that parses, and backticks in prose, pass).
# Usage: check_doc_examples_test.sh SOURCE_DIR COMPILE_COMMANDS_JSON
set -euo pipefail
src=$1
database=$2
check=$src/scripts/check_doc_examples.py
python=/usr/bin/python3
[ -x "$python" ] || python=python3

"$python" "$check" "$src" --compile-commands "$database"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/framework/demo" "$tmp/docs"
cat > "$tmp/framework/demo/good.h" <<'H'
#pragma once
// A header whose examples compile.
//
// Usage:
//   Tensor t = zeros({2, 3});
//   auto fc = std::make_shared<nn::Linear>(3, 4);
//
// Usage (not compiled: shows a call that does not exist):
//   t.frobnicate();
namespace hsgd::demo {}
H
cat > "$tmp/framework/demo/bad.h" <<'H'
#pragma once
// A header with one broken example.
//
// Usage:
//   Tensor t = zeros({2, 3});
//   t.no_such_method();
//
//   int unmarked = 1;
namespace hsgd::demo {}
H
cat > "$tmp/framework/demo/unmarked.h" <<'H'
#pragma once
// Code in a comment, without a Usage line:
//
//   auto model = make_thing(3);
namespace hsgd::demo {}
H
cat > "$tmp/docs/page.md" <<'M'
# A page

```cpp
auto model = std::make_shared<hsgd::models::MLP>();
```

```cpp
hsgd::optim::SGD sgd(model->parameters(), {.lr = "fast"});
```

```cpp not-compiled
this is not C++
```

```sh
echo not C++ either
```

Prose may show a fence: ```` ```cpp not-compiled ```` is not one.

```
int unlabelled = 1;
```

```sh
for x in a b; do echo "$x"
```

```sh not-checked
hsgd-run <flags> -- <program>
```
M
set +e
out=$("$python" "$check" "$tmp" --compile-commands "$database")
rc=$?
set -e
echo "$out"
fail() { echo "check_doc_examples_test: $*"; exit 1; }
[ "$rc" -eq 1 ] || fail "exit code $rc on a tree with broken examples, expected 1"
grep -q '^framework/demo/bad.h:5: example does not compile' <<<"$out" || fail "bad.h not named"
grep -q "no_such_method" <<<"$out" || fail "the compiler's message for bad.h is missing"
grep -q '^docs/page.md:8: example does not compile' <<<"$out" || fail "page.md:8 not named"
grep -q '^framework/demo/unmarked.h:4: code in a comment without' <<<"$out" ||
  fail "the unmarked example was not reported"
grep -q '^docs/page.md:21: code block without a language' <<<"$out" ||
  fail "the fence without a language was not reported"
grep -q '^docs/page.md:26: shell block does not parse' <<<"$out" ||
  fail "the shell block that does not parse was not reported"
if grep -q 'good.h\|page.md:4:\|page.md:1[0-9]:\|page.md:2[2-589]:\|page.md:3[0-9]:\|frobnicate' <<<"$out"; then
  fail "a good or not-compiled example was reported"
fi
grep -q '2 of 4 examples do not compile' <<<"$out" || fail "summary wrong"
echo "check_doc_examples_test: ok"
