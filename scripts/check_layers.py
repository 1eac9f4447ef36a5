#!/usr/bin/env python3
"""Fails when a source file includes a header of a layer above its own.

The layers of docs/contributing.md, from the bottom:

    comm  <-  framework  <-  optim  <-  models  <-  apps

A folder may include its own headers and those of the layers it may use (models uses framework
and comm, not optim). The umbrella header hsgd.h at the repository root sits above every layer:
only apps/, tests/ and programs outside the tree include it.

Inside comm/ the same holds for its base (the headers at comm/'s root: errors, logging) and its
subsystems, one folder each, from the bottom:

    base  <-  tls  <-  transport  <-  store  <-  rendezvous  <-  process_group  <-  elastic  <-  launcher

A subsystem includes the base, itself and the subsystems below it; the base includes only itself.
A folder under comm/ that is not in this order is reported too, so that a new one gets a place.

A subsystem's internals sit in its detail/ folder (comm/process_group/detail/ ...): a header
"X/detail/H" may be included only by files under X/ and by X's tests under tests/X/, in every
layer and in tests/.

Usage: scripts/check_layers.py [ROOT]      (ROOT: the repository, default: this script's parent)
Prints one line per violation, "FILE:LINE: LAYER includes "HEADER" (layer ABOVE)",
"FILE:LINE: comm/SUBSYSTEM includes "HEADER" (subsystem ABOVE ...)" or
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
# comm/'s subsystems from the bottom; "base" is the headers at comm/'s root.
COMM_ORDER = ("base", "tls", "transport", "store", "rendezvous", "process_group", "elastic", "launcher")
COMM_ORDER_TEXT = " < ".join(COMM_ORDER)
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


def comm_part(path: str):
    """For a path under comm/, its subsystem ("base" for comm/'s root), else None."""
    if not path.startswith("comm/"):
        return None
    rest = path[len("comm/"):]
    return rest.split("/", 1)[0] if "/" in rest else "base"


def comm_order_violation(relative: str, header: str):
    """A message when the comm/ file at `relative` may not include `header`, else None."""
    own, target = comm_part(relative), comm_part(header)
    if own is None or target is None or own not in COMM_ORDER:
        return None
    if target not in COMM_ORDER:
        return (f'comm/{own} includes "{header}" (comm/{target}/ is not a subsystem of comm/; '
                f"expected one of {COMM_ORDER_TEXT}: give it a place in COMM_ORDER)")
    if COMM_ORDER.index(target) <= COMM_ORDER.index(own):
        return None
    if own == "base":
        return (f'comm\'s base includes "{header}" (subsystem {target}; the base sits below every '
                f"subsystem in {COMM_ORDER_TEXT} and includes only itself)")
    allowed = ", ".join(COMM_ORDER[:COMM_ORDER.index(own) + 1])
    return (f'comm/{own} includes "{header}" (subsystem {target} is above {own} in '
            f"{COMM_ORDER_TEXT}; {own} may include {allowed})")


def check(root: pathlib.Path):
    violations = []
    files = 0
    for layer in LAYERS + ("tests",):
        for path in sorted((root / layer).rglob("*")):
            if path.suffix not in SOURCE_SUFFIXES or not path.is_file():
                continue
            files += 1
            relative = path.relative_to(root).as_posix()
            own_comm = comm_part(relative)
            if own_comm is not None and own_comm not in COMM_ORDER:
                violations.append(
                    f"{relative}:1: comm/{own_comm}/ is not a subsystem of comm/ (expected one of "
                    f"{COMM_ORDER_TEXT}: give it a place in COMM_ORDER)")
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
                in_comm = comm_order_violation(relative, header)
                if in_comm is not None:
                    violations.append(f"{relative}:{number}: {in_comm}")
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
        print(f"check_layers: {len(violations)} include(s) point up a layer, up comm/'s order or "
              "into another's detail/")
        return 1
    print(f"check_layers: {files} files, no include points up a layer, up comm/'s order "
          "or into another's detail/")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
