"""`python -m pytest_msprobe COMMAND`: work on finished results (merge, baseline, compare), write the script of
one recorded call (script) and run a training script checked as it runs (run). None of the first four needs
pytest or torch; the script it writes runs torch, and so does run.
"""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from .records.record import Record
from .reports.results import JSONL_PREFIX, read_records, summary_counts, write_results
from .reports.summary import file_lines
from .session import baseline
from .session.journal import final_records


def records_file(source: Path) -> tuple[Path, str]:
    """(the records file, which result set it is): a records file, or the newest msprobe_records_*.jsonl of a
    result folder (each run leaves one set there, stamped with its time)."""
    if source.is_dir():
        files = sorted(source.glob(f"{JSONL_PREFIX}*.jsonl"))
        if not files:
            raise SystemExit(f"{source}: no {JSONL_PREFIX}*.jsonl here; did that run finish? "
                             f"(resume it with --msprobe-resume)")
        stamp = files[-1].stem[len(JSONL_PREFIX):]
        when = f"{stamp[:4]}-{stamp[4:6]}-{stamp[6:8]} {stamp[8:10]}:{stamp[10:12]}:{stamp[12:14]}" \
            if len(stamp) == 14 and stamp.isdigit() else stamp
        which = "the only result set there" if len(files) == 1 else f"the newest of {len(files)} result sets there"
        return files[-1], f"{which}, written {when}"
    if not source.is_file():
        raise SystemExit(f"{source}: no such file or folder")
    return source, "as given"


def records_of(path: Path) -> list[Record]:
    """The records of a records file; a line that is not one ends the command with its file and line."""
    try:
        return read_records(path)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None


def merge(args: argparse.Namespace) -> int:
    batches = [records_of(records_file(Path(p))[0]) for p in args.results]
    seen: set[str] = set()
    for source, batch in zip(args.results, batches):
        ids = {r.nodeid or "" for r in batch}
        if seen & ids:
            print(f"warning: {source} repeats {len(seen & ids)} item(s) of an earlier input; the later one is kept",
                  file=sys.stderr)
        seen |= ids
    records = final_records(*batches)
    paths = write_results(records, Path(args.output))
    counts = summary_counts(records)
    print(f"{len(records)} records from {len(batches)} inputs: " + ", ".join(f"{v} {k}" for k, v in counts.items()))
    for line in file_lines(paths):
        print(line)
    return 0


def write_baseline(args: argparse.Namespace) -> int:
    batches = []
    for source in args.results:
        path, which = records_file(Path(source))
        print(f"read {path} ({which})")
        batches.append(records_of(path))
    records = final_records(*batches)
    entries = baseline.failures(records, warning_as_error=args.warning_as_error)
    Path(args.output).write_text(baseline.dump_yaml(entries), encoding="utf-8")
    print(baseline.written_line(entries, records, args.output, warning_as_error=args.warning_as_error))
    return 0


def compare(args: argparse.Namespace) -> int:
    from .reports.compare import CompareError, compare_files, summary
    from .reports.results import timestamp, write_compare_files
    from .specs.loader import SpecError, load_specs

    try:
        specs = load_specs(user_file=str(Path(args.specs).resolve()) if args.specs else None)
        results, details, missing = compare_files(Path(args.npu), Path(args.gpu), specs, args.standard)
    except (CompareError, SpecError) as exc:
        raise SystemExit(f"error: {exc}") from None
    for name in missing[:20]:
        print(f"warning: {name} is not in the GPU file; left out (as msprobe does)", file=sys.stderr)
    if len(missing) > 20:
        print(f"warning: ... {len(missing) - 20} more rows are not in the GPU file", file=sys.stderr)
    paths = write_compare_files(results, details, Path(args.out), timestamp())
    print(summary(results))
    for kind, path in paths.items():
        print(f"{kind}: {path}")
    return 0


