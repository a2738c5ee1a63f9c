//! From an HTTP request body to the spans the inbox keeps: the media type and compression
//! checked, the body decoded (protobuf or JSON) within its limits, and each span checked by
//! the trace store's own OTLP importer, so a span acknowledged here is one the store will
//! accept when its trace is assembled.

use std::io::Read;

use prost::Message;
use serde_json::{json, Value};

use crate::proto;

/// How the request's spans were encoded; the response is encoded the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Protobuf,
    Json,
}

/// Why a request was refused as a whole (nothing of it is stored).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// 415: a content type or encoding OTLP/HTTP does not use.
    Unsupported(String),
    /// 413: over the body limit, compressed or once decompressed.
    TooLarge(String),
    /// 400: not an `ExportTraceServiceRequest` in the declared encoding.
    Malformed(String),
}

impl Refusal {
    pub fn reason(&self) -> &str {
        match self {
            Refusal::Unsupported(r) | Refusal::TooLarge(r) | Refusal::Malformed(r) => r,
        }
    }
}

/// The request's encoding from its `Content-Type` (parameters such as `charset` ignored).
pub fn encoding(content_type: Option<&str>) -> Result<Encoding, Refusal> {
    let media = content_type
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    match media.as_str() {
        "application/x-protobuf" | "application/protobuf" => Ok(Encoding::Protobuf),
        "application/json" => Ok(Encoding::Json),
        "" => Err(Refusal::Unsupported(
            "no Content-Type; OTLP/HTTP sends application/x-protobuf or application/json".into(),
        )),
        other => Err(Refusal::Unsupported(format!(
            "Content-Type `{other}` is not OTLP/HTTP; send application/x-protobuf or application/json"
        ))),
    }
}

/// The body with its `Content-Encoding` undone; a gzip body may decompress to at most
/// `max_decoded` bytes (a small body can expand a thousandfold).
pub fn decompress(
    content_encoding: Option<&str>,
    body: &[u8],
    max_decoded: usize,
) -> Result<Vec<u8>, Refusal> {
    match content_encoding
        .map(|e| e.trim().to_ascii_lowercase())
        .as_deref()
    {
        None | Some("") | Some("identity") => Ok(body.to_vec()),
        Some("gzip") => {
            let mut out = Vec::with_capacity(body.len().saturating_mul(4).min(max_decoded));
            let read = flate2::read::GzDecoder::new(body)
                .take(max_decoded as u64 + 1)
                .read_to_end(&mut out)
                .map_err(|e| {
                    Refusal::Malformed(format!("the gzip body does not decompress: {e}"))
                })?;
            if read > max_decoded {
                return Err(Refusal::TooLarge(format!(
                    "the gzip body decompresses to more than {max_decoded} bytes"
                )));
            }
            Ok(out)
        }
        Some(other) => Err(Refusal::Unsupported(format!(
            "Content-Encoding `{other}` is not supported; send gzip or no encoding"
        ))),
    }
}

/// The request as an OTLP/JSON document.
pub fn decode(encoding: Encoding, body: &[u8]) -> Result<Value, Refusal> {
    match encoding {
        Encoding::Protobuf => {
            let request = proto::ExportTraceServiceRequest::decode(body).map_err(|e| {
                Refusal::Malformed(format!(
                    "the body is not a protobuf ExportTraceServiceRequest: {e}"
                ))
            })?;
            Ok(proto::request_to_json(&request))
        }
        Encoding::Json => serde_json::from_slice(body).map_err(|e| {
            Refusal::Malformed(format!(
                "the body is not JSON: {e} (an OTLP/JSON ExportTraceServiceRequest is expected)"
            ))
        }),
    }
}

/// One received span as the inbox keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct SpanRow {
    /// As the importer normalises it (hex lowercased).
    pub trace_id: String,
    pub span_id: String,
    /// A span without a parent: the trace's root.
    pub is_root: bool,
    /// The OTLP/JSON `resource` and `scope` objects the span came under, and the span itself.
    pub resource: String,
    pub scope: String,
    pub span: String,
}

