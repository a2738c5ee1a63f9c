//! JSON Lines of spans, one object per line: the format the project's agents write
//! (agents/CONTRACT.md, "Traces: JSON Lines spans"). Blank lines are skipped.
//!
//! Each line first takes a fast path that keeps the attributes as JSON text (compacted, never
//! parsed into a map, read only for the convention keys); a line the fast path does not
//! accept (malformed, repeated attribute keys, deep nesting) is parsed again the ordinary way,
//! which gives the same span or the precise error.

use std::borrow::Cow;
use std::fmt;

use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::{check_id, describe_json_error, nanos, parent_id, Batch, Located};
use crate::conventions::{fill_from, kind_from, value_int, value_text, Attributes};
use crate::error::{Error, Result};
use crate::span::{Span, SpanKind, StatusCode};

/// Attributes nested deeper than this go to the ordinary parser, which enforces (and names)
/// the JSON nesting limit.
const FAST_PATH_MAX_NESTING: usize = 100;

/// One line as written; optional fields stay `Value` so bad types get our own message. `A` is
/// the attributes: a map, or borrowed JSON text on the fast path. Ids are borrowed from the
/// input where they hold no escapes (they are checked and copied into the span anyway).
#[derive(Deserialize)]
struct Line<'a, A> {
    #[serde(borrow)]
    trace_id: Cow<'a, str>,
    #[serde(borrow)]
    span_id: Cow<'a, str>,
    #[serde(default, borrow)]
    parent_span_id: Option<Cow<'a, str>>,
    name: String,
    #[serde(default, borrow)]
    kind: Option<Cow<'a, str>>,
    #[serde(default)]
    start_time_unix_nano: Value,
    #[serde(default)]
    end_time_unix_nano: Value,
    #[serde(default)]
    status: Option<Status>,
    #[serde(default = "Option::default")]
    attributes: Option<A>,
    #[serde(default)]
    events: Option<Vec<Value>>,
}

#[derive(Deserialize)]
struct Status {
    #[serde(default)]
    code: Value,
    #[serde(default)]
    message: Option<String>,
}

pub(super) fn parse(source: &str, text: &str) -> Result<Batch> {
    let mut batch = Batch::default();
    for (index, raw) in text.split('\n').enumerate() {
        let line_no = index + 1;
        let line = raw.strip_suffix('\r').unwrap_or(raw);
        if line.trim().is_empty() {
            continue;
        }
        let (span, raw_attributes) = match fast_span(line) {
            Some((span, text)) => (span, Some(text)),
            None => (parsed_span(source, line, line_no)?, None),
        };
        batch.spans.push(Located {
            span,
            origin: format!("line {line_no}"),
            raw_attributes,
        });
    }
    Ok(batch)
}

/// The spans of a JSON Lines text read leniently: a line that is no valid span (the
/// half-written last line of a run that was killed, say) is passed over instead of failing
/// the whole text. For readers that must take a run as it was left (corpus validation
/// compares such runs); imports stay strict.
pub fn spans_lenient(text: &str) -> Vec<Span> {
    text.split('\n')
        .enumerate()
        .filter_map(|(index, raw)| {
            let line = raw.strip_suffix('\r').unwrap_or(raw);
            if line.trim().is_empty() {
                return None;
            }
            parsed_span("", line, index + 1).ok()
        })
        .collect()
}

/// The ordinary path: attributes parsed into the span's map; errors name line and column.
fn parsed_span(source: &str, line: &str, line_no: usize) -> Result<Span> {
    let mut parsed: Line<'_, Map<String, Value>> = serde_json::from_str(line).map_err(|err| {
        let (_, message) = describe_json_error(&err);
        Error::malformed(
            source,
            format!("line {line_no}, column {}", err.column()),
            message,
        )
    })?;
    let attributes = parsed.attributes.take().unwrap_or_default();
    let mut span = to_span(parsed, &attributes)
        .map_err(|reason| Error::malformed(source, format!("line {line_no}"), reason))?;
    span.attributes = attributes;
    Ok(span)
}

/// The fast path: the span (its `attributes` map left empty) and its attributes as compact
/// JSON text, or `None` to take the ordinary path.
fn fast_span(line: &str) -> Option<(Span, String)> {
    let parsed: Line<'_, &RawValue> = serde_json::from_str(line).ok()?;
    let raw = parsed.attributes.map_or("{}", RawValue::get);
    let attributes = RawAttributes::parse(raw)?;
    let text = attributes
        .compact(raw.len())
        .or_else(|| compact_json(raw))?;
    let span = to_span(parsed, &attributes).ok()?;
    Some((span, text))
}

