"""What ``edgebuild plan`` knows without building: per stage, cached or would run, and why."""

from __future__ import annotations

from edgebuild.build.jobs import Build
from edgebuild.store.lockfile import read_lock
from edgebuild.dag.executor import Executor


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
                from edgebuild.dag.stages import Result

                known[stage.name] = Result(stage.name, key, entry.digest, entry.out, entry.info, "cached", 0)
                row["status"] = "cached"
                rows.append(row)
                continue
        row["reason"] = _why(stage, before, known)
        rows.append(row)
    return rows


def _why(stage, before, known) -> str:
    if before is None:
        return "never built"
    changed = sorted(k for k in set(stage.params) | set(before.get("params", {}))
                     if stage.params.get(k) != before.get("params", {}).get(k))
    if changed:
        return "parameters changed: " + ", ".join(changed)
    inputs = [d for d in stage.deps if d not in known or known[d].digest != before.get("inputs", {}).get(d)]
    if inputs:
        return "input changed: " + ", ".join(inputs)
    if stage.plugins != before.get("plugins"):
        return "plugin version changed"
    return "not in the store (evicted or built elsewhere)"
