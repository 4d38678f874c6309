"""The corpus of public architectures: edgebuild and coremltools on the same models.

Every entry of the corpus (torchvision's and transformers' model classes with random weights,
``edgebuild_testplugin.corpus_torchvision`` and ``corpus_transformers``) goes through both tools:

- exported with ``torch.onnx.export`` (dynamo first, then the TorchScript exporter) and run by
  onnxruntime; a model that fails either is listed as excluded, with the reason;
- edgebuild: ``edgebuild run --json`` on a recipe pinning the example shapes, at fp32 and fp16,
  validated against onnxruntime (cosine >= 0.9999 at fp32, 0.999 at fp16);
- coremltools: ``ct.convert`` of ``torch.jit.trace`` of the same module (fp32 ML program), its
  package checked with ``edgebuild verify`` against the same ONNX file.

    python benchmarks/corpus.py [--family classification,video] [--models resnet18,vit_small]
                                [--precisions fp32,fp16] [--no-coremltools] [--results rows.jsonl] [--no-run] [--json]

A detector (``--family detection``) is validated by IoU matching of its boxes
(``validate.detections``): its cell shows the cosine over the matched pairs, then the share of
boxes matched and their mean IoU, ``0.999998 (boxes 1.000 iou 1.0000)``.

One table row per model, then per family: models, exported and run by onnxruntime, built and
validated by edgebuild at each precision, converted by coremltools (and validated by verify at
the fp32 limit); a ratio line compares the two tools on the models that entered the corpus.
``--results`` appends each finished row to a JSON-lines file and skips the models already in it,
so a long run can be resumed (``--no-run`` prints the table of what is there). Export files are cached in ``EDGEBUILD_CORPUS_CACHE``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from edgebuild_testplugin import corpus


def entries(families: set[str] | None, models: set[str] | None) -> list:
    from edgebuild_testplugin.corpus_torchvision import ENTRIES as torchvision_entries

    found = list(torchvision_entries)
    try:
        from edgebuild_testplugin.corpus_transformers import ENTRIES as transformers_entries
    except ImportError as error:
        print(f"transformers entries not loaded: {error}", file=sys.stderr)
    else:
        found += list(transformers_entries)
    return [e for e in found if (not families or e.family in families) and (not models or e.name in models)]


def run_entry(entry, precisions: list[str], coremltools: bool, workdir: Path) -> dict:
    """One row: what became of the entry at each step."""
    row = {"family": entry.family, "model": entry.name, "exported": False, "onnxruntime": False, "excluded": ""}
    started = time.perf_counter()
    try:
        exported = corpus.export(entry)
        row.update(exported=True, exporter=exported.exporter, export_seconds=round(exported.seconds, 1))
        corpus.onnxruntime_runs(exported, entry)
        row["onnxruntime"] = True
    except corpus.Excluded as excluded:
        row["excluded"] = str(excluded)
        return row
    except Exception as error:  # the entry itself is broken: a row, not a crash of the whole table
        row["excluded"] = f"make: {corpus.first_line(f'{type(error).__name__}: {error}')}"
        return row
    for precision in precisions:
        row[precision] = asdict(corpus.build(exported, entry, workdir / entry.name / precision, precision))
    if coremltools:
        row["coremltools"] = asdict(corpus.coremltools_convert(entry, exported, workdir / entry.name / "coremltools"))
    row["seconds"] = round(time.perf_counter() - started, 1)
    return row


def _passed(step: dict | None, limit: float) -> bool:
    return bool(step) and step.get("cosine") is not None and float(step["cosine"]) >= limit and (
        step.get("validated", True))


def _cosine(step: dict | None, limit: float) -> str:
    """The worst cosine, marked "below" under the limit; "failed" when nothing was built."""
    if not step:
        return "-"
    if step.get("cosine") is None:
        return "failed" if not step.get("built", step.get("converted")) else "not validated"
    # float(): a non-finite cosine is saved as the string "nan" (the JSON of `edgebuild run --json`)
    shown = f"{float(step['cosine']):.6f}" + ("" if _passed(step, limit) else " below")
    return shown + _boxes(step.get("boxes"))


def _boxes(boxes: dict | None) -> str:
    """A detector's box matching beside its cosine (which is then over the matched pairs)."""
    if not boxes:
        return ""
    iou = f" iou {float(boxes['iou']):.4f}" if boxes.get("iou") is not None else ""
    return f" (boxes {float(boxes['match']):.3f}{iou})"


def _seconds(step: dict | None) -> str:
    return f"{step['seconds']:.0f}s" if step and step.get("seconds") is not None else "-"


