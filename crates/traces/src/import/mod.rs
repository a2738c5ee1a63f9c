//! Importers: each turns one input file into a [`Batch`] of spans (plus trace metadata and
//! labels) or a [`Error::Malformed`] naming where and why. They do no database work; the store
//! commits a whole batch in one transaction or nothing.

mod chatlog;
mod jsonl;

pub use jsonl::spans_lenient;
mod otlp;

use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::label::Label;
use crate::span::Span;

/// Which importer reads a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// OTLP/JSON: `resourceSpans → scopeSpans → spans`; one document, or one per line as the
    /// OpenTelemetry collector's file exporter writes.
    Otlp,
    /// One span per line in the agents' contract format (agents/CONTRACT.md).
    Jsonl,
    /// A multi-agent chat log: `{"history": [{role, name?, content}], mistake_*…}`.
    Chatlog,
    /// Spans handed over in memory through [`crate::Store::import_spans`].
    Spans,
    /// Sniff the content (see [`detect_format`]).
    Auto,
}

impl Format {
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Otlp => "otlp",
            Format::Jsonl => "jsonl",
            Format::Chatlog => "chatlog",
            Format::Spans => "spans",
            Format::Auto => "auto",
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Format {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.to_ascii_lowercase().as_str() {
            "otlp" => Ok(Format::Otlp),
            "jsonl" => Ok(Format::Jsonl),
            "chatlog" => Ok(Format::Chatlog),
            "auto" => Ok(Format::Auto),
            _ => Err(format!(
                "unknown format `{text}`; expected otlp, jsonl, chatlog or auto"
            )),
        }
    }
}

/// Limits applied while importing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImportOptions {
    /// String values (attributes, event attributes, chat turns) longer than this many bytes are
    /// clipped to it and marked (a documented repair, reported as a warning), so one runaway
    /// attribute cannot bloat the store or a prompt.
    pub max_value_bytes: usize,
}

impl Default for ImportOptions {
    fn default() -> Self {
        ImportOptions {
            max_value_bytes: 1 << 20,
        }
    }
}

/// What one import committed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ImportReport {
    /// The file imported, or `<spans>` for in-memory spans.
    pub source: String,
    /// The importer used (never `auto`).
    pub format: Format,
    /// The traces created, in input order.
    pub trace_ids: Vec<String>,
    pub spans: usize,
    pub labels: usize,
    /// Repairs made (clipped values, dropped exact duplicates, detached orphans).
    pub warnings: Vec<String>,
}

/// Trace-level facts an input carries beside its spans (OTLP resource attributes, a chat
/// log's question).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TraceMeta {
    pub attributes: Map<String, Value>,
    pub task: Option<String>,
    pub framework: Option<String>,
}

/// A span with where it came from, for error messages ("line 12", "history[3]").
#[derive(Debug, Clone, PartialEq)]
pub struct Located {
    pub span: Span,
    pub origin: String,
    /// The span's attributes as compact JSON text when the importer left them unparsed (the
    /// JSON Lines fast path); `span.attributes` is then empty until [`Located::hydrate`].
    /// Storing the text as written saves building and re-encoding a map per span.
    pub raw_attributes: Option<String>,
}

impl Located {
    /// A span whose attributes are in `span.attributes`.
    pub fn new(span: Span, origin: impl Into<String>) -> Located {
        Located {
            span,
            origin: origin.into(),
            raw_attributes: None,
        }
    }

    /// Moves unparsed attributes into `span.attributes`, for the rare steps that need the map
    /// (repairs, duplicate checks, root attributes).
    pub fn hydrate(&mut self) -> Result<()> {
        if let Some(text) = self.raw_attributes.take() {
            self.span.attributes = serde_json::from_str(&text)?;
        }
        Ok(())
    }
}

/// Everything one input holds, before validation.
#[derive(Debug, Clone, Default)]
pub struct Batch {
    pub spans: Vec<Located>,
    pub meta: HashMap<String, TraceMeta>,
    pub labels: Vec<Label>,
    pub warnings: Vec<String>,
}

