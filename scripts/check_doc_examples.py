#!/usr/bin/env python3
"""Compiles every usage example of the headers and the Markdown pages, so the docs cannot drift
from the API.

What counts as an example (docs/contributing.md, "Usage examples"):

- In a header (*.h): the indented comment lines ("//   code", at least two spaces more than
  prose) right after a line "// Usage...:" or "// Example...:" (a line that starts with one of
  these words and ends with a colon, e.g. "// Usage (8 ranks, 2 nodes of 4):"); or the code
  after the colon of a one-line "// Usage: code;".
- In Markdown (*.md): a fenced block whose info string is "cpp" (or "c++").

Every other fenced block of a page says what it is: "sh" (also "bash", "shell"; checked with
`bash -n`, i.e. it must parse as shell, and not run), "text" (output, diagrams), "cmake",
"json", ... A fence without an info string is reported, so C++ cannot escape the check by
leaving out its language. A shell block that is not meant to parse (a synopsis with "<...>")
says so: "```sh not-checked".

An example that is not meant to compile says so: a header marker line containing
"not compiled: REASON" (e.g. "// Usage (inside ProcessGroup; not compiled: private members):"),
or a fence "```cpp not-compiled". Keep that set small; the reason is for the reader.

A header comment block indented like code (a line ending in ';' or '{') that is not under a
marker is reported too: it looks like an example that would escape the check.

How an example is compiled: its '#include' lines go to the top of a translation unit (after
the headers every example may use: hsgd.h, the header it documents, <iostream> ...). Classes,
structs, templates and functions defined at its top (and a whole "int main" program) stay at
namespace scope; the remaining statements become the body of a function `int f(int argc, char**
argv)`. Each example lives in its own namespace, nested in its header's namespace (a header's
example reads as written inside it; a page's example as user code at global scope), and sees the
names of scripts/doc_examples_given.h (model, world, x, y, ...: the things an example takes as
given). '#line' directives map every line back to its source, so the compiler's messages name
FILE:LINE of the docs. All examples are compiled as one translation unit with -fsyntax-only;
when that fails, every example is compiled alone to name the failing ones.

Usage: scripts/check_doc_examples.py ROOT [--list] [--keep DIR] -- COMPILER FLAGS...
       scripts/check_doc_examples.py ROOT --compile-commands FILE [--like SOURCE]
  ROOT               the tree to scan (the repository, or a test's temporary copy)
  -- COMPILER FLAGS  the compiler and its flags (-std, -I, -D); -fsyntax-only is added
  --compile-commands take the compiler and flags of SOURCE (default: a tests/support source)
                     from a CMake compile_commands.json
  --list             print every example found (FILE:LINE kind) and exit
  --keep DIR         write the generated translation units to DIR
Prints "FILE:LINE: example does not compile" with the compiler's messages for each failing
example, "FILE:LINE: ..." for a code block without a marker, a fence without a language or a
shell block that does not parse, and exits 1 on any of them; exits 0 with a one-line summary
otherwise.
"""

import concurrent.futures
import dataclasses
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys
import tempfile

SKIP_DIRS = {".git", "third_party"}
# "Usage:", "Usage (8 ranks):", "Usage, under hsgd-run:", "Example:" (not "Examples held in ...").
MARKER = re.compile(r"^\s*//\s?((?:Usage|Examples?)(?:\s*\(.*\)|,[^:]*)?):\s*(.*)$")
CODE_LINE = re.compile(r"^\s*//(   .*)$")  # prose is "// text"; code is indented two more
BLANK = re.compile(r"^\s*//\s*$")
# What tells code from an indented table or formula: a statement or block with a call or an
# assignment ("beats   grows at every collective;" is prose).
LOOKS_LIKE_CODE = re.compile(r"[(=<].*[;{]\s*$")
NOT_COMPILED = re.compile(r"not compiled:\s*\S")
# A fence opens with three or more backticks and an info string without backticks (CommonMark),
# so "```` ```cpp ```` in prose" is not one; it closes with at least as many backticks.
FENCE = re.compile(r"^(\s*)(`{3,})([^`]*)$")
SHELL = ("sh", "bash", "shell")
# A definition that belongs at namespace scope when it opens an example.
TOP_LEVEL = re.compile(
    r"^(class|struct|enum|union|template|namespace|using namespace|#define)\b"
    r"|^[\w:<>,\*& ]+[\s\*&]~?[\w:]+\([^;=()\[\]]*\)\s*(const)?\s*(override)?\s*(noexcept)?\s*\{")
