#!/usr/bin/python3
"""scripts/scaling_model.py --plan: the recommendation follows its stated rule, on the emulated
cluster and on a large one, and bad inputs are refused naming the value. Exit 0 when every check
holds, 1 with the failed checks listed."""

import io
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "scaling_model.py")
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import scaling_model as sm  # noqa: E402

failures = []


def expect(ok, what):
    if not ok:
        failures.append(what)


def share(row):
    return row[3] / row[2]


def check_rule(net, n, compute, budget, what):
    rows, best = sm.plan_candidates(net, n, compute, budget)
    ddp = rows[0]
    if best is None:
        expect(all(share(r) > budget for r in rows), f"{what}: no pick, yet a row meets {budget}")
        return None
    expect(share(best) <= budget, f"{what}: the pick {best[0]} exceeds the budget {budget}")
    if best is ddp:
        return best
    expect(share(ddp) > budget, f"{what}: DDP meets {budget} but {best[0]} was picked")
    smaller = [r for r in rows[1:] if r[1] < best[1]]
    expect(all(share(r) > budget for r in smaller),
           f"{what}: a top period below {best[1]} meets {budget}")
    return best


comps, x, y = sm.calibrate()
emulated = sm.emulated_net("nodes", "100mbit", 1.0 / y, x)
mlp_n, mlp_c = 4 * sm.MLP_PARAMS, comps["mlp_nodes_options_1203"]
picks = {}
for budget in (0.2, 0.3, 0.45, 0.6):
    best = check_rule(emulated, mlp_n, mlp_c, budget, f"emulated, budget {budget}")
    picks[budget] = best[1] if best else None
# A larger budget never asks for a longer top period.
periods = [picks[b] for b in sorted(picks)]
expect(None not in periods and periods == sorted(periods, reverse=True),
       f"emulated: top periods by rising budget {periods} should not rise")
# Below the smallest share of any candidate (the oversubscribed machine's floor) nothing fits.
rows, _ = sm.plan_candidates(emulated, mlp_n, mlp_c, 0.5)
floor = min(share(r) for r in rows)
expect(floor > 0.01, f"emulated: a floor of {floor:.3f} (shared memory and TCP CPU cannot hide)")
expect(check_rule(emulated, mlp_n, mlp_c, 0.99 * floor, "emulated, below the floor") is None,
       f"emulated: a budget below the floor {floor:.3f} picked something")

# A fast link and a long step: DDP itself fits.
big = sm.Net("nodes", 8, 8, 100e9 / 8, 25e-6, sm.SHM_RATE, sm.SHM_ALPHA, float("inf"))
best = check_rule(big, 4 * sm.RESNET20_PARAMS, 2.0, 0.1, "8 nodes at 100 Gbit/s, 2 s steps")
expect(best is not None and best[0] == "--mode ddp", f"a 2 s step at 100 Gbit/s: got {best}")
# 1,024 nodes at 1 Gbit/s with ResNet-18 at 100 ms per step: a hierarchy, not DDP.
huge = sm.Net("nodes", 1024, 8, 1e9 / 8, 25e-6, sm.SHM_RATE, sm.SHM_ALPHA, float("inf"))
best = check_rule(huge, 4 * sm.RESNET18_PARAMS, 0.1, 0.3, "1,024 nodes at 1 Gbit/s")
expect(best is not None and best[0].startswith("--hierarchy "), f"1,024 nodes: got {best}")

# The command line: the recommendation is printed; a bad budget is refused naming it.
out = subprocess.run([sys.executable, SCRIPT, "--plan", "--emulated", "100mbit", "--model", "MLP",
                      "--budget", "0.2"], capture_output=True, text=True, timeout=60)
expect(out.returncode == 0 and "Recommended: --hierarchy 1:node," in out.stdout,
       f"--plan --emulated 100mbit: rc {out.returncode}, {out.stdout[-300:]} {out.stderr[-300:]}")
bad = subprocess.run([sys.executable, SCRIPT, "--plan", "--budget", "1.5"], capture_output=True,
                     text=True, timeout=60)
expect(bad.returncode == 2 and "got 1.5" in bad.stderr,
       f"--budget 1.5: rc {bad.returncode}, {bad.stderr[-300:]}")

# Streaming: the model splits fragments as hsgd does (fragments.h's example; the MLP's first
# layer is a fragment of its own) and counts each codec's bytes per value.
expect(sm.fragment_values([100, 100, 50, 50], 2) == [100, 200],
       f"fragments of [100, 100, 50, 50] in 2: {sm.fragment_values([100, 100, 50, 50], 2)}")
mlp_parts = sm.fragment_values(sm.MLP_TENSORS, 4)
expect(mlp_parts[0] == 784 * 512 and sum(mlp_parts) == sm.MLP_PARAMS,
       f"the MLP's 4 fragments: {mlp_parts}")
two = sm.Net("nodes", 2, 2, 1e6, 0.0, sm.SHM_RATE, 0.0, float("inf"))
per_direction = {c: two.allreduce(4_000_000, "world", codec=c)[3]
                 for c in (None, "bf16", "int8", "int4")}
expect(abs(per_direction["int4"] / per_direction[None] - 17 / 128) < 1e-9 and
       abs(per_direction["int8"] / per_direction[None] - 33 / 128) < 1e-9 and
       abs(per_direction["bf16"] / per_direction[None] - 0.5) < 1e-9,
       f"bytes per direction by codec: {per_direction}")
# Four fragments averaged a quarter period apart each wait on a quarter of the model: with a
# link that needs more than the window for the whole model but less for a quarter, the top
# level's exposed time falls.
whole = dict(top=16, codec="int8", start_from=True, warmup=0)
streamed = dict(whole, fragments=4)
slow = sm.Net("nodes", 2, 2, 2e6, 0.0, sm.SHM_RATE, 0.0, float("inf"))
wait_whole, bytes_whole = sm.top_level_time(slow, dict(whole, overlap=4), 4 * sm.MLP_PARAMS,
                                            0.01, 0.01, 160, None)
wait_streamed, bytes_streamed = sm.top_level_time(slow, streamed, 4 * sm.MLP_PARAMS, 0.01, 0.01,
                                                  160, None)
expect(abs(bytes_whole - bytes_streamed) < 1e-6 * bytes_whole,
       f"fragments move the same bytes: {bytes_whole} vs {bytes_streamed}")
expect(wait_streamed < wait_whole,
       f"fragments of equal bytes, 4 steps each: waited {wait_streamed} vs whole {wait_whole}")

if failures:
    print("scaling_plan_test: FAILED:\n  " + "\n  ".join(failures))
    sys.exit(1)
print(f"scaling_plan_test: the rule holds; emulated picks by budget {picks}")
