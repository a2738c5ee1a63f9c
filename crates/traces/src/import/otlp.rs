//! OTLP/JSON (`ExportTraceServiceRequest`): `resourceSpans → scopeSpans → spans`, hex ids,
//! 64-bit integers as strings, attribute values as `AnyValue` unions. One document per file, or
//! one per line (the collector's file exporter). Errors name the JSON path of the bad field.

use serde_json::{Map, Value};

use super::{check_id, describe_json_error, nanos, parent_id, Batch, Located, TraceMeta};
use crate::conventions::{fill_from_attributes, kind_from_attributes};
use crate::error::{Error, Result};
use crate::span::{Span, SpanKind};

pub(super) fn parse(source: &str, text: &str) -> Result<Batch> {
    let mut batch = Batch::default();
    let mut stream = serde_json::Deserializer::from_str(text).into_iter::<Value>();
    let mut start = 0usize;
    loop {
        let doc = match stream.next() {
            None => break,
            Some(Ok(doc)) => doc,
            Some(Err(err)) => {
                let (at, message) = describe_json_error(&err);
                return Err(Error::malformed(source, at, message));
            }
        };
        // The line the document starts on, for paths in multi-document files.
        let first_non_ws = start + (text[start..].len() - text[start..].trim_start().len());
        let line = text[..first_non_ws].matches('\n').count() + 1;
        start = stream.byte_offset();
        let prefix = if line > 1 {
            format!("line {line}: ")
        } else {
            String::new()
        };
        read_request(&doc, &prefix, &mut batch)
            .map_err(|(path, reason)| Error::malformed(source, path, reason))?;
    }
    Ok(batch)
}

type PathError = (String, String);

fn read_request(
    doc: &Value,
    prefix: &str,
    batch: &mut Batch,
) -> std::result::Result<(), PathError> {
    let root = doc.as_object().ok_or_else(|| {
        (
            format!("{prefix}document"),
            "expected a JSON object with `resourceSpans`".to_string(),
        )
    })?;
    let resource_spans = array(root, "resourceSpans", &format!("{prefix}resourceSpans"))?;
    for (r, resource_span) in resource_spans.iter().enumerate() {
        let rpath = format!("{prefix}resourceSpans[{r}]");
        let rs = object(resource_span, &rpath)?;
        let resource_attrs = match rs.get("resource") {
            Some(res) => {
                let res = object(res, &format!("{rpath}.resource"))?;
                key_values(
                    res.get("attributes"),
                    &format!("{rpath}.resource.attributes"),
                )?
            }
            None => Map::new(),
        };
        // `instrumentationLibrarySpans` is the pre-1.0 name of `scopeSpans`.
        let scope_key = if rs.contains_key("scopeSpans") {
            "scopeSpans"
        } else {
            "instrumentationLibrarySpans"
        };
        let scope_spans = array(rs, scope_key, &format!("{rpath}.{scope_key}"))?;
        for (s, scope_span) in scope_spans.iter().enumerate() {
            let spath = format!("{rpath}.{scope_key}[{s}]");
            let ss = object(scope_span, &spath)?;
            let spans = array(ss, "spans", &format!("{spath}.spans"))?;
            for (k, raw) in spans.iter().enumerate() {
                let path = format!("{spath}.spans[{k}]");
                let span = read_span(raw, &path)?;
                batch
                    .meta
                    .entry(span.trace_id.clone())
                    .or_insert_with(|| TraceMeta {
                        framework: resource_attrs
                            .get("service.name")
                            .and_then(Value::as_str)
                            .map(str::to_string),
                        attributes: resource_attrs.clone(),
                        task: None,
                    });
                batch.spans.push(Located::new(span, path));
            }
        }
    }
    Ok(())
}