/// The spans of one request: those accepted, and how many were rejected and why (OTLP's
/// partial success).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Intake {
    pub rows: Vec<SpanRow>,
    pub rejected: usize,
    /// The first rejected span's reason, with its JSON path.
    pub first_error: Option<String>,
}

/// Splits a request document into spans. A document whose structure is not an
/// `ExportTraceServiceRequest` is refused whole; a span the importer would refuse is rejected
/// alone, the others kept. The importer reads the whole document once; only when it refuses
/// something is each span read alone, to tell the good ones from the bad.
pub fn split(doc: &Value) -> Result<Intake, Refusal> {
    let malformed = |path: &str, what: &str| Refusal::Malformed(format!("`{path}`: {what}"));
    let root = doc
        .as_object()
        .ok_or_else(|| malformed("document", "expected a JSON object with `resourceSpans`"))?;
    let mut intake = Intake::default();
    let Some(resource_spans) = root.get("resourceSpans") else {
        return Err(malformed("resourceSpans", "missing"));
    };
    let resource_spans = match resource_spans {
        Value::Null => return Ok(intake),
        Value::Array(list) => list,
        _ => return Err(malformed("resourceSpans", "expected an array")),
    };
    // Every span in document order, and the resources and scopes it came under with their
    // JSON text (the inbox keeps that text with each span).
    let mut found: Vec<Found> = Vec::new();
    let mut resources: Vec<(&Value, String)> = Vec::new();
    let mut scopes: Vec<(&Value, String)> = Vec::new();
    let empty = json!({});
    for (r, rs) in resource_spans.iter().enumerate() {
        let rpath = format!("resourceSpans[{r}]");
        let rs = rs
            .as_object()
            .ok_or_else(|| malformed(&rpath, "expected an object"))?;
        let resource = rs.get("resource").unwrap_or(&empty);
        resources.push((resource, resource.to_string()));
        // `instrumentationLibrarySpans` is the pre-1.0 name of `scopeSpans`, as the importer
        // reads it.
        let (key, scope_key) = if rs.contains_key("scopeSpans") {
            ("scopeSpans", "scope")
        } else {
            ("instrumentationLibrarySpans", "instrumentationLibrary")
        };
        let scope_spans = match rs.get(key) {
            None | Some(Value::Null) => continue,
            Some(Value::Array(list)) => list,
            Some(_) => return Err(malformed(&format!("{rpath}.{key}"), "expected an array")),
        };
        for (s, ss) in scope_spans.iter().enumerate() {
            let spath = format!("{rpath}.{key}[{s}]");
            let ss = ss
                .as_object()
                .ok_or_else(|| malformed(&spath, "expected an object"))?;
            let scope = ss.get(scope_key).unwrap_or(&empty);
            scopes.push((scope, scope.to_string()));
            let spans = match ss.get("spans") {
                None | Some(Value::Null) => continue,
                Some(Value::Array(list)) => list,
                Some(_) => return Err(malformed(&format!("{spath}.spans"), "expected an array")),
            };
            for (k, span) in spans.iter().enumerate() {
                found.push(Found {
                    span,
                    path: format!("{spath}.spans[{k}]"),
                    resource: resources.len() - 1,
                    scope: scopes.len() - 1,
                });
            }
        }
    }
    let whole = traces::import::read_text("request", &doc.to_string(), traces::Format::Otlp)
        .ok()
        .map(|(_, batch)| batch.spans)
        .filter(|spans| spans.len() == found.len());
    for (i, f) in found.iter().enumerate() {
        let ((resource, resource_text), (scope, scope_text)) =
            (&resources[f.resource], &scopes[f.scope]);
        let read = match &whole {
            Some(spans) => {
                let s = &spans[i].span;
                Ok((
                    s.trace_id.clone(),
                    s.span_id.clone(),
                    s.parent_span_id.is_none(),
                ))
            }
            None => check_span(resource, scope, f.span),
        };
        match read {
            Ok((trace_id, span_id, is_root)) => intake.rows.push(SpanRow {
                trace_id,
                span_id,
                is_root,
                resource: resource_text.clone(),
                scope: scope_text.clone(),
                span: f.span.to_string(),
            }),
            Err(reason) => {
                intake.rejected += 1;
                if intake.first_error.is_none() {
                    intake.first_error = Some(format!("{}: {reason}", f.path));
                }
            }
        }
    }
    Ok(intake)
}

