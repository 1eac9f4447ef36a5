#!/usr/bin/python3
"""hsgd and PyTorch 1.13 side by side on the emulated cluster: seconds per epoch, bytes across
the slow link, test accuracy, and the link's limit (bytes / rate), as a Markdown table.

Runs the matrix  framework (hsgd, torch) x mode (ddp, hierarchical) x model (mlp, resnet20) x
link rate (100mbit, 1gbit) x topology (nodes: 2 nodes x 2 workers, the rate on the link between
them; racks: 2 racks x 2 nodes x 1 worker, the rate between the racks, --rack-rate within),
each job one run of scripts/emulated_cluster.sh (network namespaces, tbf-limited veths):
  hsgd   apps/train_mlp or apps/train_resnet (from --build)
  torch  apps/bench/train_torch.py under the same hsgd-run agents, in the same namespaces: the
         same model, data order, batch, lr schedule, momentum and weight decay; DDP, or
         post_localSGD_hook + HierarchicalModelAverager with the same levels and warm-up; one
         thread per rank; gloo on the node's device.
Modes (scripts/hierarchy_experiment.py's MODES): ddp; hierarchical = --hierarchy 1:2,16:4
(pairs of ranks average every step, all 4 every 16: on 2 nodes a pair is a node, on the racks a
pair is a rack), --subgroup-size 1 (no gradient averaging after warm-up), 20 warm-up steps of
DDP; hierarchical@OPTIONS = the same with level options on the top level, --hierarchy
1:2,16:4@OPTIONS (e.g. 'hierarchical@fragments=4,int8'; docs/averaging.md), hsgd only: PyTorch's
HierarchicalModelAverager has no level options, so no torch job runs for such a mode. The MLP
trains on all of Fashion-MNIST; ResNet-20 (batch 32 per worker, crop + flip) is shortened to the
first --resnet-train-subset images and --resnet-max-eval test images.

Per job: training seconds per epoch on rank 0 (evaluations excluded; with --epochs 1 the first
epoch, which holds the 20 DDP warm-up steps), final test accuracy of the averaged model, MB
across the measured link (both ways, the whole job: start-up and evaluations included), and the
link limit: the seconds the busier direction's bytes need at the link's rate, the least time
the job could have taken on that link. Ratios are hsgd / PyTorch. With --rounds N every job runs
N times, the whole list once per round in the same order (so that each job meets about the same
machine load), and the table gives the medians over the rounds, with min-max of s / epoch and
the range of the load average before the jobs. Needs root (namespaces); runs the jobs one after
another, about 20 minutes for the default matrix on an idle 2-core machine.

  sudo scripts/cluster_bench.py                                   # the whole matrix
  sudo scripts/cluster_bench.py --models mlp --topologies nodes   # MLP on 2 nodes, both rates
  sudo scripts/cluster_bench.py --models mlp --topologies nodes --rates 100mbit --rounds 3 \
      --modes ddp,hierarchical,hierarchical@fragments=4,int8      # streaming beside PyTorch
  scripts/cluster_bench.py --dry-run                              # print the jobs, run nothing
  scripts/cluster_bench.py --table-only /tmp/hsgd-cluster-bench/cluster_bench.csv
"""

import argparse
import csv
import os
import re
import signal
import statistics
import sys
import time
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import hierarchy_experiment as hx  # noqa: E402  (the job runner and the modes)

FRAMEWORKS = ("hsgd", "torch")
MODES = ("ddp", "hierarchical")
TOPOLOGIES = ("nodes", "racks")
TORCH_PROGRAM = ["/usr/bin/python3", os.path.join(ROOT, "apps/bench/train_torch.py")]
FIELDS = ["round", "topology", "rate", "model", "mode", "framework", "epochs", "seconds_per_epoch",
          "final_test_accuracy", "bytes_a_to_b", "bytes_b_to_a", "mb_across_link",
          "link_limit_s", "job_wall_s", "load_before", "load_after"]


