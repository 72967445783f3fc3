"""``harness merge OUT SHARD...``: the verdicts documents of a run's shards joined into the one the
unsharded run writes.

Each input is a document written with ``--shard I/N`` (``check --json``, ``mutants --json``), or a folder of them
(``run --shard I/N`` writes one per technique into its results' ``verdicts/``; then OUT is a folder and the files
are joined by name).  The shards must be one run: the same commit, profile, kind and technique, planned alike
(the same units and durations), every shard 1..N exactly once, no unit in two shards and none missing; anything
else is refused with the reason (exit 2), since a document joined from mismatched shards would claim a run that
never happened.  The joined document is the unsharded one's: implementations and verdicts in its order, ``seconds``
the longest shard's, and ``shards`` saying where and how long each ran.  Exit 1 when it holds a failure (as
``check`` and ``mutants`` would have exited), else 0.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from llm_inference_harness.engine import inputs, outputs


class MergeError(Exception):
    """Shards that do not make one run."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("out", help="where the joined document goes (a folder when the shards are folders)")
    p.add_argument("shards", nargs="+", metavar="SHARD", help="the shards' verdicts documents, or folders of them")


def run(args: argparse.Namespace) -> int:
    """``args.failing``: the statuses that fail a check (the command line's, handed over with the arguments)."""
    try:
        return merge_paths([Path(p) for p in args.shards], Path(args.out), tuple(args.failing))
    except MergeError as exc:
        print(f"harness merge: {exc}", file=sys.stderr)
        return 2


def merge_paths(shards: list[Path], out: Path, failing: tuple[str, ...]) -> int:
    missing = [str(p) for p in shards if not p.exists()]
    if missing:
        raise MergeError(f"no such file or folder: {', '.join(missing)}")
    if all(p.is_dir() for p in shards):
        names = sorted({f.name for p in shards for f in p.glob("*.json")})
        if not names:
            raise MergeError(f"no verdicts documents (*.json) in {', '.join(map(str, shards))}")
        status = 0
        out.mkdir(parents=True, exist_ok=True)
        for name in names:
            status |= merge_paths([p / name for p in shards], out / name, failing)
        return status
    if any(p.is_dir() for p in shards):
        raise MergeError("give either documents or folders of them, not both")
    merged = merge([(str(p), _read(p)) for p in shards])
    outputs.write_json(out, merged)
    found = failures(merged, failing)
    print(f"{out}: {len(shards)} shards joined, {_count(merged)} verdicts"
          + (f"; {len(found)} failing: {', '.join(found[:10])}" if found else ""))
    return 1 if found else 0


def _read(path: Path) -> dict:
    try:
        return inputs.verdicts(path)  # validated as every verdicts document the harness reads back
    except inputs.BadFile as exc:
        raise MergeError(str(exc)) from None


def merge(documents: list[tuple[str, dict]]) -> dict:
    """Join shard documents ((name, document) pairs) into the unsharded run's, or raise MergeError saying why not."""
    ordered = _validate(documents)
    first = ordered[0][1]
    merged = {k: v for k, v in first.items() if k not in ("shard", "executor")}
    if "seconds" in first:  # the run's wall time: its longest shard's
        merged["seconds"] = max(d["seconds"] for _, d in ordered)
    merged["started"] = min(d["started"] for _, d in ordered)
    merged["shards"] = [{"index": d["shard"]["index"], "file": name, "started": d["started"],
                         "seconds": d.get("seconds"), "machine": d["machine"]["name"],
                         "units": len(d["shard"]["units"]),
                         **({"executor": d["executor"]} if "executor" in d else {})} for name, d in ordered]
    if "techniques" in first:  # mutants: a document per technique inside
        techniques = list(dict.fromkeys(t["technique"] for _, d in ordered for t in d["techniques"]))
        merged["techniques"] = []
        for name in techniques:
            parts = [t for _, d in ordered for t in d["techniques"] if t["technique"] == name]
            merged["techniques"].append({**parts[0], "seconds": round(sum(p["seconds"] for p in parts), 3),
                                         **_join(parts)})
    else:
        merged.update(_join([d for _, d in ordered]))
    return merged


