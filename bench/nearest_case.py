#!/usr/bin/env python3
"""How far the warm start's observations can carry a reader that never generalises.

For every trace of the held-out split, takes the error summary the expert's second probe
returns (error type, span kind and the first 100 characters of the message, grouped as the
probe groups them), finds the train-split trace whose summary shares the most words
(Jaccard similarity over words of three or more letters, error types as whole tokens) and
answers that trace's type. A trace with no error span has no neighbour and gets no answer.

This is a reference point for issue 9's held-out figures, not a detector: it reads only what
a warm-started Detector making the expert's first two probes sees, and it is exactly as good
as the train split's coverage of each held-out type's error text.

    python3 bench/nearest_case.py runs/corpus [--split test]
"""

import argparse
import json
import pathlib
import re
import sqlite3
import sys

PROBE = """SELECT error_type, kind, substr(MAX(error_message), 1, 100)
FROM spans WHERE trace_id = ? AND is_error = 1 GROUP BY error_type, kind"""


def records(corpus, split):
    path = corpus / "splits" / f"{split}.jsonl"
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        sys.exit(f"{path}: {e.strerror}")
    out = []
    for n, line in enumerate(lines, 1):
        try:
            r = json.loads(line)
            out.append((r["trace_id"], r["agent"], r["deficiency"]))
        except (ValueError, KeyError) as e:
            sys.exit(f"{path}:{n}: {e}")
    return out


def words(db, trace_id):
    found = set()
    for error_type, _kind, message in db.execute(PROBE, (trace_id,)):
        found.add(("error_type", error_type))
        found.update(w.lower() for w in re.findall(r"[A-Za-z_]{3,}", message or ""))
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("corpus", type=pathlib.Path)
    ap.add_argument("--split", default="test")
    args = ap.parse_args()
    store = args.corpus / "store.sqlite"
    if not store.exists():
        sys.exit(f"{store}: no trace store (run `pathfinder corpus generate --out {args.corpus}`)")
    db = sqlite3.connect(f"file:{store}?mode=ro", uri=True)
    train = [(words(db, t), agent, d) for t, agent, d in records(args.corpus, "train")]
    held = records(args.corpus, args.split)
    right = 0
    for trace_id, agent, truth in held:
        mine = words(db, trace_id)
        best, score = None, 0.0
        for theirs, _agent, d in train:
            union = len(mine | theirs)
            s = len(mine & theirs) / union if union else 0.0
            if s > score:
                best, score = d, s
        right += best == truth
        print(f"{agent:10} {truth:4} -> {best or '-':4} similarity {score:.2f}")
    print(f"nearest train case names the type of {right}/{len(held)} {args.split} traces "
          f"({100.0 * right / max(len(held), 1):.1f}%)")


if __name__ == "__main__":
    main()