def parse_mode(text):
    """'ddp', 'hierarchical' or 'hierarchical@OPTIONS' -> (mode of MODES, OPTIONS or ''). Raises
    ValueError naming the text otherwise."""
    mode, _, options = text.partition("@")
    if mode not in MODES or ("@" in text and (mode != "hierarchical" or not options)):
        raise ValueError(f"mode '{text}': expected one of {','.join(MODES)}, or "
                         f"hierarchical@OPTIONS (top-level options, e.g. "
                         f"hierarchical@fragments=4,int8)")
    return mode, options


def rate_bits(rate):
    """A tc rate ('100mbit', '1gbit', '500kbit', '800bit') in bits per second; None for 'none'."""
    if rate == "none":
        return None
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)(bit|kbit|mbit|gbit)", rate)
    if not m:
        raise ValueError(f"rate '{rate}': expected 'none' or a tc rate like 100mbit, 1gbit")
    return float(m[1]) * {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}[m[2]]


def link_limit_s(bytes_a_to_b, bytes_b_to_a, rate):
    """Seconds the busier direction needs at `rate` (each direction has the full rate)."""
    bits = rate_bits(rate)
    return None if bits is None else max(bytes_a_to_b, bytes_b_to_a) * 8 / bits


def model_args(args, model):
    """The shortening of `model`'s runs: (train subset, max eval)."""
    if model == "resnet20":
        return args.resnet_train_subset, args.resnet_max_eval
    return args.mlp_train_subset, 0


def program(args, framework, model, mode):
    """The worker command of one job."""
    subset, max_eval = model_args(args, model)
    if framework == "hsgd":
        # --eval-every beyond an epoch: 'eval:' lines at the epoch ends only.
        common = types.SimpleNamespace(build=args.build, model=model, epochs=args.epochs,
                                       eval_every=10**9, seed=args.seed, train_subset=subset,
                                       max_eval=max_eval)
        command = hx.program_of(common)
    else:
        command = TORCH_PROGRAM + ["--epochs", str(args.epochs), "--seed", str(args.seed),
                                   "--train-subset", str(subset), "--max-eval", str(max_eval)]
        # The examples' model flags (resnet20: --model resnet20 --batch-size 32) are the twin's.
        flags = hx.MODELS[model]["flags"]
        command += (["--model", model] if "--model" not in flags else []) + flags
    base, options = parse_mode(mode)
    flags = list(hx.MODES[base][1])
    if options:  # the top level's options after '@' (hsgd only: see jobs())
        flags[flags.index("--hierarchy") + 1] += "@" + options
    return command + flags


def cluster_flags(args, topology, rate):
    return hx.TOPOLOGIES[topology].cluster_flags(rate, args)


def jobs(args):
    """(topology, rate, model, mode, framework) in the order run: the two frameworks of a row
    back to back, so they meet the same machine load. Modes with level options run with hsgd
    only (PyTorch's averager has none)."""
    return [(t, r, m, mode, f) for t in args.topologies for r in args.rates for m in args.models
            for mode in args.modes for f in args.frameworks
            if f == "hsgd" or not parse_mode(mode)[1]]