fn read_span(raw: &Value, path: &str) -> std::result::Result<Span, PathError> {
    let obj = object(raw, path)?;
    let field = |name: &str| format!("{path}.{name}");
    let id = |name: &str, hex_len: usize| -> std::result::Result<String, PathError> {
        let value = obj
            .get(name)
            .and_then(Value::as_str)
            .ok_or_else(|| (field(name), "missing or not a string".to_string()))?;
        hex_id(value, hex_len).map_err(|reason| (field(name), reason))
    };
    let trace_id = id("traceId", 32)?;
    let span_id = id("spanId", 16)?;
    let parent = match obj.get("parentSpanId") {
        None | Some(Value::Null) => None,
        Some(Value::String(p)) if p.is_empty() => None,
        Some(Value::String(p)) => {
            hex_id(p, 16).map_err(|r| (field("parentSpanId"), r))?;
            parent_id(Some(p)).map_err(|r| (field("parentSpanId"), r))?
        }
        Some(other) => {
            return Err((
                field("parentSpanId"),
                format!("expected a hex string, got {other}"),
            ))
        }
    };
    let name = obj
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| (field("name"), "missing or not a string".to_string()))?;
    let attributes = key_values(obj.get("attributes"), &field("attributes"))?;
    let kind = kind_from_attributes(&attributes).unwrap_or(SpanKind::Other);
    let mut span = Span::new(trace_id, span_id, name, kind);
    span.parent_span_id = parent;
    span.start_time_ns = nanos(
        obj.get("startTimeUnixNano").unwrap_or(&Value::Null),
        "startTimeUnixNano",
    )
    .map_err(|r| (field("startTimeUnixNano"), r))?;
    span.end_time_ns = nanos(
        obj.get("endTimeUnixNano").unwrap_or(&Value::Null),
        "endTimeUnixNano",
    )
    .map_err(|r| (field("endTimeUnixNano"), r))?;
    if let Some(status) = obj.get("status") {
        let status = object(status, &field("status"))?;
        span.status = super::jsonl::status_code(status.get("code").unwrap_or(&Value::Null))
            .map_err(|r| (field("status.code"), r))?;
        span.status_message = status
            .get("message")
            .and_then(Value::as_str)
            .filter(|m| !m.is_empty())
            .map(str::to_string);
    }
    if let Some(events) = obj.get("events") {
        let events = events
            .as_array()
            .ok_or_else(|| (field("events"), "expected an array".to_string()))?;
        for (e, event) in events.iter().enumerate() {
            let epath = format!("{path}.events[{e}]");
            let ev = object(event, &epath)?;
            let time = nanos(
                ev.get("timeUnixNano").unwrap_or(&Value::Null),
                "timeUnixNano",
            )
            .map_err(|r| (format!("{epath}.timeUnixNano"), r))?;
            let attrs = key_values(ev.get("attributes"), &format!("{epath}.attributes"))?;
            span.events.push(serde_json::json!({
                "name": ev.get("name").and_then(Value::as_str).unwrap_or(""),
                "time_unix_nano": time,
                "attributes": attrs,
            }));
        }
    }
    span.attributes = attributes;
    fill_from_attributes(&mut span);
    Ok(span)
}

/// OTLP/JSON ids are lowercase or uppercase hex of a fixed length (not base64, unlike
/// protobuf-JSON of other APIs).
fn hex_id(value: &str, len: usize) -> std::result::Result<String, String> {
    if value.len() != len || !value.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!(
            "expected {len} hex digits (OTLP/JSON encodes ids as hex, not base64), got {:?}",
            crate::redact::prefix_at_boundary(value, 80)
        ));
    }
    check_id(value, "id")
}

/// `[{key, value: AnyValue}]` as a JSON object. A repeated key keeps its last value.
fn key_values(
    raw: Option<&Value>,
    path: &str,
) -> std::result::Result<Map<String, Value>, PathError> {
    let mut out = Map::new();
    let Some(raw) = raw else { return Ok(out) };
    if raw.is_null() {
        return Ok(out);
    }
    let list = raw.as_array().ok_or_else(|| {
        (
            path.to_string(),
            "expected an array of {key, value}".to_string(),
        )
    })?;
    for (i, kv) in list.iter().enumerate() {
        let kpath = format!("{path}[{i}]");
        let kv = object(kv, &kpath)?;
        let key = kv.get("key").and_then(Value::as_str).ok_or_else(|| {
            (
                format!("{kpath}.key"),
                "missing or not a string".to_string(),
            )
        })?;
        let value = match kv.get("value") {
            None | Some(Value::Null) => Value::Null,
            Some(v) => any_value(v, &format!("{kpath}.value"))?,
        };
        out.insert(key.to_string(), value);
    }
    Ok(out)
}

