//! OTLP's protobuf messages for traces (`opentelemetry/proto/collector/trace/v1`), written out
//! with `prost`'s derive so no code generator runs at build time, and their translation into
//! OTLP/JSON: the one encoding the trace store's importer reads, so a protobuf request and a
//! JSON request of the same spans are stored through the same code.
//!
//! Field numbers are the protocol's; fields the importer has no use for (dropped counts,
//! entity refs) are left out, which protobuf decoding skips.

use prost::Message;
use serde_json::{json, Map, Value};

#[derive(Clone, PartialEq, Message)]
pub struct ExportTraceServiceRequest {
    #[prost(message, repeated, tag = "1")]
    pub resource_spans: Vec<ResourceSpans>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ExportTraceServiceResponse {
    #[prost(message, optional, tag = "1")]
    pub partial_success: Option<ExportTracePartialSuccess>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ExportTracePartialSuccess {
    #[prost(int64, tag = "1")]
    pub rejected_spans: i64,
    #[prost(string, tag = "2")]
    pub error_message: String,
}

/// `google.rpc.Status`: the body of an OTLP/HTTP error response.
#[derive(Clone, PartialEq, Message)]
pub struct RpcStatus {
    #[prost(int32, tag = "1")]
    pub code: i32,
    #[prost(string, tag = "2")]
    pub message: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct ResourceSpans {
    #[prost(message, optional, tag = "1")]
    pub resource: Option<Resource>,
    #[prost(message, repeated, tag = "2")]
    pub scope_spans: Vec<ScopeSpans>,
    #[prost(string, tag = "3")]
    pub schema_url: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct Resource {
    #[prost(message, repeated, tag = "1")]
    pub attributes: Vec<KeyValue>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ScopeSpans {
    #[prost(message, optional, tag = "1")]
    pub scope: Option<InstrumentationScope>,
    #[prost(message, repeated, tag = "2")]
    pub spans: Vec<Span>,
    #[prost(string, tag = "3")]
    pub schema_url: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct InstrumentationScope {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub version: String,
    #[prost(message, repeated, tag = "3")]
    pub attributes: Vec<KeyValue>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Span {
    #[prost(bytes = "vec", tag = "1")]
    pub trace_id: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub span_id: Vec<u8>,
    #[prost(string, tag = "3")]
    pub trace_state: String,
    #[prost(bytes = "vec", tag = "4")]
    pub parent_span_id: Vec<u8>,
    #[prost(fixed32, tag = "16")]
    pub flags: u32,
    #[prost(string, tag = "5")]
    pub name: String,
    #[prost(int32, tag = "6")]
    pub kind: i32,
    #[prost(fixed64, tag = "7")]
    pub start_time_unix_nano: u64,
    #[prost(fixed64, tag = "8")]
    pub end_time_unix_nano: u64,
    #[prost(message, repeated, tag = "9")]
    pub attributes: Vec<KeyValue>,
    #[prost(message, repeated, tag = "11")]
    pub events: Vec<Event>,
    #[prost(message, repeated, tag = "13")]
    pub links: Vec<Link>,
    #[prost(message, optional, tag = "15")]
    pub status: Option<Status>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Event {
    #[prost(fixed64, tag = "1")]
    pub time_unix_nano: u64,
    #[prost(string, tag = "2")]
    pub name: String,
    #[prost(message, repeated, tag = "3")]
    pub attributes: Vec<KeyValue>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Link {
    #[prost(bytes = "vec", tag = "1")]
    pub trace_id: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub span_id: Vec<u8>,
    #[prost(string, tag = "3")]
    pub trace_state: String,
    #[prost(message, repeated, tag = "4")]
    pub attributes: Vec<KeyValue>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Status {
    #[prost(string, tag = "2")]
    pub message: String,
    #[prost(int32, tag = "3")]
    pub code: i32,
}

#[derive(Clone, PartialEq, Message)]
pub struct KeyValue {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<AnyValue>,
}

#[derive(Clone, PartialEq, Message)]
pub struct AnyValue {
    #[prost(oneof = "any_value::Value", tags = "1, 2, 3, 4, 5, 6, 7")]
    pub value: Option<any_value::Value>,
}

pub mod any_value {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Value {
        #[prost(string, tag = "1")]
        StringValue(String),
        #[prost(bool, tag = "2")]
        BoolValue(bool),
        #[prost(int64, tag = "3")]
        IntValue(i64),
        #[prost(double, tag = "4")]
        DoubleValue(f64),
        #[prost(message, tag = "5")]
        ArrayValue(super::ArrayValue),
        #[prost(message, tag = "6")]
        KvlistValue(super::KeyValueList),
        #[prost(bytes = "vec", tag = "7")]
        BytesValue(Vec<u8>),
    }
}

#[derive(Clone, PartialEq, Message)]
pub struct ArrayValue {
    #[prost(message, repeated, tag = "1")]
    pub values: Vec<AnyValue>,
}

#[derive(Clone, PartialEq, Message)]
pub struct KeyValueList {
    #[prost(message, repeated, tag = "1")]
    pub values: Vec<KeyValue>,
}

/// The request as the OTLP/JSON document the same spans would have been sent as: ids in hex,
/// 64-bit integers as decimal strings, enums as integers, bytes in base64.
pub fn request_to_json(request: &ExportTraceServiceRequest) -> Value {
    let resource_spans: Vec<Value> = request
        .resource_spans
        .iter()
        .map(|rs| {
            let mut out = Map::new();
            if let Some(resource) = &rs.resource {
                out.insert(
                    "resource".into(),
                    json!({ "attributes": key_values(&resource.attributes) }),
                );
            }
            let scope_spans: Vec<Value> = rs
                .scope_spans
                .iter()
                .map(|ss| {
                    let mut scope = Map::new();
                    if let Some(s) = &ss.scope {
                        scope.insert(
                            "scope".into(),
                            json!({
                                "name": s.name,
                                "version": s.version,
                                "attributes": key_values(&s.attributes),
                            }),
                        );
                    }
                    scope.insert(
                        "spans".into(),
                        Value::Array(ss.spans.iter().map(span_to_json).collect()),
                    );
                    Value::Object(scope)
                })
                .collect();
            out.insert("scopeSpans".into(), Value::Array(scope_spans));
            Value::Object(out)
        })
        .collect();
    json!({ "resourceSpans": resource_spans })
}

fn span_to_json(span: &Span) -> Value {
    let mut out = Map::new();
    out.insert("traceId".into(), Value::String(hex(&span.trace_id)));
    out.insert("spanId".into(), Value::String(hex(&span.span_id)));
    if !span.parent_span_id.is_empty() {
        out.insert(
            "parentSpanId".into(),
            Value::String(hex(&span.parent_span_id)),
        );
    }
    if !span.trace_state.is_empty() {
        out.insert("traceState".into(), Value::String(span.trace_state.clone()));
    }
    out.insert("name".into(), Value::String(span.name.clone()));
    out.insert("kind".into(), Value::from(span.kind));
    out.insert(
        "startTimeUnixNano".into(),
        Value::String(span.start_time_unix_nano.to_string()),
    );
    out.insert(
        "endTimeUnixNano".into(),
        Value::String(span.end_time_unix_nano.to_string()),
    );
    out.insert("attributes".into(), key_values(&span.attributes));
    if !span.events.is_empty() {
        let events = span
            .events
            .iter()
            .map(|e| {
                json!({
                    "timeUnixNano": e.time_unix_nano.to_string(),
                    "name": e.name,
                    "attributes": key_values(&e.attributes),
                })
            })
            .collect();
        out.insert("events".into(), Value::Array(events));
    }
    if !span.links.is_empty() {
        let links = span
            .links
            .iter()
            .map(|l| {
                json!({
                    "traceId": hex(&l.trace_id),
                    "spanId": hex(&l.span_id),
                    "attributes": key_values(&l.attributes),
                })
            })
            .collect();
        out.insert("links".into(), Value::Array(links));
    }
    if let Some(status) = &span.status {
        out.insert(
            "status".into(),
            json!({ "code": status.code, "message": status.message }),
        );
    }
    Value::Object(out)
}

fn key_values(list: &[KeyValue]) -> Value {
    Value::Array(
        list.iter()
            .map(|kv| {
                let mut out = Map::new();
                out.insert("key".into(), Value::String(kv.key.clone()));
                if let Some(v) = &kv.value {
                    out.insert("value".into(), any_value(v));
                }
                Value::Object(out)
            })
            .collect(),
    )
}

fn any_value(value: &AnyValue) -> Value {
    use any_value::Value as V;
    match &value.value {
        None => json!({}),
        Some(V::StringValue(s)) => json!({ "stringValue": s }),
        Some(V::BoolValue(b)) => json!({ "boolValue": b }),
        Some(V::IntValue(i)) => json!({ "intValue": i.to_string() }),
        Some(V::DoubleValue(d)) => match serde_json::Number::from_f64(*d) {
            Some(n) => json!({ "doubleValue": n }),
            None if d.is_nan() => json!({ "doubleValue": "NaN" }),
            None if *d > 0.0 => json!({ "doubleValue": "Infinity" }),
            None => json!({ "doubleValue": "-Infinity" }),
        },
        Some(V::ArrayValue(a)) => {
            json!({ "arrayValue": { "values": a.values.iter().map(any_value).collect::<Vec<_>>() } })
        }
        Some(V::KvlistValue(kv)) => json!({ "kvlistValue": { "values": key_values(&kv.values) } }),
        Some(V::BytesValue(b)) => json!({ "bytesValue": base64(b) }),
    }
}

/// Lowercase hex, as OTLP/JSON writes trace and span ids.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[usize::from(b >> 4)] as char);
        out.push(DIGITS[usize::from(b & 15)] as char);
    }
    out
}

/// Standard base64 with padding (RFC 4648), as protobuf's JSON mapping writes bytes.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = (u32::from(chunk[0]) << 16)
            | (u32::from(*chunk.get(1).unwrap_or(&0)) << 8)
            | u32::from(*chunk.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_and_hex_match_their_rfcs() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
        assert_eq!(hex(&[0x0a, 0xff]), "0aff");
    }

    #[test]
    fn a_decoded_request_reads_as_the_json_the_importer_takes() {
        let request = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(Resource {
                    attributes: vec![KeyValue {
                        key: "service.name".into(),
                        value: Some(AnyValue {
                            value: Some(any_value::Value::StringValue("svc".into())),
                        }),
                    }],
                }),
                scope_spans: vec![ScopeSpans {
                    scope: None,
                    spans: vec![Span {
                        trace_id: vec![1; 16],
                        span_id: vec![2; 8],
                        name: "invoke_agent".into(),
                        start_time_unix_nano: 5,
                        end_time_unix_nano: 9,
                        attributes: vec![KeyValue {
                            key: "n".into(),
                            value: Some(AnyValue {
                                value: Some(any_value::Value::IntValue(-3)),
                            }),
                        }],
                        status: Some(Status {
                            message: "boom".into(),
                            code: 2,
                        }),
                        ..Span::default()
                    }],
                    schema_url: String::new(),
                }],
                schema_url: String::new(),
            }],
        };
        // Through the wire and back, then into JSON.
        let bytes = request.encode_to_vec();
        let decoded = ExportTraceServiceRequest::decode(bytes.as_slice()).unwrap();
        let doc = request_to_json(&decoded);
        let span = &doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0];
        assert_eq!(span["traceId"], "01010101010101010101010101010101");
        assert_eq!(span["spanId"], "0202020202020202");
        assert!(span.get("parentSpanId").is_none());
        assert_eq!(span["startTimeUnixNano"], "5");
        assert_eq!(span["attributes"][0]["value"]["intValue"], "-3");
        assert_eq!(span["status"]["code"], 2);
        let (_, batch) = traces::import::read_text("req", &doc.to_string(), traces::Format::Otlp)
            .expect("the importer reads the translation");
        assert_eq!(batch.spans.len(), 1);
        assert_eq!(batch.spans[0].span.status_message.as_deref(), Some("boom"));
    }
}