/// Everything of a line but its attributes, which `attrs` supplies to the conventions.
fn to_span<A>(line: Line<'_, A>, attrs: &impl Attributes) -> std::result::Result<Span, String> {
    let kind = match line.kind.as_deref() {
        Some(k) => k.parse::<SpanKind>()?,
        None => kind_from(attrs).unwrap_or(SpanKind::Other),
    };
    let mut span = Span::new(
        check_id(&line.trace_id, "trace_id")?,
        check_id(&line.span_id, "span_id")?,
        line.name,
        kind,
    );
    span.parent_span_id = parent_id(line.parent_span_id.as_deref())?;
    span.start_time_ns = nanos(&line.start_time_unix_nano, "start_time_unix_nano")?;
    span.end_time_ns = nanos(&line.end_time_unix_nano, "end_time_unix_nano")?;
    if let Some(status) = line.status {
        span.status = status_code(&status.code)?;
        span.status_message = status.message.filter(|m| !m.is_empty());
    }
    span.events = line.events.unwrap_or_default();
    fill_from(&mut span, attrs);
    Ok(span)
}

/// A JSON object's members as borrowed JSON text, in input order; values are parsed only
/// when a convention asks for them.
struct RawAttributes<'a>(Vec<(Cow<'a, str>, &'a RawValue)>);

impl<'a> RawAttributes<'a> {
    /// `None` unless `text` is an object whose keys are all distinct (with a repeated key
    /// the map keeps the last value, so the ordinary path must decide).
    fn parse(text: &'a str) -> Option<RawAttributes<'a>> {
        let attributes: RawAttributes<'a> = serde_json::from_str(text).ok()?;
        let mut keys: Vec<&str> = attributes.0.iter().map(|(k, _)| k.as_ref()).collect();
        keys.sort_unstable();
        if keys.windows(2).any(|w| w[0] == w[1]) {
            return None;
        }
        Some(attributes)
    }

    /// The object as compact JSON text, rebuilt from its members: keys and scalar values are
    /// copied as written (neither holds whitespace outside strings), only nested objects and
    /// arrays are scanned. `None` when a key holds escapes (its written form is not at hand;
    /// [`compact_json`] on the whole text then gives it) or a value nests too deep.
    fn compact(&self, capacity: usize) -> Option<String> {
        let mut out = String::with_capacity(capacity);
        out.push('{');
        for (i, (key, value)) in self.0.iter().enumerate() {
            let Cow::Borrowed(key) = key else {
                return None;
            };
            if i > 0 {
                out.push(',');
            }
            out.push('"');
            out.push_str(key);
            out.push_str("\":");
            let value = value.get();
            if value.starts_with(['{', '[']) {
                out.push_str(&compact_nested(value, FAST_PATH_MAX_NESTING - 1)?);
            } else {
                out.push_str(value);
            }
        }
        out.push('}');
        Some(out)
    }

    fn get(&self, key: &str) -> Option<&'a str> {
        self.0
            .iter()
            .find(|(k, _)| k.as_ref() == key)
            .map(|(_, v)| v.get())
    }
}

impl Attributes for RawAttributes<'_> {
    fn text(&self, key: &str) -> Option<String> {
        let raw = self.get(key)?;
        match raw.as_bytes().first() {
            Some(b'"') => Some(json_string(raw)?.into_owned()),
            _ => value_text(&serde_json::from_str(raw).ok()?),
        }
    }
    fn int(&self, key: &str) -> Option<i64> {
        value_int(&serde_json::from_str(self.get(key)?).ok()?)
    }
    fn string(&self, key: &str) -> Option<Cow<'_, str>> {
        let raw = self.get(key)?;
        match raw.as_bytes().first() {
            Some(b'"') => json_string(raw),
            _ => None,
        }
    }
    fn contains(&self, key: &str) -> bool {
        self.get(key).is_some()
    }
}

/// A JSON string literal's value, borrowed when it has no escapes.
fn json_string(raw: &str) -> Option<Cow<'_, str>> {
    if raw.len() >= 2 && !raw.contains('\\') {
        Some(Cow::Borrowed(&raw[1..raw.len() - 1]))
    } else {
        serde_json::from_str::<String>(raw).ok().map(Cow::Owned)
    }
}