/// A span of a request, where it is, and which resource and scope it came under.
struct Found<'a> {
    span: &'a Value,
    path: String,
    resource: usize,
    scope: usize,
}

/// Reads one span through the store's OTLP importer: its normalised ids and whether it is a
/// root, or the importer's reason for refusing it.
fn check_span(
    resource: &Value,
    scope: &Value,
    span: &Value,
) -> Result<(String, String, bool), String> {
    let doc = json!({"resourceSpans": [{"resource": resource, "scopeSpans": [{"scope": scope, "spans": [span]}]}]});
    let (_, batch) = traces::import::read_text("span", &doc.to_string(), traces::Format::Otlp)
        .map_err(|e| match e {
            traces::Error::Malformed { at, reason, .. } => {
                let at = at
                    .strip_prefix("resourceSpans[0].scopeSpans[0].spans[0]")
                    .map(|rest| rest.trim_start_matches('.'))
                    .unwrap_or(&at)
                    .to_string();
                if at.is_empty() {
                    reason
                } else {
                    format!("{at}: {reason}")
                }
            }
            other => other.to_string(),
        })?;
    let located = batch
        .spans
        .into_iter()
        .next()
        .ok_or_else(|| "no span read".to_string())?;
    let span = located.span;
    Ok((span.trace_id, span.span_id, span.parent_span_id.is_none()))
}