/// An `AnyValue` union (`stringValue`, `boolValue`, `intValue`, `doubleValue`, `arrayValue`,
/// `kvlistValue`, `bytesValue`) as plain JSON. Recursion is bounded by serde_json's depth limit.
fn any_value(raw: &Value, path: &str) -> std::result::Result<Value, PathError> {
    let obj = object(raw, path)?;
    if obj.len() > 1 {
        let keys: Vec<&String> = obj.keys().collect();
        return Err((
            path.to_string(),
            format!("an AnyValue holds exactly one of its fields, found {keys:?}"),
        ));
    }
    let Some((tag, value)) = obj.iter().next() else {
        return Ok(Value::Null);
    };
    let bad = |expected: &str| {
        (
            format!("{path}.{tag}"),
            format!("expected {expected}, got {value}"),
        )
    };
    Ok(match tag.as_str() {
        "stringValue" => Value::String(value.as_str().ok_or_else(|| bad("a string"))?.to_string()),
        "boolValue" => Value::Bool(value.as_bool().ok_or_else(|| bad("a boolean"))?),
        "intValue" => {
            let n = match value {
                Value::Number(n) => n.as_i64(),
                Value::String(s) => s.parse::<i64>().ok(),
                _ => None,
            };
            Value::from(n.ok_or_else(|| bad("a 64-bit integer (number or decimal string)"))?)
        }
        "doubleValue" => match value {
            Value::Number(_) => value.clone(),
            // Non-finite doubles have no JSON number; keep their spelling.
            Value::String(s) if matches!(s.as_str(), "NaN" | "Infinity" | "-Infinity") => {
                value.clone()
            }
            Value::String(s) => s
                .parse::<f64>()
                .ok()
                .and_then(serde_json::Number::from_f64)
                .map(Value::Number)
                .ok_or_else(|| bad("a number"))?,
            _ => return Err(bad("a number")),
        },
        "bytesValue" => Value::String(
            value
                .as_str()
                .ok_or_else(|| bad("a base64 string"))?
                .to_string(),
        ),
        "arrayValue" => {
            let values = value
                .get("values")
                .and_then(Value::as_array)
                .map(Vec::as_slice)
                .unwrap_or(&[]);
            let mut out = Vec::with_capacity(values.len());
            for (i, v) in values.iter().enumerate() {
                out.push(any_value(v, &format!("{path}.arrayValue.values[{i}]"))?);
            }
            Value::Array(out)
        }
        "kvlistValue" => Value::Object(key_values(
            value.get("values"),
            &format!("{path}.kvlistValue.values"),
        )?),
        other => {
            return Err((
                format!("{path}.{other}"),
                "unknown AnyValue field".to_string(),
            ))
        }
    })
}

fn object<'a>(
    value: &'a Value,
    path: &str,
) -> std::result::Result<&'a Map<String, Value>, PathError> {
    value.as_object().ok_or_else(|| {
        (
            path.to_string(),
            format!("expected an object, got {}", kind_name(value)),
        )
    })
}

fn array<'a>(
    obj: &'a Map<String, Value>,
    key: &str,
    path: &str,
) -> std::result::Result<&'a [Value], PathError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(&[]),
        Some(Value::Array(items)) => Ok(items),
        Some(other) => Err((
            path.to_string(),
            format!("expected an array, got {}", kind_name(other)),
        )),
    }
}

fn kind_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn any_values_flatten_to_json() {
        let v = any_value(&json!({"kvlistValue": {"values": [
            {"key": "a", "value": {"intValue": "7"}},
            {"key": "b", "value": {"arrayValue": {"values": [{"boolValue": true}, {"doubleValue": 1.5}]}}}
        ]}}), "x").unwrap();
        assert_eq!(v, json!({"a": 7, "b": [true, 1.5]}));
        let err = any_value(&json!({"stringValue": "a", "intValue": 1}), "p").unwrap_err();
        assert!(err.1.contains("exactly one"));
    }

    #[test]
    fn bad_ids_name_their_path() {
        let doc = json!({"resourceSpans": [{"scopeSpans": [{"spans": [
            {"traceId": "AAECAwQFBgcICQoLDA0ODw==", "spanId": "0000000000000001", "name": "x"}]}]}]});
        let err = parse("f.json", &doc.to_string()).unwrap_err().to_string();
        assert!(
            err.contains("resourceSpans[0].scopeSpans[0].spans[0].traceId"),
            "{err}"
        );
        assert!(err.contains("not base64"), "{err}");
    }

    #[test]
    fn multi_document_files_prefix_the_line() {
        let good = json!({"resourceSpans": []}).to_string();
        let bad = json!({"resourceSpans": [{"scopeSpans": 3}]}).to_string();
        let err = parse("f.json", &format!("{good}\n{bad}\n"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("line 2: resourceSpans[0].scopeSpans"), "{err}");
    }
}
