"""What ``edgebuild plan`` knows without building: per stage, cached or would run, and why; and a
stage's output for a backend's compute plan, read from the store or built into a temporary."""

from __future__ import annotations

import tempfile
from contextlib import contextmanager
from pathlib import Path

from edgebuild.build.jobs import Build
from edgebuild.store.lockfile import read_lock
from edgebuild.dag.executor import Executor, Job
from edgebuild.stage import Result


def stage_plan(build: Build, store) -> list[dict]:
    """For each stage: cached, or would run and why (compared with the last build's lock file)."""
    previous = (read_lock(build.output_dir) or {}).get("stages", {})
    rows, known = [], {}
    executor = Executor(store)
    for stage in build.job.stages:
        row = {"name": stage.name, "key": None, "status": "would run", "reason": ""}
        before = previous.get(stage.name)
        if stage.resolve is not None:
            result = stage.resolve()
            known[stage.name] = result
            row.update(key=result.key, status="cached" if result.status == "cached" else "would run")
            if before and before.get("digest") != result.digest:
                row["reason"] = "source file changed"
            rows.append(row)
            continue
        if all(d in known for d in stage.deps):
            key = executor.key_of(stage, known)
            row["key"] = key
            entry = store.lookup(key)
            if entry is not None:
                known[stage.name] = Result(stage.name, key, entry.digest, entry.out, entry.info, "cached", 0)
                row["status"] = "cached"
                if before and _changed_params(stage, before):  # only what judges its output changed
                    row["reason"] = "judged again: parameters changed: " + ", ".join(_changed_params(stage, before))
                rows.append(row)
                continue
        row["reason"] = _why(stage, before, known)
        rows.append(row)
    return rows


def _why(stage, before, known) -> str:
    if before is None:
        return "never built"
    changed = _changed_params(stage, before)
    if changed:
        return "parameters changed: " + ", ".join(changed)
    inputs = [d for d in stage.deps if d not in known or known[d].digest != before.get("inputs", {}).get(d)]
    if inputs:
        return "input changed: " + ", ".join(inputs)
    if stage.plugins != before.get("plugins"):
        return "plugin changed: " + ", ".join(_differing(stage.plugins, before.get("plugins") or {}))
    if stage.libraries_versions != before.get("libraries", {}):
        return "library changed: " + ", ".join(_differing(stage.libraries_versions, before.get("libraries") or {}))
    return "not in the store (evicted or built elsewhere)"


def _changed_params(stage, before: dict) -> list[str]:
    """The parameters whose recorded value differs from the last build's lock file."""
    params, was = stage.recorded_params(), before.get("params", {})
    return sorted(k for k in set(params) | set(was) if params.get(k) != was.get(k))


def _differing(now: dict, then: dict) -> list[str]:
    """``name then -> now`` for each distribution whose version differs (or that came or went)."""
    return [f"{name} {then.get(name, 'absent')} -> {now.get(name, 'absent')}"
            for name in sorted(set(now) | set(then)) if now.get(name) != then.get(name)]


@contextmanager
def stage_output(build: Build, store, name: str):
    """The :class:`Result` of the variant's stage ``name`` for the ``with`` block: taken from the store,
    or built (with the stages before it that the store lacks) into a temporary directory removed when
    the block ends; the store is only read. A stage that fails raises its error here."""
    names = [stage.name for stage in build.job.stages]
    with tempfile.TemporaryDirectory(prefix="edgebuild-plan-") as scratch:
        job = Job(f"{build.job.label} (plan)", build.job.stages[: names.index(name) + 1])
        Executor(store, scratch=Path(scratch)).run([job])
        if job.error is not None:
            raise job.error
        yield job.results[name]