def run_job(args, job, round_index=1):
    topology, rate, model, mode, framework = job
    # '@', ',' and '=' of level options kept out of file names
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", "_".join(job))
    if args.rounds > 1:
        name += f"_round{round_index}"
    log_path = os.path.join(args.log_dir, name + ".log")
    load_before = os.getloadavg()[0]
    link = hx.run_on_cluster(cluster_flags(args, topology, rate),
                             program(args, framework, model, mode), args, log_path, name)
    rows = hx.eval_lines(log_path)
    if not rows:
        raise RuntimeError(f"{name}: no 'eval:' lines in {log_path}")
    a_to_b, b_to_a = (int(link[k]) for k in hx.TOPOLOGIES[topology].byte_keys)
    limit = link_limit_s(a_to_b, b_to_a, rate)
    return {"round": round_index, "topology": topology, "rate": rate, "model": model,
            "mode": mode,
            "framework": framework, "epochs": args.epochs,
            "seconds_per_epoch": round(rows[-1]["train_s"] / rows[-1]["epoch"], 2),
            "final_test_accuracy": rows[-1]["test_accuracy"],
            "bytes_a_to_b": a_to_b, "bytes_b_to_a": b_to_a,
            "mb_across_link": round((a_to_b + b_to_a) / 1e6, 1),
            "link_limit_s": None if limit is None else round(limit, 2),
            "job_wall_s": float(link["seconds"]),
            "load_before": round(load_before, 1), "load_after": round(os.getloadavg()[0], 1)}


def fmt(value, spec, unit=""):
    return "—" if value is None or value == "" else format(float(value), spec) + unit


def ratio(a, b):
    if a in (None, "") or b in (None, "") or float(b) == 0:
        return "—"
    return f"{float(a) / float(b):.2f}x"


def median_job(rows):
    """One job's row from its rounds: the medians of the numeric columns, s / epoch also as
    'median (min-max)' under seconds_text, the load before as 'min-max' under load_text."""
    if not rows:
        return {}
    merged = dict(rows[0])
    for key in ("seconds_per_epoch", "final_test_accuracy", "mb_across_link", "link_limit_s",
                "job_wall_s", "load_before"):
        values = [float(r[key]) for r in rows if r.get(key) not in (None, "")]
        merged[key] = statistics.median(values) if values else None
    seconds = [float(r["seconds_per_epoch"]) for r in rows]
    merged["seconds_text"] = f"{merged['seconds_per_epoch']:.1f}" + (
        f" ({min(seconds):.1f}-{max(seconds):.1f})" if len(rows) > 1 else "")
    loads = [float(r["load_before"]) for r in rows]
    merged["load_text"] = (f"{min(loads):.1f}" if min(loads) == max(loads)
                           else f"{min(loads):.1f}-{max(loads):.1f}")
    merged["rounds"] = len(rows)
    return merged


def table(results):
    """Markdown: one row per (topology, rate, model, mode), hsgd and PyTorch side by side; with
    several rounds of a job, their medians."""
    where = {"nodes": "2 nodes x 2", "racks": "2 racks x 2 nodes x 1"}
    lines = [
        "| topology | link | model | mode | s / epoch hsgd | torch | hsgd / torch "
        "| MB across the link hsgd | torch | hsgd / torch | link limit s hsgd | torch "
        "| test acc. hsgd | torch | job wall s hsgd | torch | load before |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    keys = list(dict.fromkeys((r["topology"], r["rate"], r["model"], r["mode"])
                              for r in results))
    for key in keys:
        h, t = (median_job([r for r in results if r["framework"] == framework and
                            (r["topology"], r["rate"], r["model"], r["mode"]) == key])
                for framework in ("hsgd", "torch"))
        get = lambda r, k: r.get(k)  # noqa: E731
        loads = "/".join(r["load_text"] for r in (h, t) if r)
        lines.append(
            f"| {where[key[0]]} | {key[1]} | {key[2]} | {key[3]} "
            f"| {h.get('seconds_text', '—')} | {t.get('seconds_text', '—')} "
            f"| {ratio(get(h, 'seconds_per_epoch'), get(t, 'seconds_per_epoch'))} "
            f"| {fmt(get(h, 'mb_across_link'), ',.0f')} | {fmt(get(t, 'mb_across_link'), ',.0f')} "
            f"| {ratio(get(h, 'mb_across_link'), get(t, 'mb_across_link'))} "
            f"| {fmt(get(h, 'link_limit_s'), '.1f')} | {fmt(get(t, 'link_limit_s'), '.1f')} "
            f"| {fmt(get(h, 'final_test_accuracy'), '.2f', '%')} "
            f"| {fmt(get(t, 'final_test_accuracy'), '.2f', '%')} "
            f"| {fmt(get(h, 'job_wall_s'), '.0f')} | {fmt(get(t, 'job_wall_s'), '.0f')} "
            f"| {loads} |")
    return "\n".join(lines)