def _validate(documents: list[tuple[str, dict]]) -> list[tuple[str, dict]]:
    """The documents in shard order, once they are the shards of one run."""
    for name, d in documents:
        if d.get("schema") != "llm-inference-harness/verdicts":
            raise MergeError(f"{name}: not a verdicts document")
        if "shard" not in d:
            raise MergeError(f"{name}: not a shard's document (it was written without --shard)")
    for field, what in (("schema_version", "schema versions"), ("kind", "kinds"), ("technique", "techniques"),
                        ("commit", "commits"), ("profile", "profiles")):
        values = {name: d.get(field) for name, d in documents}
        if len(set(map(str, values.values()))) > 1:
            raise MergeError(f"shards of different {what}: " + ", ".join(f"{n} {v}" for n, v in values.items())
                             + " (every shard of a run must be one commit and profile)")
    records = [(name, d["shard"]) for name, d in documents]
    for field, what in (("count", "shard counts"), ("all_units", "sets of units"),
                        ("plan", "plans (each shard must get the same --durations)")):
        values = {name: r[field] for name, r in records}
        if len(set(values.values())) > 1:
            raise MergeError(f"shards with different {what}: " + ", ".join(f"{n} {v}" for n, v in values.items()))
    count = records[0][1]["count"]
    seen: dict[int, str] = {}
    for name, r in records:
        if r["index"] in seen:
            raise MergeError(f"shard {r['index']}/{count} given twice: {seen[r['index']]} and {name}")
        seen[r["index"]] = name
    absent = sorted(set(range(1, count + 1)) - set(seen))
    if absent:
        raise MergeError(f"missing shard(s) {', '.join(f'{i}/{count}' for i in absent)}: every shard of the run "
                         "must be given")
    owner: dict[tuple, str] = {}
    for name, r in records:
        for key in map(tuple, r["units"]):
            if key in owner:
                raise MergeError(f"unit {list(key)} is in two shards: {owner[key]} and {name}")
            owner[key] = name
    if len(owner) != records[0][1]["total_units"]:
        raise MergeError(f"the shards hold {len(owner)} units of the run's {records[0][1]['total_units']}: "
                         "some are missing")
    return sorted(documents, key=lambda nd: nd[1]["shard"]["index"])


def _join(parts: list[dict]) -> dict:
    """The implementations and verdicts of one technique's shards (in shard order): an implementation once (as
    reported by a shard whose checking process reported it), the verdicts in order."""
    implementations: dict[str, dict] = {}
    for part in parts:
        for impl in part["implementations"]:
            known = implementations.get(impl["target"])
            if known is None or known.get("mutant") is None:
                implementations[impl["target"]] = impl
    return {"implementations": list(implementations.values()),
            "verdicts": [v for part in parts for v in part["verdicts"]]}


def _count(document: dict) -> int:
    return sum(len(t["verdicts"]) for t in document.get("techniques", [document]))


def failures(document: dict, failing: tuple[str, ...]) -> list[str]:
    """What makes the joined run exit 1: a verdict of status in ``failing`` of an implementation that should pass,
    or a mutant that survived its declared killers (as ``check`` and ``mutants`` decide)."""
    from llm_inference_harness.engine.runner import ImplResult, Target, Verdict, mutant_status

    found = []
    for part in document.get("techniques", [document]):
        by_impl: dict[str, list[Verdict]] = {}
        for v in part["verdicts"]:
            by_impl.setdefault(v["impl"], []).append(Verdict(**v))
        for impl in part["implementations"]:
            verdicts = by_impl.get(impl["name"], [])
            if document["kind"] == "mutants":
                info = {**impl, "unavailable": "every property skipped" if verdicts and all(
                    v.status == "skip" for v in verdicts) else None}
                if not mutant_status(ImplResult(Target(part["technique"], name=impl["name"]), info, verdicts))[0] \
                        and not info["unavailable"]:
                    found.append(f"{part['technique']}/{impl['name']} survived")
            elif not impl.get("mutant"):
                found += [f"{v.impl}/{v.property}" for v in verdicts if v.status in failing]
    return found
