"""OpenTelemetry set up for one run: every span Pydantic AI's instrumentation makes, written at
the end as one OTLP/JSON document (`ExportTraceServiceRequest`, hex ids), the format an
OpenTelemetry collector's file exporter writes."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from google.protobuf.json_format import MessageToDict
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult


class CollectingExporter(SpanExporter):
    """Keeps finished spans in memory until `write`."""

    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def export(self, spans) -> SpanExportResult:
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def write(self, path: Path) -> None:
        document = MessageToDict(encode_spans(self.spans))
        for resource in document.get("resourceSpans", []):
            for scope in resource.get("scopeSpans", []):
                for span in scope.get("spans", []):
                    for key in ("traceId", "spanId", "parentSpanId"):
                        if span.get(key):
                            span[key] = base64.b64decode(span[key]).hex()
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(document, ensure_ascii=False), encoding="utf-8")
        tmp.replace(path)


def provider(service: str) -> tuple[TracerProvider, CollectingExporter]:
    exporter = CollectingExporter()
    tracer_provider = TracerProvider(resource=Resource.create({"service.name": service}))
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    return tracer_provider, exporter