impl Batch {
    /// Puts the batch's one trace (its spans, metadata and labels) under `trace_id`. A batch
    /// with spans of more than one trace is refused: they would merge into one.
    pub fn rekey(&mut self, trace_id: &str, input: &str) -> Result<()> {
        let mut ids: Vec<&str> = self
            .spans
            .iter()
            .map(|l| l.span.trace_id.as_str())
            .collect();
        ids.sort_unstable();
        ids.dedup();
        if ids.len() > 1 {
            return Err(Error::Malformed {
                input: input.to_owned(),
                at: "trace_id".into(),
                reason: format!(
                    "{} traces ({}, ...) cannot all be imported as trace {trace_id}",
                    ids.len(),
                    ids[..2].join(", ")
                ),
            });
        }
        for l in &mut self.spans {
            trace_id.clone_into(&mut l.span.trace_id);
        }
        self.meta = std::mem::take(&mut self.meta)
            .into_values()
            .map(|m| (trace_id.to_owned(), m))
            .collect();
        for label in &mut self.labels {
            trace_id.clone_into(&mut label.trace_id);
        }
        Ok(())
    }
}

/// Reads `path` with the given importer (resolving `Auto` first) into a batch.
pub fn read_file(path: &Path, format: Format) -> Result<(Format, Batch)> {
    let bytes = std::fs::read(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let source = path.display().to_string();
    let text = check_utf8(&source, &bytes)?;
    let format = match format {
        Format::Auto => detect_format(path, text)?,
        f => f,
    };
    read_text(&source, text, format)
}

/// Reads text held in memory with the given importer into a batch; `source` names it in
/// errors. `Auto` sniffs the content as for a file without an extension.
pub fn read_text(source: &str, text: &str, format: Format) -> Result<(Format, Batch)> {
    let format = match format {
        Format::Auto => detect_format(Path::new(source), text)?,
        Format::Spans => {
            return Err(Error::malformed(
                source,
                "format",
                "`spans` is for in-memory imports; text is otlp, jsonl or chatlog",
            ))
        }
        f => f,
    };
    let batch = match format {
        Format::Otlp => otlp::parse(source, text)?,
        Format::Jsonl => jsonl::parse(source, text)?,
        Format::Chatlog => chatlog::parse(source, text)?,
        Format::Spans | Format::Auto => unreachable!("resolved above"),
    };
    Ok((format, batch))
}

/// Sniffs the content: a first line holding a span object is JSON Lines; a document with
/// `resourceSpans` is OTLP; one with a `history` list is a chat log.
pub fn detect_format(path: &Path, text: &str) -> Result<Format> {
    let unknown = |reason: &str| Error::UnknownFormat {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    };
    let first_line = text
        .lines()
        .find(|l| !l.trim().is_empty())
        .ok_or_else(|| unknown("the file is empty"))?;
    if let Ok(Value::Object(obj)) = serde_json::from_str::<Value>(first_line) {
        if obj.contains_key("resourceSpans") {
            return Ok(Format::Otlp);
        }
        if obj.contains_key("span_id") || obj.contains_key("trace_id") {
            return Ok(Format::Jsonl);
        }
        if obj.contains_key("history") {
            return Ok(Format::Chatlog);
        }
    }
    let lines_extension = path
        .extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("jsonl") || e.eq_ignore_ascii_case("ndjson"));
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(obj)) if obj.contains_key("resourceSpans") => Ok(Format::Otlp),
        Ok(Value::Object(obj)) if obj.contains_key("history") => Ok(Format::Chatlog),
        // A broken first line of a .jsonl file: let the JSON Lines reader name the line.
        _ if lines_extension => Ok(Format::Jsonl),
        Ok(_) => Err(unknown(
            "a JSON document with neither `resourceSpans` nor `history`",
        )),
        Err(err) => Err(unknown(&format!(
            "neither one JSON document ({}) nor JSON Lines of spans",
            describe_json_error(&err).1
        ))),
    }
}

/// The file as UTF-8, or an error naming the byte offset and line of the first bad byte.
fn check_utf8<'a>(source: &str, bytes: &'a [u8]) -> Result<&'a str> {
    std::str::from_utf8(bytes).map_err(|err| {
        let offset = err.valid_up_to();
        let line = bytes[..offset].iter().filter(|&&b| b == b'\n').count() + 1;
        Error::malformed(
            source,
            format!("byte {offset} (line {line})"),
            format!(
                "invalid UTF-8 (byte 0x{:02x}); traces must be UTF-8 encoded",
                bytes[offset]
            ),
        )
    })
}

