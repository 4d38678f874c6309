"""Write a variant's ``report.json`` and ``report.html``, and the page comparing variants.

``data`` (every key optional; unknown keys are kept in the JSON and ignored by the page)::

    {
      "recipe": "orientation",            "variant": "int4",
      "status": "passed" | "failed" | "built" | ...,
      "recipe_path": "recipes/orientation.yaml",  "created": "2025-01-01T12:00:00Z",
      "artifact": {"path": "model.mlpackage", "kind": "mlpackage", "size_bytes": 1234567},
      "stages": [{"name": "lower", "key": "ab12...", "status": "ran" | "cached", "seconds": 1.5}],
      "sizes": {"layers": [{"name": "conv1.weight", "before_bytes": 4096, "after_bytes": 1024, ...}]},
      "validation": {
        "samples": 8, "reference": "onnxruntime",
        "runtimes": {                       # one entry per candidate runtime, see runtime_record()
          "interpreter": {
            "metrics":    {output: {metric: {"avg", "p90", "p99", "max", "min"}}},  # metrics.aggregate
            "failures":   [{"output", "metric", "value", "limit", "message"}],      # thresholds.check
            "limits":     {output: {"cosine_min": 0.995, ...}},                     # thresholds.limits_for
            "histograms": {output: {"edges": [...], "counts": [...]}},             # metrics.merge_histograms
          },
          "coreml": {"skipped": "Core ML runs only on macOS"},
        },
      },
      "plan": {"ops": [{...}], "breakdown": {unit: ms or {...}}, "total_ms": 12.3},
      "optimize": {"rules": [{"name": "conv_bn", "count": 3}] or {"conv_bn": 3}},
      "notes": ["free text", ...],
    }

In ``report.json`` non-finite floats are written as the strings ``"inf"``, ``"-inf"`` and
``"nan"`` (JSON has no such numbers; an SNR of identical outputs is ``inf``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Mapping, Sequence

from edgebuild.errors import BuildError
from edgebuild.verify.html import render_combined, render_report

REPORT_JSON = "report.json"
REPORT_HTML = "report.html"
INDEX_HTML = "index.html"


def write_report(out_dir: Path, data: Mapping[str, Any]) -> tuple[Path, Path]:
    """Write ``report.json`` and a self-contained ``report.html`` into ``out_dir``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    plain = to_jsonable(data)
    json_path = _write_atomic(out_dir / REPORT_JSON, json.dumps(plain, indent=2, allow_nan=False) + "\n")
    html_path = _write_atomic(out_dir / REPORT_HTML, render_report(plain))
    return json_path, html_path


def write_combined(root: Path) -> Path:
    """Write ``root/index.html`` comparing every ``root/*/report.json`` (one per variant)."""
    root = Path(root)
    reports = []
    for path in sorted(root.glob(f"*/{REPORT_JSON}")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise BuildError(f"report: cannot read {path} ({exc})", hint="rebuild that variant to rewrite its report") from None
        reports.append((f"{path.parent.name}/{REPORT_HTML}", data))
    return _write_atomic(root / INDEX_HTML, render_combined(reports))


def runtime_record(aggregated: Mapping, failures: Sequence, *, limits: Mapping | None = None, histograms: Mapping | None = None) -> dict[str, Any]:
    """One ``validation.runtimes`` entry from the outputs of aggregate/check/merge_histograms."""
    record: dict[str, Any] = {"metrics": aggregated, "failures": [_plain_failure(f) for f in failures]}
    if limits:
        record["limits"] = limits
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
    """Write via a temporary file and rename, so a reader never sees half a report."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