impl<'de> Deserialize<'de> for RawAttributes<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        struct Members;
        impl<'de> Visitor<'de> for Members {
            type Value = RawAttributes<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object of attributes")
            }
            fn visit_map<M: MapAccess<'de>>(
                self,
                mut map: M,
            ) -> std::result::Result<Self::Value, M::Error> {
                let mut members = Vec::with_capacity(map.size_hint().unwrap_or(16));
                while let Some(Key(key)) = map.next_key()? {
                    members.push((key, map.next_value::<&'de RawValue>()?));
                }
                Ok(RawAttributes(members))
            }
        }
        deserializer.deserialize_map(Members)
    }
}

/// An object key, borrowed from the input unless it holds escapes.
struct Key<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string key")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> std::result::Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> std::result::Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v.to_string())))
            }
        }
        deserializer.deserialize_str(KeyVisitor)
    }
}

/// `text` (valid JSON) without the whitespace between tokens, or `None` when it nests deeper
/// than [`FAST_PATH_MAX_NESTING`].
fn compact_json(text: &str) -> Option<String> {
    compact_nested(text, FAST_PATH_MAX_NESTING)
}

/// [`compact_json`] with another nesting limit.
fn compact_nested(text: &str, max_nesting: usize) -> Option<String> {
    let mut out = Vec::with_capacity(text.len());
    let (mut in_string, mut escaped, mut depth) = (false, false, 0usize);
    for &b in text.as_bytes() {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
        } else {
            match b {
                b' ' | b'\t' | b'\n' | b'\r' => continue,
                b'"' => in_string = true,
                b'{' | b'[' => {
                    depth += 1;
                    if depth > max_nesting {
                        return None;
                    }
                }
                b'}' | b']' => depth = depth.saturating_sub(1),
                _ => {}
            }
        }
        out.push(b);
    }
    // Only ASCII whitespace was dropped, so the bytes are still UTF-8.
    String::from_utf8(out).ok()
}