def write_script(args: argparse.Namespace) -> int:
    from .settings import DATA_MODES, CheckOptions
    from .triage.script import ScriptError, write

    options = CheckOptions(device=args.device, run_seed=args.seed, data_mode=args.data_mode, standard=args.standard,
                           mode=args.mode, bench_precision=args.bench_precision, threads=args.threads,
                           recorded_on=args.recorded_on,
                           specs_file=str(Path(args.specs).resolve()) if args.specs else None)
    assert options.data_mode in DATA_MODES
    try:
        path = write(args.target, Path(args.output) if args.output else None, options, args.iter_times)
    except ScriptError as exc:
        raise SystemExit(f"error: {exc}") from None
    print(f"wrote {path}: python {shlex.quote(str(path))}  (--iter-times N, --device D, --json)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The command line: every subcommand and its arguments (the documentation's CLI reference is generated from it)."""
    parser = argparse.ArgumentParser(prog="python -m pytest_msprobe", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, title="commands", metavar="COMMAND")

    def command(name: str, summary: str, description: str) -> argparse.ArgumentParser:
        """A subcommand: its one-line summary in the list above, the longer text in its own --help."""
        return commands.add_parser(name, help=summary, description=f"{summary}: {description}")

    m = command("merge", "combine result folders (e.g. one per shard) into one set of files",
                "the records of every input (a later input wins for an item both hold) become one set of msprobe "
                "CSVs and JSON lines, as one run would have written them")
    m.add_argument("results", nargs="+", help="result folders (--msprobe-out) or msprobe_records_*.jsonl files")
    m.add_argument("-o", "--output", required=True, help="folder for the merged CSVs and JSON lines")
    m.set_defaults(run=merge)
    b = command("baseline", "write the failing items of finished runs as a baseline file",
                "one entry per failing call (named so that it matches the call in every dump; per dump where "
                "the call passes in another), with its failing check as the reason, to review and pass to "
                "--msprobe-baseline (listed failures then run as strict xfails); reads the newest result set "
                "of each folder")
    b.add_argument("results", nargs="+", help="result folders or msprobe_records_*.jsonl files")
    b.add_argument("-o", "--output", required=True, help="baseline file to write (YAML)")
    b.add_argument("--warning-as-error", action="store_true", help="also list items whose verdict is Warning")
    b.set_defaults(run=write_baseline)
    c = command("compare", "msprobe's api_precision_compare on two details CSVs (NPU and GPU)",
                "compares the device under test's accuracy_checking_details CSV with a reference device's, as "
                "msprobe's api_precision_compare does, and writes its result and details CSVs")
    c.add_argument("--npu", required=True, help="accuracy_checking_details_*.csv of the device under test")
    c.add_argument("--gpu", required=True, help="accuracy_checking_details_*.csv of the reference device")
    c.add_argument("--out", required=True, help="folder for api_precision_compare_result/details_<ts>.csv")
    c.add_argument("--standard", choices=("msprobe", "msprobe26"), default="msprobe",
                   help="msprobe: 8.x api_precision_compare (default); msprobe26: 26.x (benchmark for every float "
                        "output, its monitoring-level thresholds, blank metric cells read as 0)")
    c.add_argument("--specs", default=None, help="an msprobe_specs YAML file with threshold/category overrides")
    c.set_defaults(run=compare)
    from .settings import BENCH_PRECISIONS, DATA_MODES, DEFAULT_SEED, MODES, RECORDED_ON, STANDARDS

    w = command("script", "a standalone script of one recorded call (msprobe's op_generate)",
                "the script rebuilds the call's inputs, runs it on the device and the bench and judges it as the "
                "plugin does, passing or failing; writing it needs no torch, running it does")
    w.add_argument("target", help="DUMP_JSON::ENTRY, e.g. 'step0/rank0/dump.json::Functional.linear.0.forward'")
    w.add_argument("-o", "--output", default=None, help="script file (default: named after the dump folder and entry)")
    w.add_argument("--iter-times", type=int, default=1, help="runs of the call when the script runs (msprobe's "
                                                              "iter_times; the script's --iter-times overrides it)")
    w.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"run seed, as --msprobe-seed (default {DEFAULT_SEED})")
    w.add_argument("--device", default="auto", help="device under test, as --msprobe-device (default auto)")
    w.add_argument("--standard", choices=STANDARDS, default=STANDARDS[0], help="as --msprobe-standard")
    w.add_argument("--data-mode", choices=DATA_MODES, default="auto", help="as ini msprobe_data_mode")
    w.add_argument("--mode", choices=MODES, default="auto", help="as --msprobe-mode")
    w.add_argument("--recorded-on", choices=RECORDED_ON, default="auto", help="as ini msprobe_recorded_on")
    w.add_argument("--bench-precision", choices=BENCH_PRECISIONS, default="auto", help="as ini msprobe_bench_precision")
    w.add_argument("--threads", type=int, default=1, help="torch intra-op threads, as ini msprobe_threads (default 1)")
    w.add_argument("--specs", default=None, help="an msprobe_specs YAML file (embedded in the script)")
    w.set_defaults(run=write_script)
    r = command("run", "run a training script with every API call checked as it runs",
                "the script runs as `python SCRIPT ARGS` would, inside pytest_msprobe.checking(...): each call is "
                "checked in worker processes beside it, the files and a summary line are written at its end, and the "
                "status is 1 when any call failed or was not checked (the script's own when it fails)")
    r.add_argument("--out", default="msprobe_inprocess", help="folder for the CSVs, records, HTML and kept calls")
    r.add_argument("--sample", type=int, default=1, help="check one call in N of each API (default 1: every call)")
    r.add_argument("--workers", type=int, default=2, help="worker processes that check (default 2)")
    r.add_argument("--apis", nargs="+", default=None, metavar="NAME",
                   help="check only these: full call names or parts of API names, as msprobe's `list`")
    r.add_argument("--level", choices=("api", "aten"), default="api", help="api: msprobe's API names (default); "
                                                                          "aten: aten ops, as online_dispatch")
    r.add_argument("--keep", default="failed", help="calls kept as a tensor dump: failed (default), all, none")
    r.add_argument("--queue-bytes", type=int, default=2 << 30, help="captured tensor bytes not yet checked, at most")
    r.add_argument("--when-full", choices=("wait", "skip"), default="wait",
                   help="wait: the step waits for room (default); skip: the call is counted as not checked")
    r.add_argument("--device", choices=("cpu", "cuda", "npu"), default=None,
                   help="what the step runs on, for its vendor's contract (default: the first call's tensors)")
    r.add_argument("--standard", choices=STANDARDS, default=STANDARDS[0], help="as --msprobe-standard")
    r.add_argument("script", help="the training script")
    r.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    r.set_defaults(run=run_training)
    return parser


def run_training(args: argparse.Namespace) -> int:
    from .inprocess.checker import Options
    from .inprocess.run import run_script

    keys = ("out", "sample", "workers", "apis", "level", "keep", "queue_bytes", "when_full", "device", "standard")
    try:
        options = Options(**{key: getattr(args, key) for key in keys}, fail=False)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    return run_script(Path(args.script), list(args.args), options)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
