"""Builds the labelled OTLP set: qa_agent run healthy and with each variant of variants.toml
against `pathfinder serve`'s scripted model, each run's trace kept as OTLP/JSON and labelled.

    python make_set.py --pathfinder BIN --out DIR [--per-variant 8] [--seed 0]

Writes DIR/otlp/*.json (one run each, under a random name), DIR/labels.jsonl (for
`pathfinder eval --labels`), DIR/references/*.json and DIR/references.jsonl (a second healthy
run of every task, for `pathfinder eval --references`) and DIR/manifest.json (what was run,
kept and why not). A variant's
run is kept only when its trace differs from the healthy run of the same task in what the
spans do (names, statuses, tool calls and results, errors) or what the model was shown; runs
that did not are counted.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(pathfinder: Path, scripts: Path, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    server = subprocess.Popen(
        [str(pathfinder), "serve", "--port", str(port), "--scripts", str(scripts)],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )
    deadline = time.time() + 30
    while time.time() < deadline:
        if server.poll() is not None:
            sys.exit(f"pathfinder serve exited early; see {log}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return server, f"http://127.0.0.1:{port}/v1"
        except OSError:
            time.sleep(0.2)
    server.kill()
    sys.exit(f"pathfinder serve did not listen on port {port} within 30 s; see {log}")


def planted_copy(variant: dict | None, work: Path) -> Path:
    """A copy of qa_agent with the variant's edit applied (the pristine app for None)."""
    name = variant["name"] if variant else "healthy"
    # A folder with a random name: stack traces carry the application's paths, and a folder
    # named after the variant (or derived from its name) would tell a detector the answer.
    target = Path(tempfile.mkdtemp(prefix="app-", dir=work))
    shutil.copytree(HERE / "qa_agent", target / "qa_agent")
    if variant:
        path = target / variant["file"]
        text = path.read_text(encoding="utf-8")
        if text.count(variant["old"]) != 1:
            sys.exit(
                f"variants.toml: variant {name!r}: `old` occurs {text.count(variant['old'])} "
                f"times in {variant['file']}, expected exactly once"
            )
        path.write_text(text.replace(variant["old"], variant["new"]), encoding="utf-8")
    return target


