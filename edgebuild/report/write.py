"""Write a variant's ``report.json`` and ``report.html``, and the page comparing variants.

What a report holds is ``report_schema.Report``; ``write_report`` checks the data against it
before writing anything, and the pages read the same model. A validation runtime's record
(``validation.runtimes[name]``) is made by ``runtime_record`` from the outputs of
``metrics.aggregate``, ``thresholds.check``, ``thresholds.limits_for``,
``thresholds.aggregation_for`` and ``metrics.merge_histograms``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from edgebuild.errors import BuildError, UsageError
from edgebuild.report.html import GENERATOR_META, render_combined, render_report
from edgebuild.report.schema import Report
from edgebuild.store.atomic import write_text_atomic

REPORT_JSON = "report.json"
REPORT_HTML = "report.html"
INDEX_HTML = "index.html"


def write_report(out_dir: Path, data: Report | Mapping[str, Any]) -> tuple[Path, Path]:
    """Write ``report.json`` and a self-contained ``report.html`` into ``out_dir``."""
    out_dir = Path(out_dir)
    report = data if isinstance(data, Report) else _validated(to_jsonable(data), "the build's report data")
    out_dir.mkdir(parents=True, exist_ok=True)
    plain = to_jsonable(report.model_dump(exclude_unset=True))
    json_path = _write_atomic(out_dir / REPORT_JSON, json.dumps(plain, indent=2, allow_nan=False) + "\n")
    html_path = _write_atomic(out_dir / REPORT_HTML, render_report(report))
    return json_path, html_path


def find_reports(root: Path, *, recursive: bool = False) -> list[Path]:
    """``report.json`` of every variant directly below ``root`` (``recursive``: at any depth),
    leaving out hidden directories (a build's temporaries)."""
    root = Path(root)
    pattern = f"**/{REPORT_JSON}" if recursive else f"*/{REPORT_JSON}"
    return sorted(p for p in root.glob(pattern)
                  if p.parent != root and not any(part.startswith(".") for part in p.relative_to(root).parts))


def write_combined(root: Path, *, recursive: bool = False, on_skip: Callable[[Path, str], None] | None = None) -> Path:
    """Write ``root/index.html`` comparing every variant's report below ``root`` (see ``find_reports``).

    A report this edgebuild cannot read (written by an older one, or damaged) is left off the
    page and handed to ``on_skip(path, why)``; with no ``on_skip`` it is an error."""
    root = Path(root)
    found = find_reports(root, recursive=recursive)
    if not found:
        raise UsageError(f"{root}: no variant reports (*/{REPORT_JSON}) below this directory",
                         hint="give a recipe's outputs.dir, or a folder above several")
    return write_combined_page(root / INDEX_HTML, [p.parent for p in found], on_skip=on_skip)


def write_combined_page(page: Path, variant_dirs: Sequence[Path], *,
                        on_skip: Callable[[Path, str], None] | None = None) -> Path:
    """Write ``page`` comparing the variants whose reports are in ``variant_dirs`` (one command's
    builds, say), each row linking the variant's report relative to the page; unreadable reports
    as in ``write_combined``."""
    page = Path(page)
    check_page(page)
    reports = []
    for folder in variant_dirs:
        path = Path(folder) / REPORT_JSON
        try:
            report = _validated(json.loads(path.read_text(encoding="utf-8")), str(path))
        except (OSError, ValueError, BuildError) as exc:
            if on_skip is None:
                raise BuildError(f"report: cannot read {path} ({exc})",
                                 hint="rebuild that variant to rewrite its report") from None
            on_skip(path, str(exc).splitlines()[0])
            continue
        link = Path(os.path.relpath(path.parent.resolve() / REPORT_HTML, page.parent.resolve())).as_posix()
        reports.append((link, report))
    if not reports:
        raise UsageError(f"{page.parent}: none of the {len(variant_dirs)} variant reports for this page is readable",
                         hint="rebuild the variants with this edgebuild to rewrite their reports")
    return _write_atomic(page, render_combined(reports))


def check_page(page: Path) -> None:
    """Refuse (exit 2) to write ``page`` over a file edgebuild did not write: outputs are owned."""
    page = Path(page)
    if page.is_symlink() or (page.exists() and not page.is_file()):
        raise UsageError(f"{_shown(page)}: is a {'symlink' if page.is_symlink() else 'directory'}; "
                         "edgebuild writes its pages only as files it made",
                         hint=f"remove or rename {_shown(page)}, or choose another outputs.dir")
    if page.exists() and not made_by_edgebuild(page):
        raise UsageError(f"{_shown(page)}: the file exists and edgebuild did not write it; it would be replaced "
                         "by the page comparing the variants",
                         hint=f"move it away (after saving what you need), or choose another outputs.dir")


def _shown(path: Path) -> str:
    try:
        return os.path.relpath(path)
    except ValueError:
        return str(path)


def made_by_edgebuild(page: Path) -> bool:
    """Whether the HTML file ``page`` is a page edgebuild wrote (and may replace)."""
    if Path(page).is_symlink():
        return False
    try:
        with open(page, encoding="utf-8", errors="replace") as f:
            return GENERATOR_META in f.read(4096)
    except OSError:
        return False


def _validated(data, where: str) -> Report:
    from pydantic import ValidationError

    try:
        return Report.model_validate(data)
    except ValidationError as exc:
        raise BuildError(f"report: {where} does not match the report schema: {exc}",
                         hint="rebuild the variant with this edgebuild to rewrite its report") from None


def runtime_record(aggregated: Mapping, failures: Sequence, *, limits: Mapping | None = None,
                   aggregation: Mapping | None = None, histograms: Mapping | None = None) -> dict[str, Any]:
    """One ``validation.runtimes`` entry from the outputs of aggregate/check/merge_histograms
    (``limits`` from thresholds.limits_for, ``aggregation`` from thresholds.aggregation_for)."""
    record: dict[str, Any] = {"metrics": aggregated, "failures": [_plain_failure(f) for f in failures]}
    if limits:
        record["limits"] = limits
    if aggregation:
        record["aggregation"] = aggregation
    if histograms:
        record["histograms"] = histograms
    return record


def to_jsonable(value: Any) -> Any:
    """``value`` with numpy scalars/arrays, paths, dataclasses and non-finite floats made JSON-safe."""
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_jsonable(dataclasses.asdict(value))
    if isinstance(value, (list, tuple, set)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, Path):
        return value.as_posix()
    if hasattr(value, "tolist") and hasattr(value, "dtype"):  # numpy scalar or array
        return to_jsonable(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def _plain_failure(failure) -> dict[str, Any]:
    if dataclasses.is_dataclass(failure):
        return dataclasses.asdict(failure)
    return dict(failure)


def _write_atomic(path: Path, text: str) -> Path:
    """Write via a temporary file and rename (a reader never sees half a report), with the
    umask's mode: reports get published."""
    write_text_atomic(path, text)
    return path