GENERATED = "doc_examples.cpp"  # the generated translation unit's name in messages
NAMESPACE = re.compile(r"^\s*namespace\s+([\w:]+)\s*\{")


@dataclasses.dataclass
class Example:
    path: str  # relative to ROOT
    line: int  # 1-based line of the first code line
    lines: list  # the code, comment prefix removed
    compiled: bool = True
    namespaces: tuple = ()

    @property
    def where(self):
        return f"{self.path}:{self.line}"

    def last_line(self):
        return self.line + len(self.lines) - 1


def source_files(root):
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames
                             if d not in SKIP_DIRS and not d.startswith((".", "build")))
        for name in sorted(filenames):
            if name.endswith((".h", ".md")):
                yield pathlib.Path(dirpath) / name


def header_examples(rel, text, problems):
    lines = text.split("\n")
    # The namespaces the header declares (not its detail namespaces): an example reads as
    # written inside them.
    declared = [m.group(1) for m in map(NAMESPACE.match, lines)
                if m and m.group(1).startswith("hsgd")]
    namespaces = tuple(dict.fromkeys(
        [ns for ns in declared if "detail" not in ns] +
        [ns.replace("::detail", "") for ns in declared if "detail" in ns]))
    examples = []
    i = 0
    while i < len(lines):
        marker = MARKER.match(lines[i])
        if marker:
            compiled = not NOT_COMPILED.search(marker.group(1))
            inline = marker.group(2).strip()
            if inline.endswith(";"):  # "// Usage: code;"
                examples.append(Example(rel, i + 1, [inline], compiled, namespaces))
                i += 1
                continue
            j = i + 1
            body = []
            while j < len(lines):
                if CODE_LINE.match(lines[j]):
                    body.append(CODE_LINE.match(lines[j]).group(1)[3:])
                elif (BLANK.match(lines[j]) and body and j + 1 < len(lines) and
                      CODE_LINE.match(lines[j + 1])):
                    body.append("")  # a blank line inside the example
                else:
                    break
                j += 1
            if body:
                examples.append(Example(rel, i + 2, body, compiled, namespaces))
            else:
                problems.append(f"{rel}:{i + 1}: a '{marker.group(1)}:' line without an "
                                f"example under it (indent the code by two spaces more)")
            i = j
            continue
        # An unmarked block indented like code after a blank comment line (after prose, indented
        # lines are a list's continuation, a table or a formula).
        if CODE_LINE.match(lines[i]) and i > 0 and BLANK.match(lines[i - 1]):
            j = i
            while j < len(lines) and CODE_LINE.match(lines[j]):
                j += 1
            code = [CODE_LINE.match(x).group(1).split("//")[0].rstrip() for x in lines[i:j]]
            if any(LOOKS_LIKE_CODE.search(c) for c in code):
                problems.append(f"{rel}:{i + 1}: code in a comment without a '// Usage:' line "
                                f"above it (add one, or '// Usage (not compiled: why):')")
            i = j
            continue
        i += 1
    return examples


def markdown_blocks(rel, text, problems):
    """(first line, info words, body) of every fenced block of a page."""
    blocks = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        indent, ticks, info = fence.group(1), fence.group(2), fence.group(3).split()
        closing = re.compile(r"^\s*`{" + str(len(ticks)) + r",}\s*$")
        j = i + 1
        while j < len(lines) and not closing.match(lines[j]):
            j += 1
        if j == len(lines):
            problems.append(f"{rel}:{i + 1}: code block without a closing fence")
        body = [x[len(indent):] if x.startswith(indent) else x for x in lines[i + 1:j]]
        if not info:
            problems.append(f"{rel}:{i + 1}: code block without a language (```cpp is "
                            f"compiled, ```sh parsed; mark others ```text, ```cmake, ...)")
        blocks.append((i + 2, info, body))
        i = j + 1
    return blocks


