"""Compare `cellar bench` results of two builds, run alternated on one machine.

    python -m cellar.bench.compare --before DIR [DIR ...] --after DIR [DIR ...]

Each DIR is a `cellar bench --out DIR` folder (its JSON file). Per row: the median over the
runs of each side, every run's figure, and the ratio of medians with higher meaning better
(latency rows are inverted). Then the median ratio and how many rows' before and after ranges
overlap: on a noisy machine a row is "within noise" when they do, and the rows where they do
not are listed with their direction. Prints markdown; never runs a benchmark itself.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

Row = dict[str, Any]


def row_key(r: Row) -> tuple[Any, ...]:
    kind = r["kind"]
    fields = {
        "data": ("transport", "api", "op", "size_bytes", "batch"),
        "latency": ("transport", "op", "size_bytes"),
        "sdk": ("figure", "line", "keys", "mode", "transport", "loop"),
        "tls": ("workload", "op"),
        "metadata": ("op", "objects"),
    }.get(kind, ())
    return (kind, *(r.get(f) for f in fields))


def row_value(r: Row) -> tuple[float | None, bool]:
    """(figure, higher is better)."""
    for name, higher in (("ops_per_s", True), ("keys_per_s", True), ("tls_over_plain", True),
                         ("ratio", True), ("p50_us", False)):
        if r.get(name) is not None:
            return float(r[name]), higher
    return None, True


def load(folders: list[Path]) -> list[dict[str, Any]]:
    runs = []
    for folder in folders:
        files = sorted(folder.glob("*.json"))
        if not files:
            raise SystemExit(f"{folder}: no cellar bench JSON file")
        runs.append(json.loads(files[-1].read_text()))
    return runs


def by_row(runs: list[dict[str, Any]]) -> dict[tuple[Any, ...], list[float]]:
    table: dict[tuple[Any, ...], list[float]] = {}
    for run in runs:
        for r in run["results"]:
            value, _ = row_value(r)
            if value is not None:
                table.setdefault(row_key(r), []).append(value)
    return table


def compare(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> str:
    tb, ta = by_row(before), by_row(after)
    higher = {row_key(r): row_value(r)[1] for run in before for r in run["results"]}
    ceilings = [[round(run["ceilings_measured"][0].get("tcp_GBps", 0), 2) for run in side]
                for side in (before, after)]
    lines = [f"tcp ceiling per run, GB/s: before {ceilings[0]}, after {ceilings[1]}", "",
             "| row | before: median (runs) | after: median (runs) | after/before |",
             "|---|---|---|---|"]
    ratios, apart = [], []
    for key, vb in tb.items():
        va = ta.get(key)
        if not va:
            continue
        mb, ma = statistics.median(vb), statistics.median(va)
        ratio = ma / mb if higher[key] else mb / ma
        ratios.append(ratio)
        name = " ".join(str(x) for x in key if x is not None)
        runs = (", ".join(f"{v:,.0f}" if v >= 10 else f"{v:.2f}" for v in side) for side in (vb, va))
        lines.append(f"| {name} | {mb:,.1f} ({next(runs)}) | {ma:,.1f} ({next(runs)}) | "
                     f"{ratio:.2f} |")
        if not (min(va) <= max(vb) and min(vb) <= max(va)):
            apart.append(f"{name}: {'faster' if ratio > 1 else 'slower'} after")
    ratios.sort()
    lines += ["", f"{len(ratios)} rows: median after/before {statistics.median(ratios):.2f}, "
              f"quartiles {ratios[len(ratios) // 4]:.2f}-{ratios[3 * len(ratios) // 4]:.2f}; "
              f"ranges overlap in {len(ratios) - len(apart)} of {len(ratios)} rows"]
    lines += [f"- apart: {text}" for text in apart]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m cellar.bench.compare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, nargs="+", required=True)
    parser.add_argument("--after", type=Path, nargs="+", required=True)
    args = parser.parse_args(argv)
    print(compare(load(args.before), load(args.after)), end="")


if __name__ == "__main__":
    main()
