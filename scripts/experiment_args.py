"""The options and checks that the alternated-rounds experiments on the emulated cluster share
(overlap_experiment.py, encryption_cost.py, streaming_experiment.py): link rates, rounds, seed,
build tree, port, timeout, log directory and JSON output; and the median of a column."""

import os
import statistics
import tempfile

import cluster_bench as cb

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def add_job_arguments(parser, rates, port, run_timeout):
    """Adds --rates (default `rates`), --rounds, --seed, --build, --port, --run-timeout,
    --log-dir and --out."""
    parser.add_argument("--rates", default=rates,
                        help=f"link rates, tc syntax or 'none' (default {rates})")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of all jobs (default 3)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--port", type=int, default=port)
    parser.add_argument("--run-timeout", type=int, default=run_timeout,
                        help=f"seconds before a job is stopped (default {run_timeout})")
    parser.add_argument("--log-dir", default=None,
                        help="job logs and metrics (default: a new directory under /tmp)")
    parser.add_argument("--out", default=None, help="also write the rows as JSON to this file")


def check_job_arguments(parser, args, log_prefix):
    """Splits and checks --rates and --rounds (parser.error names a bad value) and makes the log
    directory (a new one under /tmp named log_prefix... without --log-dir)."""
    args.rates = args.rates.split(",")
    for rate in args.rates:
        try:
            cb.rate_bits(rate)
        except ValueError as e:
            parser.error(f"--rates: {e}")
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    args.log_dir = args.log_dir or tempfile.mkdtemp(prefix=log_prefix)
    os.makedirs(args.log_dir, exist_ok=True)


def median(rows, key):
    """The median of rows' key, skipping rows where it is missing or None; None without any."""
    values = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(values) if values else None