def markdown_examples(rel, text, problems, shell_blocks):
    examples = []
    for line, info, body in markdown_blocks(rel, text, problems):
        if info and info[0] in ("cpp", "c++"):
            examples.append(Example(rel, line, body, "not-compiled" not in info[1:]))
        elif info and info[0] in SHELL and "not-checked" not in info[1:]:
            shell_blocks.append((rel, line, body))
    return examples


def check_shell(blocks):
    """Problems of shell blocks that do not parse (bash -n: syntax only, nothing runs)."""
    problems = []
    for rel, line, body in blocks:
        proc = subprocess.run(["bash", "-n"], input="\n".join(body) + "\n", text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
        if proc.returncode != 0:
            # bash names the line as "bash: line N:"; map it to the page.
            message = re.sub(r"bash: line (\d+):",
                             lambda m: f"{rel}:{line + int(m.group(1)) - 1}:",
                             proc.stdout.strip())
            problems.append(f"{rel}:{line}: shell block does not parse (bash -n):\n    " +
                            message.replace("\n", "\n    "))
    return problems


def find_examples(root, shell_blocks=None):
    examples, problems = [], []
    shell_blocks = [] if shell_blocks is None else shell_blocks
    for path in source_files(root):
        rel = path.relative_to(root).as_posix()
        text = path.read_text(encoding="utf-8", errors="replace")
        if path.suffix == ".h":
            examples += header_examples(rel, text, problems)
        else:
            examples += markdown_examples(rel, text, problems, shell_blocks)
    return examples, problems


def split_example(example):
    """(includes, namespace-scope part, statements) as lists of (line number, text)."""
    numbered = list(enumerate(example.lines, example.line))
    includes = [(n, t) for n, t in numbered if t.lstrip().startswith("#include")]
    rest = [(n, t) for n, t in numbered if not t.lstrip().startswith("#include")]
    top, depth, k = [], 0, 0
    # Leading definitions (tracked by brace depth) stay at namespace scope.
    while k < len(rest):
        n, t = rest[k]
        code = t.split("//")[0]
        if depth == 0 and code.strip() and not TOP_LEVEL.match(code.strip()):
            break
        top.append((n, t))
        depth += code.count("{") - code.count("}")
        k += 1
    return includes, top, rest[k:]


def translation_unit(root, examples, context=None):
    """One translation unit compiling `examples`, with #line directives to their sources. It
    includes the headers of every example in `context` (default: `examples`), so that an example
    compiled alone sees what it sees among all the others."""
    given = pathlib.Path(__file__).resolve().with_name("doc_examples_given.h")
    out = ["// Generated by scripts/check_doc_examples.py: every usage example of the docs.",
           "#include <iostream>", "#include <memory>", "#include <string>", "#include <vector>",
           '#include "hsgd.h"']
    headers, blocks = [], []
    for ex in examples if context is None else context:
        if ex.path.endswith(".h"):
            headers.append(f'#include "{ex.path}"')
        headers += [t.strip() for _, t in split_example(ex)[0]]
    for index, ex in enumerate(examples):
        includes, top, body = split_example(ex)
        # A header's example reads as if written inside the header's (first) namespace; a page's
        # as user code at global scope.
        outer = ex.namespaces[0] if ex.namespaces else None
        name = f"hsgd_doc_example_{index}"
        blocks.append(f"namespace {outer}::{name} {{" if outer else f"namespace {name} {{")
        blocks.append("using namespace hsgd::doc_examples_given;")
        for n, t in top:
            blocks += [f'#line {n} "{ex.path}"', t]
        if any(t.strip() for _, t in body):
            blocks.append(f"[[maybe_unused]] int example_{index}(int argc, char** argv) {{")
            for n, t in body:
                blocks += [f'#line {n} "{ex.path}"', t]
            blocks.append("}")
        blocks.append(f"}}  // namespace {name}")
        # The wrapper's own lines are not the example's.
        blocks.append(f'#line @NEXT@ "{GENERATED}"')
    out += list(dict.fromkeys(headers))
    out.append(f'#include "{given}"')
    lines = out + blocks
    lines = [t.replace("@NEXT@", str(i + 2)) for i, t in enumerate(lines)]
    return "\n".join(lines) + "\n"


def compile_unit(source, compiler):
    with tempfile.NamedTemporaryFile("w", suffix=".cpp", delete=False) as f:
        f.write(source)
        name = f.name
    try:
        proc = subprocess.run(compiler + ["-fsyntax-only", "-w", "-fmax-errors=20", name],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=600)
        return proc.returncode, proc.stdout
    finally:
        os.unlink(name)


def compiler_from_database(database, like):
    entries = json.loads(pathlib.Path(database).read_text())
    for entry in entries:
        if like is None and "/tests/support/" in entry["file"] or \
                like is not None and entry["file"].endswith(like):
            args = entry.get("arguments") or shlex.split(entry["command"])
            out, skip = [], False
            for a in args:
                if skip:
                    skip = False
                elif a in ("-o", "-c"):
                    skip = True
                elif a not in ("-Werror",) and not a.startswith("-MF") and a not in ("-MD",
                                                                                       "-MMD"):
                    out.append(a)
            # Includes are relative to the build's directory.
            return out, entry["directory"]
    sys.exit(f"check_doc_examples: no entry for {like or 'tests/support/*'} in {database}")


def main(argv):
    args, compiler = argv, []
    if "--" in argv:
        k = argv.index("--")
        args, compiler = argv[:k], argv[k + 1:]
    root = pathlib.Path(args[0]).resolve() if args and not args[0].startswith("--") else \
        pathlib.Path(__file__).resolve().parent.parent
    keep = args[args.index("--keep") + 1] if "--keep" in args else None
    cwd = None
    if "--compile-commands" in args:
        like = args[args.index("--like") + 1] if "--like" in args else None
        compiler, cwd = compiler_from_database(args[args.index("--compile-commands") + 1], like)

    shell_blocks = []
    examples, problems = find_examples(root, shell_blocks)
    if "--list" in args:
        for ex in examples:
            print(f"{ex.where}: {len(ex.lines)} lines{'' if ex.compiled else ' (not compiled)'}")
        for rel, line, body in shell_blocks:
            print(f"{rel}:{line}: {len(body)} lines (shell, parsed)")
        return 0
    problems += check_shell(shell_blocks)
    if not compiler:
        sys.exit("check_doc_examples: give the compiler after '--' or --compile-commands")
    compiler = compiler + ["-I", str(root)]
    compiled = [ex for ex in examples if ex.compiled]
    if cwd:
        os.chdir(cwd)

    source = translation_unit(root, compiled)
    if keep:
        pathlib.Path(keep).mkdir(parents=True, exist_ok=True)
        pathlib.Path(keep, "all_examples.cpp").write_text(source)
    rc, output = compile_unit(source, compiler)
    failures = []
    if rc != 0:
        # Compile each example alone so that one broken example cannot hide or blame another.
        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
            alone = list(pool.map(
                lambda ex: compile_unit(translation_unit(root, [ex], compiled), compiler),
                compiled))
        failures = [(ex, out) for ex, (code, out) in zip(compiled, alone) if code != 0]
        if not failures:
            problems.append(f"the examples compile alone but not together:\n{output}")
    for ex, out in failures:
        print(f"{ex.where}: example does not compile")
        print("\n".join("    " + x for x in out.rstrip().split("\n")
                        if not x.startswith("/tmp/") or "error" in x))
    for p in problems:
        print(p)
    skipped = len(examples) - len(compiled)
    if failures or problems:
        print(f"check_doc_examples: {len(failures)} of {len(compiled)} examples do not compile, "
              f"{len(problems)} other problems")
        return 1
    print(f"check_doc_examples: {len(compiled)} examples compile ({skipped} marked not "
          f"compiled) in {len({ex.path for ex in examples})} files; {len(shell_blocks)} shell "
          f"blocks parse")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