/// The OTLP/JSON document of a trace's received spans, in arrival order, grouped under their
/// resource and scope as they came.
pub fn assemble<'a>(rows: impl IntoIterator<Item = (&'a str, &'a str, &'a str)>) -> String {
    // (resource, [(scope, [span])]) in first-seen order.
    type Scopes<'s> = Vec<(&'s str, Vec<&'s str>)>;
    let mut groups: Vec<(&str, Scopes)> = Vec::new();
    for (resource, scope, span) in rows {
        let r = match groups.iter().position(|g| g.0 == resource) {
            Some(i) => i,
            None => {
                groups.push((resource, Vec::new()));
                groups.len() - 1
            }
        };
        let scopes = &mut groups[r].1;
        let s = match scopes.iter().position(|g| g.0 == scope) {
            Some(i) => i,
            None => {
                scopes.push((scope, Vec::new()));
                scopes.len() - 1
            }
        };
        scopes[s].1.push(span);
    }
    let mut out = String::from("{\"resourceSpans\":[");
    for (i, (resource, scopes)) in groups.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str("{\"resource\":");
        out.push_str(resource);
        out.push_str(",\"scopeSpans\":[");
        for (j, (scope, spans)) in scopes.iter().enumerate() {
            if j > 0 {
                out.push(',');
            }
            out.push_str("{\"scope\":");
            out.push_str(scope);
            out.push_str(",\"spans\":[");
            out.push_str(&spans.join(","));
            out.push_str("]}");
        }
        out.push_str("]}");
    }
    out.push_str("]}");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(trace: &str, id: &str, parent: Option<&str>) -> Value {
        let mut s = json!({"traceId": trace, "spanId": id, "name": "work",
            "startTimeUnixNano": "1", "endTimeUnixNano": "2"});
        if let Some(p) = parent {
            s["parentSpanId"] = json!(p);
        }
        s
    }

    #[test]
    fn a_bad_span_is_rejected_alone_and_named() {
        let t = "0af7651916cd43dd8448eb211c80319c";
        let doc = json!({"resourceSpans": [{"resource": {"attributes": []}, "scopeSpans": [{"scope": {"name": "s"}, "spans": [
            span(t, "b7ad6b7169203331", None),
            span("xyz", "b7ad6b7169203332", None),
            span(t, "b7ad6b7169203333", Some("b7ad6b7169203331")),
        ]}]}]});
        let intake = split(&doc).unwrap();
        assert_eq!(intake.rows.len(), 2);
        assert!(intake.rows[0].is_root && !intake.rows[1].is_root);
        assert_eq!(intake.rejected, 1);
        let error = intake.first_error.unwrap();
        assert!(
            error.starts_with("resourceSpans[0].scopeSpans[0].spans[1]: traceId"),
            "{error}"
        );
    }

    #[test]
    fn pre_1_0_documents_are_read_as_the_importer_reads_them() {
        let t = "0af7651916cd43dd8448eb211c80319c";
        let doc = json!({"resourceSpans": [{"instrumentationLibrarySpans": [{"instrumentationLibrary": {"name": "old"},
            "spans": [span(t, "b7ad6b7169203331", None)]}]}]});
        let intake = split(&doc).unwrap();
        assert_eq!((intake.rows.len(), intake.rejected), (1, 0));
        assert_eq!(intake.rows[0].scope, "{\"name\":\"old\"}");
    }

    #[test]
    fn a_document_that_is_not_a_request_is_refused_whole() {
        assert!(matches!(split(&json!([1])), Err(Refusal::Malformed(_))));
        assert!(matches!(
            split(&json!({"resourceSpans": 3})),
            Err(Refusal::Malformed(_))
        ));
        assert!(matches!(split(&json!({})), Err(Refusal::Malformed(_))));
    }

    #[test]
    fn assembled_spans_import_as_one_trace() {
        let t = "0af7651916cd43dd8448eb211c80319c";
        let doc = json!({"resourceSpans": [{"resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "svc"}}]}, "scopeSpans": [{"scope": {"name": "s"}, "spans": [
            span(t, "b7ad6b7169203331", None), span(t, "b7ad6b7169203333", Some("b7ad6b7169203331"))]}]}]});
        let intake = split(&doc).unwrap();
        let text = assemble(
            intake
                .rows
                .iter()
                .map(|r| (r.resource.as_str(), r.scope.as_str(), r.span.as_str())),
        );
        let mut store = traces::Store::open_in_memory().unwrap();
        let report = store
            .import_text(&text, traces::Format::Otlp, "inbox", false)
            .unwrap();
        assert_eq!(report.trace_ids, vec![t.to_string()]);
        assert_eq!(report.spans, 2);
        // The trace grows and is stored again in its place.
        let again = store
            .import_text(&text, traces::Format::Otlp, "inbox", true)
            .unwrap();
        assert_eq!(again.spans, 2);
        assert!(store
            .import_text(&text, traces::Format::Otlp, "inbox", false)
            .is_err());
    }

    #[test]
    fn gzip_bombs_and_unknown_encodings_are_refused() {
        use std::io::Write;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        gz.write_all(&vec![b' '; 1 << 20]).unwrap();
        let body = gz.finish().unwrap();
        assert!(matches!(
            decompress(Some("gzip"), &body, 1000),
            Err(Refusal::TooLarge(_))
        ));
        assert_eq!(
            decompress(Some("gzip"), &body, 1 << 20).unwrap().len(),
            1 << 20
        );
        assert!(matches!(
            decompress(Some("br"), b"x", 10),
            Err(Refusal::Unsupported(_))
        ));
        assert!(matches!(
            decompress(Some("gzip"), b"not gzip", 10),
            Err(Refusal::Malformed(_))
        ));
        assert!(matches!(
            encoding(Some("text/plain")),
            Err(Refusal::Unsupported(_))
        ));
        assert_eq!(
            encoding(Some("application/json; charset=utf-8")).unwrap(),
            Encoding::Json
        );
    }
}