def run_agent(app: Path, task: Path, base_url: str, key: str, trace: Path, corpus: Path) -> dict:
    started = time.time()
    proc = subprocess.run(
        [sys.executable, "-m", "qa_agent", "--task", str(task), "--base-url", base_url,
         "--trace", str(trace), "--script-key", key],
        cwd=app,
        env={"QA_CORPUS": str(corpus), "PATH": "/usr/bin:/bin", "PYTHONHASHSEED": "0",
             "OTEL_SDK_DISABLED": "false", "TIKTOKEN_CACHE_DIR": str(app / "no-tiktoken")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    last = proc.stdout.strip().splitlines()[-1:] or ["{}"]
    try:
        solved = json.loads(last[0]).get("solved", False)
    except json.JSONDecodeError:
        solved = False
    return {"rc": proc.returncode, "solved": solved, "seconds": round(time.time() - started, 2),
            "stderr": proc.stderr.strip().splitlines()[-1:] if proc.returncode else []}


def spans(trace: Path) -> list[dict]:
    doc = json.loads(trace.read_text(encoding="utf-8"))
    out = []
    for resource in doc.get("resourceSpans", []):
        for scope in resource.get("scopeSpans", []):
            out.extend(scope.get("spans", []))
    return sorted(out, key=lambda s: (int(s.get("startTimeUnixNano", 0)), s.get("name", "")))


def attribute(span: dict, key: str):
    for kv in span.get("attributes", []):
        if kv["key"] == key:
            return next(iter(kv["value"].values()), None)
    return None


def prompt(span: dict) -> str | None:
    """A model call's input messages without the ids the client draws at random."""
    text = attribute(span, "gen_ai.input.messages")
    if text is None:
        return None
    messages = json.loads(text)
    for message in messages:
        for part in message.get("parts", []):
            part.pop("id", None)
    return json.dumps(messages, sort_keys=True)


def behaviour(trace: Path) -> list[tuple]:
    """What each span did and, for model calls, what the model was shown; without ids, times
    or token counts."""
    out = []
    for s in spans(trace):
        events = tuple(
            attribute(e, "exception.type") for e in s.get("events", []) if e.get("name") == "exception"
        )
        out.append((
            s.get("name"),
            s.get("status", {}).get("code", "STATUS_CODE_UNSET"),
            attribute(s, "gen_ai.tool.name"),
            attribute(s, "gen_ai.tool.call.arguments"),
            attribute(s, "gen_ai.tool.call.result"),
            prompt(s),
            events,
        ))
    return out


def trace_id(trace: Path) -> str:
    ids = {s["traceId"] for s in spans(trace)}
    if len(ids) != 1:
        sys.exit(f"{trace}: expected one trace id, found {len(ids)}")
    return ids.pop()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pathfinder", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tasks", type=Path, default=REPO / "agents/tasks/gaia")
    parser.add_argument("--scripts", type=Path, default=REPO / "agents/tasks/scripts")
    parser.add_argument("--corpus", type=Path, default=REPO / "agents/tasks/corpus")
    parser.add_argument("--script-agent", default="toolcaller",
                        help="whose scripted solution paths the model plays")
    parser.add_argument("--per-variant", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=2, help="agent runs at a time")
    args = parser.parse_args()

    variants = tomllib.loads((HERE / "variants.toml").read_text(encoding="utf-8"))["variant"]
    tasks = sorted(
        t for t in args.tasks.glob("*.json")
        if (args.scripts / args.script_agent / t.name).is_file()
    )
    if args.out.exists():
        sys.exit(f"{args.out} exists; give a new folder")
    otlp = args.out / "otlp"
    otlp.mkdir(parents=True)
    references = args.out / "references"
    references.mkdir()
    reference_ids: list[str] = []
    work = Path(tempfile.mkdtemp(prefix="qa-agent-"))
    server, base_url = start_server(args.pathfinder, args.scripts, args.out / "serve.log")
    labels, manifest = [], {"healthy": {}, "variants": {}, "unsolved_healthy": []}
    counter = itertools.count(1)
    pool = ThreadPoolExecutor(max_workers=args.jobs)

    def run(app: Path, task: Path, tag: str) -> tuple[Path, dict]:
        # Each run its own script tag, so the scripted provider's faults are counted per run.
        n = next(counter)
        # A random file name: a name derived from the variant would tell the answer too.
        trace = work / f"{uuid.uuid4().hex[:16]}.json"
        key = f"{args.script_agent}/{task.stem}@r{n}/main"
        return trace, run_agent(app, task, base_url, key, trace, args.corpus.resolve())

    def run_all(app: Path, tasks: list[Path], tag: str) -> list[tuple[Path, dict]]:
        """`run` on each task, `--jobs` at a time, results in task order."""
        return list(pool.map(lambda t: run(app, t, tag), tasks))

    try:
        healthy_app = planted_copy(None, work)
        healthy = {}
        firsts = run_all(healthy_app, tasks, "healthy")
        # A second healthy run of each task: the known-good run a user keeps beside the ones
        # they debug (`pathfinder eval --references`). Not labelled, not evaluated.
        seconds = run_all(healthy_app, tasks, "reference")
        for task, (trace, outcome), (again, again_outcome) in zip(tasks, firsts, seconds):
            manifest["healthy"][task.stem] = outcome
            if not outcome["solved"]:
                manifest["unsolved_healthy"].append(task.stem)
                continue
            healthy[task.stem] = (trace, behaviour(trace))
            shutil.copy(trace, otlp / trace.name)
            labels.append({"trace_id": trace_id(trace), "deficiency_id": "none"})
            if again_outcome["solved"]:
                shutil.copy(again, references / again.name)
                reference_ids.append(trace_id(again))
        print(f"healthy: {len(healthy)} of {len(tasks)} tasks solved", flush=True)

        rng = random.Random(args.seed)
        for variant in variants:
            app = planted_copy(variant, work)
            order = sorted(healthy)
            rng.shuffle(order)
            record = {"deficiency": variant["deficiency"], "kept": [], "no_change": [],
                      "tried": 0}
            for start in range(0, len(order), args.jobs):
                if len(record["kept"]) >= args.per_variant:
                    break
                chunk = order[start : start + args.jobs]
                done = run_all(app, [args.tasks / f"{stem}.json" for stem in chunk], variant["name"])
                for stem, (trace, outcome) in zip(chunk, done):
                    if len(record["kept"]) >= args.per_variant:
                        break
                    record["tried"] += 1
                    if behaviour(trace) == healthy[stem][1]:
                        record["no_change"].append(stem)
                        continue
                    record["kept"].append({"task": stem, **outcome})
                    shutil.copy(trace, otlp / trace.name)
                    labels.append({
                        "trace_id": trace_id(trace),
                        "deficiency_id": variant["deficiency"],
                        "component": variant["component"],
                        "file": variant["file"],
                        "function": variant["function"],
                    })
            manifest["variants"][variant["name"]] = record
            print(f"{variant['name']} ({variant['deficiency']}): kept {len(record['kept'])} "
                  f"of {record['tried']}", flush=True)
    finally:
        pool.shutdown(wait=True)
        server.terminate()
        server.wait(timeout=10)
        shutil.rmtree(work, ignore_errors=True)

    rng = random.Random(args.seed + 1)
    rng.shuffle(labels)
    with (args.out / "labels.jsonl").open("w", encoding="utf-8") as handle:
        for label in labels:
            handle.write(json.dumps(label) + "\n")
    with (args.out / "references.jsonl").open("w", encoding="utf-8") as handle:
        for trace in reference_ids:
            handle.write(json.dumps({"trace_id": trace}) + "\n")
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    deficient = sum(1 for l in labels if l["deficiency_id"] != "none")
    print(f"{len(labels)} labelled traces ({deficient} deficient, {len(labels) - deficient} "
          f"healthy) in {args.out}; {next(counter) - 1} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