def print_table(rows: list[dict], precisions: list[str], coremltools: bool) -> None:
    header = ["family", "model", "exported", "ort"] + [f"edgebuild {p}" for p in precisions] + ["edgebuild s"]
    if coremltools:
        header += ["coremltools", "coremltools s"]
    table = [header]
    for row in rows:
        line = [row["family"], row["model"], row.get("exporter", "no") if row["exported"] else "no",
                "yes" if row["onnxruntime"] else ("no" if row["exported"] else "-")]
        line += [_cosine(row.get(p), corpus.COSINE_MIN[corpus.PRECISIONS[p]]) for p in precisions]
        line.append(_seconds(row.get(precisions[0])) if precisions else "-")
        if coremltools:
            line += [_cosine(row.get("coremltools"), corpus.COSINE_MIN["float32"]), _seconds(row.get("coremltools"))]
        table.append(line)
    widths = [max(len(str(line[i])) for line in table) for i in range(len(header))]
    for line in table:
        print("  ".join(str(cell).ljust(width) for cell, width in zip(line, widths)).rstrip())
    print()
    for row in rows:
        errors = [f"{p}: {row[p]['error']}" for p in precisions if row.get(p, {}).get("error")]
        if coremltools and row.get("coremltools", {}).get("error"):
            errors.append(f"coremltools: {row['coremltools']['error']}")
        if row["excluded"]:
            errors = [f"excluded: {row['excluded']}"]
        for error in errors:
            print(f"  {row['family']}/{row['model']}: {error}")
    print()
    families = sorted({row["family"] for row in rows})
    summary = [["family", "models", "entered"] + [f"edgebuild {p}" for p in precisions]
               + (["coremltools converted", "coremltools valid"] if coremltools else [])]
    totals = None
    for family in families + ["all"]:
        chosen = [row for row in rows if family in ("all", row["family"])]
        entered = [row for row in chosen if not row["excluded"]]
        counts = [len(chosen), len(entered)]
        counts += [sum(_passed(row.get(p), corpus.COSINE_MIN[corpus.PRECISIONS[p]]) for row in entered)
                   for p in precisions]
        if coremltools:
            counts += [sum(bool(row.get("coremltools", {}).get("converted")) for row in entered),
                       sum(_passed(row.get("coremltools"), corpus.COSINE_MIN["float32"]) for row in entered)]
        summary.append([family] + [str(c) for c in counts])
        totals = counts
    widths = [max(len(line[i]) for line in summary) for i in range(len(summary[0]))]
    for line in summary:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip())
    if totals and coremltools and "fp32" in precisions:
        ours, theirs = totals[2 + precisions.index("fp32")], totals[-1]
        ratio = f"{ours / theirs:.2f}x" if theirs else "n/a"
        print(f"\nvalidated at fp32 of {totals[1]} models in the corpus: edgebuild {ours}, coremltools {theirs} "
              f"(ratio {ratio})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="", help="comma-separated families (default: all)")
    parser.add_argument("--models", default="", help="comma-separated model names (default: all)")
    parser.add_argument("--precisions", default="fp32,fp16")
    parser.add_argument("--no-coremltools", action="store_true", help="leave out ct.convert")
    parser.add_argument("--results", type=Path, action="append", default=[],
                        help="JSON lines: rows there are not run again, finished rows are appended to the first")
    parser.add_argument("--no-run", action="store_true", help="only print the table of the --results rows")
    parser.add_argument("--workdir", type=Path, help="build folders (default: a temporary one)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON instead of the table")
    options = parser.parse_args()
    precisions = [p for p in options.precisions.split(",") if p]
    chosen = entries(set(filter(None, options.family.split(","))), set(filter(None, options.models.split(","))))
    done = {}
    for results in options.results:
        for line in results.read_text().splitlines() if results.exists() else ():
            if line.strip():
                row = json.loads(line)
                done[(row["family"], row["model"])] = row
    workdir = options.workdir or Path(tempfile.mkdtemp(prefix="edgebuild-corpus-runs-"))
    rows = []
    for entry in chosen:
        if (entry.family, entry.name) in done or options.no_run:
            rows += [done[(entry.family, entry.name)]] if (entry.family, entry.name) in done else []
            continue
        print(f"{entry.id} ...", file=sys.stderr, flush=True)
        row = run_entry(entry, precisions, not options.no_coremltools, workdir)
        rows.append(row)
        if options.results:
            with options.results[0].open("a") as handle:
                handle.write(json.dumps(row) + "\n")
    if options.json:
        print(json.dumps(rows, indent=1))
    else:
        print_table(rows, precisions, not options.no_coremltools)


if __name__ == "__main__":
    main()
