"""Replays agent runs through the real OpenTelemetry Python SDK and its OTLP/HTTP exporter.

Each input is a trace in the agents' JSON Lines contract (agents/CONTRACT.md), as a run of a
target agent wrote it. Its spans are re-created with the SDK's tracer (same names, parents,
start and end times, attributes, status and exception events; the SDK picks new ids), and
exported twice: by `OTLPSpanExporter` (protobuf over HTTP, gzip when asked) to the receiver
under test, and as an OTLP/JSON file (the SDK's own protobuf encoding, written with
protobuf's JSON mapping and the ids in hex as OTLP/JSON wants) that `pathfinder traces import`
reads. The test compares the receiver's verdicts with `traces import` + `detect` on that file.

Usage: python3 replay.py --endpoint URL --json-out FILE [--gzip] [--token T] TRACE.jsonl...
Prints one line per trace: `<source file> <trace id>`.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from pathlib import Path

from google.protobuf.json_format import MessageToDict
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.trace import Status, StatusCode

# The contract's `kind` as OpenInference names it (the importer reads either convention).
KINDS = {"agent": "AGENT", "llm": "LLM", "tool": "TOOL", "chain": "CHAIN",
         "retriever": "RETRIEVER", "other": "UNKNOWN"}


class Keep(SpanExporter):
    """Keeps every finished span, for the OTLP/JSON file."""

    def __init__(self) -> None:
        self.spans = []

    def export(self, spans):
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def attribute(value):
    """SDK attribute values are primitives or lists of them; anything else goes as JSON."""
    if isinstance(value, (str, bool, int, float)):
        return value
    return json.dumps(value, sort_keys=True)


def replay(path: Path, provider: TracerProvider) -> str:
    spans = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    tracer = provider.get_tracer("pathfinder.replay", "1.0")
    by_id = {s["span_id"]: s for s in spans}
    children: dict[str | None, list] = {}
    for s in spans:
        parent = s.get("parent_span_id")
        children.setdefault(parent if parent in by_id else None, []).append(s)
    created = {}
    trace_id = None

    def open_tree(s, context):
        nonlocal trace_id
        attrs = {k: attribute(v) for k, v in (s.get("attributes") or {}).items() if v is not None}
        attrs.setdefault("openinference.span.kind", KINDS.get(s.get("kind", "other"), "UNKNOWN"))
        span = tracer.start_span(s["name"], context=context, attributes=attrs,
                                 start_time=int(s["start_time_unix_nano"]))
        created[s["span_id"]] = span
        if trace_id is None:
            trace_id = format(span.get_span_context().trace_id, "032x")
        for event in s.get("events") or []:
            span.add_event(event.get("name", "event"),
                           {k: attribute(v) for k, v in (event.get("attributes") or {}).items()},
                           timestamp=event.get("time_unix_nano"))
        for child in sorted(children.get(s["span_id"], []), key=lambda c: c["start_time_unix_nano"]):
            open_tree(child, trace.set_span_in_context(span))
        status = (s.get("status") or {}).get("code", "UNSET")
        if status == "ERROR":
            span.set_status(Status(StatusCode.ERROR, (s.get("status") or {}).get("message") or None))
        elif status == "OK":
            span.set_status(Status(StatusCode.OK))
        span.end(end_time=int(s["end_time_unix_nano"] or s["start_time_unix_nano"]))

    for root in sorted(children.get(None, []), key=lambda c: c["start_time_unix_nano"]):
        # A span whose parent is not in the file hangs under the first root: one file, one trace.
        context = trace.set_span_in_context(created[next(iter(created))]) if created else None
        open_tree(root, context)
    return trace_id


def hex_ids(node):
    """protobuf's JSON mapping writes bytes in base64; OTLP/JSON writes ids in hex."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("traceId", "spanId", "parentSpanId") and isinstance(value, str):
                node[key] = base64.b64decode(value).hex()
            else:
                hex_ids(value)
    elif isinstance(node, list):
        for item in node:
            hex_ids(item)
    return node


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoint", required=True, help="the receiver's /v1/traces URL")
    parser.add_argument("--json-out", required=True, type=Path)
    parser.add_argument("--gzip", action="store_true")
    parser.add_argument("--token")
    parser.add_argument("--service", default="replayed-agent")
    parser.add_argument("traces", nargs="+", type=Path)
    args = parser.parse_args()

    headers = {"Authorization": f"Bearer {args.token}"} if args.token else None
    exporter = OTLPSpanExporter(
        endpoint=args.endpoint,
        headers=headers,
        compression=Compression.Gzip if args.gzip else Compression.NoCompression,
    )
    keep = Keep()
    provider = TracerProvider(resource=Resource.create({"service.name": args.service}))
    # Simple processors: each span is exported when it ends, as a live agent's would be.
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    provider.add_span_processor(SimpleSpanProcessor(keep))
    for path in args.traces:
        print(path, replay(path, provider), flush=True)
    provider.shutdown()
    request = MessageToDict(encode_spans(keep.spans))
    args.json_out.write_text(json.dumps(hex_ids(request)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
