#!/usr/bin/env python3
"""Fails when a source file includes a header of a layer above its own.

The layers of docs/contributing.md, from the bottom:

    comm  <-  framework  <-  optim  <-  models  <-  apps

A folder may include its own headers and those of the layers it may use (models uses framework
and comm, not optim). The umbrella header hsgd.h at the repository root sits above every layer:
only apps/, tests/ and programs outside the tree include it.

A subsystem's internals sit in its detail/ folder (comm/process_group/detail/ ...): a header
"X/detail/H" may be included only by files under X/ and by X's tests under tests/X/, in every
layer and in tests/.

Usage: scripts/check_layers.py [ROOT]      (ROOT: the repository, default: this script's parent)
Prints one line per violation, "FILE:LINE: LAYER includes "HEADER" (layer ABOVE)" or
"FILE:LINE: includes "HEADER" (internal to X/)", and exits 1
when there is any; exits 0 and prints a one-line summary otherwise.
"""

import pathlib
import re
import sys

# What each layer may include (besides system and third-party headers).
ALLOWED = {
    "comm": {"comm"},
    "framework": {"framework", "comm"},
    "optim": {"optim", "framework", "comm"},
    "models": {"models", "framework", "comm"},
    "apps": {"apps", "models", "optim", "framework", "comm", "hsgd.h"},
}
LAYERS = tuple(ALLOWED)
SOURCE_SUFFIXES = {".h", ".hpp", ".cpp", ".cc"}
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')


def target_layer(header: str):
    """The layer a quoted include names, or None for a header that belongs to no layer."""
    if header == "hsgd.h":
        return "hsgd.h"
    first = header.split("/", 1)[0]
    return first if first in LAYERS else None


def detail_owner(header: str):
    """For "X/detail/H", the folder X whose internals the header is; None for other headers."""
    if "/detail/" not in header:
        return None
    return header.split("/detail/", 1)[0]


def detail_violation(relative: str, header: str):
    """A message when the file at `relative` may not include the detail header `header`."""
    owner = detail_owner(header)
    if owner is None:
        return None
    if relative.startswith(owner + "/") or relative.startswith("tests/" + owner + "/"):
        return None
    return (f'{relative}: includes "{header}" (internal to {owner}/; only {owner}/ and '
            f"tests/{owner}/ may include it)")


def check(root: pathlib.Path):
    violations = []
    files = 0
    for layer in LAYERS + ("tests",):
        for path in sorted((root / layer).rglob("*")):
            if path.suffix not in SOURCE_SUFFIXES or not path.is_file():
                continue
            files += 1
            relative = path.relative_to(root).as_posix()
            text = path.read_text(encoding="utf-8", errors="replace")
            for number, line in enumerate(text.splitlines(), start=1):
                match = INCLUDE.match(line)
                if not match:
                    continue
                header = match.group(1)
                internal = detail_violation(relative, header)
                if internal is not None:
                    file_part, rest = internal.split(": ", 1)
                    violations.append(f"{file_part}:{number}: {rest}")
                if layer == "tests":
                    continue
                target = target_layer(header)
                if target is None or target in ALLOWED[layer]:
                    continue
                where = "above every layer" if target == "hsgd.h" else f"layer {target}"
                violations.append(
                    f'{path.relative_to(root)}:{number}: {layer} includes "{header}" '
                    f"({where}; {layer} may include {', '.join(sorted(ALLOWED[layer]))})")
    return files, violations


def main(argv):
    root = pathlib.Path(argv[1] if len(argv) > 1 else pathlib.Path(__file__).resolve().parents[1])
    if not all((root / layer).is_dir() for layer in ("comm", "framework")):
        print(f"check_layers: '{root}' is not an hsgd checkout (no comm/ and framework/)")
        return 2
    files, violations = check(root)
    for violation in violations:
        print(violation)
    if violations:
        print(f"check_layers: {len(violations)} include(s) point up a layer or into another's detail/")
        return 1
    print(f"check_layers: {files} files, no include points up a layer or into another's detail/")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