/// `OK`/`ERROR`/`UNSET` (any case, optional `STATUS_CODE_` prefix) or OTLP's numbers 0/1/2.
pub(super) fn status_code(code: &Value) -> std::result::Result<StatusCode, String> {
    let parsed = match code {
        Value::Null => Some(StatusCode::Unset),
        Value::String(s) => StatusCode::parse(s),
        Value::Number(n) => match n.as_u64() {
            Some(0) => Some(StatusCode::Unset),
            Some(1) => Some(StatusCode::Ok),
            Some(2) => Some(StatusCode::Error),
            _ => None,
        },
        _ => None,
    };
    parsed.ok_or_else(|| format!("`status.code` must be OK, ERROR or UNSET, got {code}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINE: &str = r#"{"trace_id":"0123456789ABCDEF0123456789abcdef","span_id":"00000000000000a1","parent_span_id":null,"name":"tool.search","kind":"tool","start_time_unix_nano":10,"end_time_unix_nano":25,"status":{"code":"ERROR","message":"boom"},"attributes":{"gen_ai.tool.name":"search","error.type":"TimeoutError","pathfinder.step_index":2}}"#;

    #[test]
    fn parses_a_contract_line() {
        let batch = parse("t.jsonl", &format!("{LINE}\n\n")).unwrap();
        let span = &batch.spans[0].span;
        assert_eq!(span.trace_id, "0123456789abcdef0123456789abcdef");
        assert_eq!(span.kind, SpanKind::Tool);
        assert_eq!(span.duration_ns(), Some(15));
        assert_eq!(span.status, StatusCode::Error);
        assert_eq!(span.tool_name.as_deref(), Some("search"));
        assert_eq!(span.error_type.as_deref(), Some("TimeoutError"));
        assert_eq!(span.step, Some(2));
        assert_eq!(batch.spans[0].origin, "line 1");
    }

    #[test]
    fn lenient_reading_passes_over_lines_that_are_no_span() {
        let half = &LINE[..LINE.len() / 2];
        let no_id = LINE.replace(r#""span_id":"00000000000000a1","#, "");
        let text = format!("{LINE}\n\n{no_id}\nnot json\n{LINE}\r\n{half}");
        // The strict reader refuses the text; the lenient one keeps the two whole spans.
        assert!(parse("t.jsonl", &text).is_err());
        let spans = spans_lenient(&text);
        assert_eq!(spans.len(), 2);
        assert_eq!(spans[0].error_type.as_deref(), Some("TimeoutError"));
        assert_eq!(spans[1].attributes["pathfinder.step_index"], 2);
    }

    /// The fast path must give exactly the span the ordinary path gives, attributes included.
    #[test]
    fn fast_path_matches_the_ordinary_path() {
        let lines = [
            LINE.to_string(),
            // Whitespace, escapes in keys and values, non-string convention values, no kind.
            r#"{ "trace_id" : "t\u0031", "span_id": "s1", "name": "n",
                "attributes": { "gen_ai.operation.name" : "execute_tool",
                "gen_ai.tool.call.arguments": {"q": "a \"b\" c", "n": [1, 2.5]},
                "code.lineno": "12", "k\u0065y": null, "input.value": " spaced  text ",
                "gen_ai.usage.input_tokens": 7.0 } }"#
                .replace('\n', " "),
            r#"{"trace_id":"t","span_id":"s2","name":"n","attributes":null,"status":{"code":2}}"#
                .to_string(),
        ];
        for line in &lines {
            let (fast, text) = fast_span(line).expect("fast path takes the line");
            let mut parsed = parsed_span("t.jsonl", line, 1).unwrap();
            let attributes: Map<String, Value> = serde_json::from_str(&text).unwrap();
            assert_eq!(attributes, std::mem::take(&mut parsed.attributes), "{line}");
            assert_eq!(fast, parsed, "{line}");
            assert!(!text.contains(": "), "{text}");
        }
        let (span, text) = fast_span(&lines[1]).unwrap();
        assert_eq!(span.kind, SpanKind::Tool);
        assert_eq!(
            span.tool_arguments.as_deref(),
            Some(r#"{"n":[1,2.5],"q":"a \"b\" c"}"#)
        );
        assert_eq!(span.input.as_deref(), Some(" spaced  text "));
        assert!(text.contains(r#""input.value":" spaced  text ""#), "{text}");
        assert_eq!((span.code_lineno, span.input_tokens), (Some(12), Some(7)));
    }

    /// Rebuilding from the members gives exactly what scanning the whole text gives.
    #[test]
    fn rebuilt_attributes_match_the_compacted_text() {
        for raw in [
            r#"{}"#,
            r#"{ "a" : 1 , "b": "x y", "c": {"d": [1, {"e": null}], "f": "g h"}, "i": [ ] }"#,
            r#"{"k":"a \"quoted\" value","n":-1.5e3,"t":true}"#,
        ] {
            let members = RawAttributes::parse(raw).unwrap();
            assert_eq!(members.compact(raw.len()), compact_json(raw), "{raw}");
        }
        // A key with escapes is left to the whole-text scan, which keeps it as written.
        let raw = r#"{"k\u0065y": 1}"#;
        assert_eq!(RawAttributes::parse(raw).unwrap().compact(0), None);
        let line = format!(r#"{{"trace_id":"t","span_id":"s","name":"n","attributes":{raw}}}"#);
        assert_eq!(fast_span(&line).unwrap().1, r#"{"k\u0065y":1}"#);
        // Nesting too deep inside a value declines the fast path as before.
        let deep = format!("{}1{}", "[".repeat(100), "]".repeat(100));
        let line =
            format!(r#"{{"trace_id":"t","span_id":"s","name":"n","attributes":{{"a":{deep}}}}}"#);
        assert!(fast_span(&line).is_none());
    }

    #[test]
    fn lines_the_fast_path_declines_still_import() {
        // A repeated key keeps the last value, as a map does.
        let repeated = r#"{"trace_id":"t","span_id":"s","name":"n","attributes":{"agent.name":"a","agent.name":"b"}}"#;
        assert!(fast_span(repeated).is_none());
        let batch = parse("t.jsonl", repeated).unwrap();
        assert_eq!(batch.spans[0].span.agent_name.as_deref(), Some("b"));
        assert!(batch.spans[0].raw_attributes.is_none());
        // Non-object attributes get the ordinary error.
        let err = parse(
            "t.jsonl",
            r#"{"trace_id":"t","span_id":"s","name":"n","attributes":[1]}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(err.starts_with("t.jsonl: line 1, column"), "{err}");
        // Deep nesting is left to the ordinary parser's limit.
        let deep = format!("{}1{}", "[".repeat(120), "]".repeat(120));
        assert!(compact_json(&format!("{{\"a\":{deep}}}")).is_none());
    }

    #[test]
    fn errors_name_the_line() {
        let bad_kind = LINE.replace("\"kind\":\"tool\"", "\"kind\":\"robot\"");
        let err = parse("t.jsonl", &format!("{LINE}\n{bad_kind}\n"))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("t.jsonl: line 2: unknown span kind `robot`"),
            "{err}"
        );
        let err = parse("t.jsonl", "{\"trace_id\": \"a\"}\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("line 1") && err.contains("missing field `span_id`"),
            "{err}"
        );
    }
}