/// Splits a serde_json error into a position ("line L, column C") and its message without the
/// position suffix.
pub(crate) fn describe_json_error(err: &serde_json::Error) -> (String, String) {
    let text = err.to_string();
    let suffix = format!(" at line {} column {}", err.line(), err.column());
    let message = text.strip_suffix(&suffix).unwrap_or(&text).to_string();
    let message = if message.contains("recursion limit") {
        format!("{message} (JSON nested deeper than 128 levels)")
    } else {
        message
    };
    (
        format!("line {}, column {}", err.line(), err.column()),
        message,
    )
}

/// Checks an id: non-empty, at most 256 bytes, no control characters. Hex ids are
/// lowercased so `ABC…` and `abc…` name the same span.
pub(crate) fn check_id(value: &str, what: &str) -> std::result::Result<String, String> {
    if value.is_empty() {
        return Err(format!("`{what}` is empty"));
    }
    if value.len() > 256 {
        return Err(format!(
            "`{what}` is {} bytes long (at most 256)",
            value.len()
        ));
    }
    if value.chars().any(char::is_control) {
        return Err(format!("`{what}` contains control characters"));
    }
    if value.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(value.to_ascii_lowercase())
    } else {
        Ok(value.to_string())
    }
}

/// A parent id, where empty and all-zero ids mean "no parent" (OTLP's convention).
pub(crate) fn parent_id(value: Option<&str>) -> std::result::Result<Option<String>, String> {
    match value {
        None => Ok(None),
        Some(v) if v.is_empty() || v.bytes().all(|b| b == b'0') => Ok(None),
        Some(v) => check_id(v, "parent_span_id").map(Some),
    }
}

/// A nanosecond timestamp from a JSON integer or decimal string (OTLP encodes 64-bit integers
/// as strings); must fit in a signed 64-bit integer (dates before 2262).
pub(crate) fn nanos(value: &Value, what: &str) -> std::result::Result<Option<i64>, String> {
    let parsed = match value {
        Value::Null => return Ok(None),
        Value::Number(n) => n.as_i64(),
        Value::String(s) if s.is_empty() => return Ok(None),
        Value::String(s) => s.parse::<i64>().ok(),
        _ => None,
    };
    match parsed {
        Some(ns) if ns >= 0 => Ok(Some(ns)),
        _ => Err(format!(
            "`{what}` must be a non-negative integer of nanoseconds below 2^63, got {value}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_errors_name_offset_and_line() {
        let err = check_utf8("f.jsonl", b"{}\n{\"a\":\"\xff\"}")
            .unwrap_err()
            .to_string();
        assert!(err.contains("byte 9 (line 2)"), "{err}");
        assert!(err.contains("0xff"), "{err}");
    }

    #[test]
    fn ids_are_checked_and_hex_lowercased() {
        assert_eq!(check_id("ABCdef01", "span_id").unwrap(), "abcdef01");
        assert_eq!(check_id("turn-1", "span_id").unwrap(), "turn-1");
        assert!(check_id("", "span_id").unwrap_err().contains("empty"));
        assert!(check_id("a\u{7}", "span_id")
            .unwrap_err()
            .contains("control"));
        assert_eq!(parent_id(Some("0000000000000000")).unwrap(), None);
    }

    #[test]
    fn nanos_accept_numbers_and_strings() {
        assert_eq!(nanos(&Value::from(5), "t").unwrap(), Some(5));
        assert_eq!(nanos(&Value::from("7"), "t").unwrap(), Some(7));
        assert!(nanos(&Value::from("18446744073709551615"), "t").is_err());
        assert!(nanos(&Value::from(-1), "t").is_err());
    }

    #[test]
    fn detects_formats() {
        let p = Path::new("x");
        assert_eq!(
            detect_format(p, "{\"trace_id\":\"a\",\"span_id\":\"b\"}\n").unwrap(),
            Format::Jsonl
        );
        assert_eq!(
            detect_format(p, "{\"resourceSpans\":[]}").unwrap(),
            Format::Otlp
        );
        assert_eq!(
            detect_format(p, "{\n \"history\": []\n}").unwrap(),
            Format::Chatlog
        );
        assert!(detect_format(p, "[1,2]")
            .unwrap_err()
            .to_string()
            .contains("--format"));
    }
}
