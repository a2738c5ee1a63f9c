#!/usr/bin/env python3
"""Adds a labelled set built outside the corpus (e.g. bench/external/pydantic-ai's) to a copy of
a corpus store as one more framework, so that `pathfinder eval --leave-out all` scores it beside
the corpus's own frameworks. Its traces are in no split: every fold scores them as a framework
left out, and no detector is fitted on them.

    merge-labelled-set.py CORPUS_STORE SET_DIR FRAMEWORK OUT_STORE

SET_DIR holds otlp/*.json and labels.jsonl (trace_id, deficiency_id, optional component, file,
function), as make-set.sh writes them. PATHFINDER names the binary (default:
target/release/pathfinder). OUT_STORE must not exist.
"""
import glob
import json
import os
import shutil
import sqlite3
import subprocess
import sys


def main() -> int:
    if len(sys.argv) != 5:
        print(__doc__, file=sys.stderr)
        return 2
    corpus, set_dir, framework, out = sys.argv[1:]
    if os.path.exists(out):
        print(f"{out}: exists; give a new path", file=sys.stderr)
        return 2
    files = sorted(glob.glob(os.path.join(set_dir, "otlp", "*.json")))
    labels_path = os.path.join(set_dir, "labels.jsonl")
    if not files or not os.path.isfile(labels_path):
        print(f"{set_dir}: needs otlp/*.json and labels.jsonl", file=sys.stderr)
        return 2
    labels = []
    with open(labels_path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if line.strip():
                label = json.loads(line)
                if not label.get("trace_id") or not label.get("deficiency_id"):
                    print(f"{labels_path}: line {number}: needs trace_id and deficiency_id", file=sys.stderr)
                    return 2
                labels.append(label)
    # A consistent copy of the corpus store (it may be in WAL mode).
    src = sqlite3.connect(corpus)
    dst = sqlite3.connect(out + ".partial")
    src.backup(dst)
    src.close()
    dst.close()
    binary = os.environ.get("PATHFINDER", "target/release/pathfinder")
    subprocess.run([binary, "traces", "import", *files, "--db", out + ".partial", "--format", "otlp"], check=True)
    db = sqlite3.connect(out + ".partial")
    known = {row[0] for row in db.execute("SELECT trace_id FROM traces")}
    missing = [l["trace_id"] for l in labels if l["trace_id"] not in known]
    if missing:
        print(f"{labels_path}: {len(missing)} labelled traces are not in the set's OTLP files, e.g. {missing[0]}", file=sys.stderr)
        return 1
    with db:
        for label in labels:
            source = dict(label, agent=framework, set=os.path.abspath(set_dir))
            db.execute(
                "INSERT INTO labels (trace_id, deficiency_id, component, file, function, source) VALUES (?, ?, ?, ?, ?, ?)",
                (label["trace_id"], label["deficiency_id"], label.get("component"), label.get("file"), label.get("function"), json.dumps(source)),
            )
    db.close()
    for suffix in ("-wal", "-shm"):
        if os.path.exists(out + ".partial" + suffix):
            os.remove(out + ".partial" + suffix)
    os.rename(out + ".partial", out)
    print(f"{out}: the corpus and {len(labels)} labelled traces of {framework}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