def read_results(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def write_results(path, results):
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(results)


def self_check():
    """Checks the pieces that need no cluster; exits 1 naming the first that fails."""
    checks = [
        (rate_bits("100mbit") == 1e8 and rate_bits("1gbit") == 1e9 and rate_bits("none") is None,
         "rate_bits"),
        (link_limit_s(125_000_000, 1, "1gbit") == 1.0, "link_limit_s of 1 Gbit each way"),
        (ratio(10, 4) == "2.50x" and ratio(None, 4) == "—", "ratio"),
    ]
    rows = [{"topology": "nodes", "rate": "100mbit", "model": "mlp", "mode": "ddp",
             "framework": f, "seconds_per_epoch": s, "mb_across_link": mb, "link_limit_s": 1.0,
             "final_test_accuracy": 85.0, "job_wall_s": 9, "load_before": 1.0}
            for f, s, mb in (("hsgd", 3.0, 100.0), ("torch", 6.0, 200.0))]
    text = table(rows)
    checks.append((text.count("0.50x") == 2 and text.count("\n") == 2, "table of one row"))
    rounds = [dict(rows[0], seconds_per_epoch=s, load_before=load)
              for s, load in ((3.0, 1.0), (5.0, 2.0), (4.0, 3.0))] + rows[1:]
    text = table(rounds)
    checks.append(("| 4.0 (3.0-5.0) | 6.0 |" in text and "| 1.0-3.0/1.0 |" in text
                   and text.count("\n") == 2, "medians of three rounds"))
    checks.append((parse_mode("hierarchical@fragments=4,int8") ==
                   ("hierarchical", "fragments=4,int8") and parse_mode("ddp") == ("ddp", ""),
                   "parse_mode"))
    for bad in ("ddp@int8", "hierarchical@", "streaming"):
        try:
            parse_mode(bad)
            checks.append((False, f"parse_mode accepts '{bad}'"))
        except ValueError:
            pass
    for ok, what in checks:
        if not ok:
            sys.exit(f"cluster_bench: self-check failed: {what}")
    print("cluster_bench: self-check passed")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.split("\n")[2:]))

    def subset_of(allowed):
        def parse(text):
            values = text.split(",")
            for v in values:
                if v not in allowed:
                    raise argparse.ArgumentTypeError(
                        f"'{v}' is not one of {','.join(allowed)}")
            return values
        return parse

    def rates(text):
        for r in text.split(","):
            try:
                rate_bits(r)
            except ValueError as e:
                raise argparse.ArgumentTypeError(str(e))
        return text.split(",")

    parser.add_argument("--frameworks", type=subset_of(FRAMEWORKS), default=list(FRAMEWORKS))
    def modes(text):
        # Options hold commas: split before each known mode name, not at every comma.
        values = re.split(r",(?=(?:%s)(?:@|,|$))" % "|".join(MODES), text)
        for v in values:
            try:
                parse_mode(v)
            except ValueError as e:
                raise argparse.ArgumentTypeError(str(e))
        return values

    parser.add_argument("--modes", type=modes, default=list(MODES),
                        help="comma-separated: ddp, hierarchical, hierarchical@OPTIONS (hsgd "
                        "only; the options hold commas too, e.g. "
                        "ddp,hierarchical@fragments=4,int8); default ddp,hierarchical")
    parser.add_argument("--models", type=subset_of(sorted(hx.MODELS)),
                        default=["mlp", "resnet20"])
    parser.add_argument("--rates", type=rates, default=["100mbit", "1gbit"],
                        help="tc rates of the slow link (between the nodes, or the racks)")
    parser.add_argument("--topologies", type=subset_of(TOPOLOGIES), default=list(TOPOLOGIES),
                        help="nodes: 2 nodes x 2 workers; racks: 2 racks x 2 nodes x 1 worker")
    parser.add_argument("--rack-rate", default="1gbit",
                        help="racks: rate of each node's link within its rack")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--mlp-train-subset", type=int, default=0,
                        help="MLP: first N training images (0: all 60,000)")
    parser.add_argument("--resnet-train-subset", type=int, default=6144,
                        help="ResNet-20: first N training images (default 6144: 48 steps of "
                        "4 x 32)")
    parser.add_argument("--resnet-max-eval", type=int, default=1000,
                        help="ResNet-20: test images per evaluation (0: all 10,000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=1,
                        help="runs of every job, alternated: the whole list once per round "
                        "(default 1); the table gives medians")
    parser.add_argument("--port", type=int, default=29400,
                        help="hsgd-rendezvous on node 0; PyTorch's store takes the next port")
    parser.add_argument("--run-timeout", type=int, default=900, help="seconds per job")
    parser.add_argument("--build", default=os.path.join(ROOT, "build"),
                        help="hsgd build tree (train_mlp, train_resnet, hsgd-run)")
    parser.add_argument("--log-dir", default="/tmp/hsgd-cluster-bench",
                        help="every job's output, and cluster_bench.csv with one row per job")
    parser.add_argument("--dry-run", action="store_true",
                        help="print every job's command line, run nothing")
    parser.add_argument("--self-check", action="store_true",
                        help="check the rate arithmetic and the table, run nothing")
    parser.add_argument("--table-only", metavar="CSV", nargs="+",
                        help="print the table of the jobs in these cluster_bench.csv files, run "
                        "nothing")
    args = parser.parse_args()
    for name in ("epochs", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} {getattr(args, name)}: expected at least 1")
    for name in ("mlp_train_subset", "resnet_train_subset", "resnet_max_eval"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} {getattr(args, name)}: expected >= 0")
    if args.self_check:
        self_check()
        return
    if args.table_only:
        print(table([r for path in args.table_only for r in read_results(path)]))
        return
    todo = jobs(args)
    if args.dry_run:
        for job in todo:
            topology, rate, model, mode, framework = job
            print(" ".join(["scripts/emulated_cluster.sh"] + cluster_flags(args, topology, rate)
                           + ["--"] + program(args, framework, model, mode)))
        return
    if os.geteuid() != 0:
        sys.exit("cluster_bench: needs root for network namespaces (run with sudo)")
    os.makedirs(args.log_dir, exist_ok=True)
    csv_path = os.path.join(args.log_dir, "cluster_bench.csv")
    # SIGTERM like Ctrl-C: stop the running job through emulated_cluster.sh's cleanup.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    start = time.time()
    results = []
    todo = [(round_index, job) for round_index in range(1, args.rounds + 1) for job in todo]
    for i, (round_index, job) in enumerate(todo):
        print(f"[{time.time() - start:6.0f} s] {i + 1}/{len(todo)} round {round_index} "
              f"{' '.join(job)}", flush=True)
        try:
            results.append(run_job(args, job, round_index))
        except RuntimeError as e:  # one failed job does not lose the others
            print(f"    FAILED: {e}", flush=True)
            continue
        print("    " + ", ".join(f"{k} {v}" for k, v in results[-1].items()
                                 if k not in ("topology", "rate", "model", "mode",
                                              "framework")), flush=True)
        write_results(csv_path, results)
    print(f"\n{len(results)} of {len(todo)} jobs in {time.time() - start:.0f} s, started "
          f"{started}; one row per job in {csv_path}\n")
    print(table(results))
    if len(results) < len(todo):
        sys.exit(1)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit("cluster_bench: interrupted")
