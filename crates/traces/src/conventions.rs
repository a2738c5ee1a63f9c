//! Maps attribute conventions onto the span model: the OpenTelemetry GenAI semantic conventions
//! (`gen_ai.*`), OpenInference (`openinference.span.kind`, `input.value`, `llm.*`), the
//! OpenTelemetry code and exception conventions, and Pathfinder's own keys. Pure functions; the
//! attributes themselves are never changed.

use std::borrow::Cow;

use serde_json::{Map, Value};

use crate::span::{Span, SpanKind, StatusCode};

/// The first key present wins; listed newest convention first.
const MODEL_KEYS: &[&str] = &[
    "gen_ai.request.model",
    "gen_ai.response.model",
    "llm.model_name",
];
const INPUT_TOKEN_KEYS: &[&str] = &[
    "gen_ai.usage.input_tokens",
    "llm.token_count.prompt",
    "gen_ai.usage.prompt_tokens",
];
const OUTPUT_TOKEN_KEYS: &[&str] = &[
    "gen_ai.usage.output_tokens",
    "llm.token_count.completion",
    "gen_ai.usage.completion_tokens",
];
const TOOL_NAME_KEYS: &[&str] = &["gen_ai.tool.name", "tool.name"];
const TOOL_ARGUMENT_KEYS: &[&str] = &["gen_ai.tool.call.arguments", "tool_call.function.arguments"];
const INPUT_KEYS: &[&str] = &["input.value", "gen_ai.input.messages", "gen_ai.prompt"];
const OUTPUT_KEYS: &[&str] = &[
    "output.value",
    "gen_ai.output.messages",
    "gen_ai.tool.call.result",
    "gen_ai.completion",
];
const AGENT_KEYS: &[&str] = &["gen_ai.agent.name", "agent.name"];
const STEP_KEYS: &[&str] = &["pathfinder.step_index"];
const FILEPATH_KEYS: &[&str] = &["code.filepath", "code.file.path"];
const FUNCTION_KEYS: &[&str] = &["code.function", "code.function.name"];
const LINENO_KEYS: &[&str] = &["code.lineno", "code.line.number"];
const ERROR_TYPE_KEYS: &[&str] = &["error.type", "exception.type"];
const ERROR_MESSAGE_KEYS: &[&str] = &["exception.message", "error.message"];

/// Read access to a span's attributes, parsed (a map) or still JSON text (the JSON Lines fast
/// path), so the conventions are applied the same way to both.
pub(crate) trait Attributes {
    /// The value as text, as [`value_text`] gives it.
    fn text(&self, key: &str) -> Option<String>;
    /// The value as an integer, as [`value_int`] gives it.
    fn int(&self, key: &str) -> Option<i64>;
    /// The value when it is a JSON string.
    fn string(&self, key: &str) -> Option<Cow<'_, str>>;
    fn contains(&self, key: &str) -> bool;
}

impl Attributes for Map<String, Value> {
    fn text(&self, key: &str) -> Option<String> {
        self.get(key).and_then(value_text)
    }
    fn int(&self, key: &str) -> Option<i64> {
        self.get(key).and_then(value_int)
    }
    fn string(&self, key: &str) -> Option<Cow<'_, str>> {
        self.get(key).and_then(Value::as_str).map(Cow::Borrowed)
    }
    fn contains(&self, key: &str) -> bool {
        self.contains_key(key)
    }
}

/// The semantic kind the attributes declare, if any: OpenInference's span kind first, then the
/// GenAI operation name.
pub fn kind_from_attributes(attrs: &Map<String, Value>) -> Option<SpanKind> {
    kind_from(attrs)
}

pub(crate) fn kind_from(attrs: &impl Attributes) -> Option<SpanKind> {
    if let Some(kind) = attrs.string("openinference.span.kind") {
        return Some(match kind.to_ascii_uppercase().as_str() {
            "LLM" => SpanKind::Llm,
            "TOOL" => SpanKind::Tool,
            "AGENT" => SpanKind::Agent,
            "CHAIN" => SpanKind::Chain,
            "RETRIEVER" | "RERANKER" => SpanKind::Retriever,
            _ => SpanKind::Other, // EMBEDDING, GUARDRAIL, EVALUATOR, UNKNOWN
        });
    }
    let operation = attrs.string("gen_ai.operation.name")?;
    Some(match operation.as_ref() {
        "chat" | "text_completion" | "generate_content" => SpanKind::Llm,
        "execute_tool" => SpanKind::Tool,
        "invoke_agent" | "create_agent" => SpanKind::Agent,
        _ => SpanKind::Other, // embeddings and operations not yet named by the conventions
    })
}

/// Fills every model field that is still `None` from the attributes (and `exception` events).
/// Fields an importer already set (e.g. from a chat-log turn) are left alone.
pub fn fill_from_attributes(span: &mut Span) {
    let attrs = std::mem::take(&mut span.attributes);
    fill_from(span, &attrs);
    span.attributes = attrs;
}

/// [`fill_from_attributes`] with the attributes read from `attrs` instead of the span.
pub(crate) fn fill_from(span: &mut Span, attrs: &impl Attributes) {
    fill_text(&mut span.model, attrs, MODEL_KEYS);
    fill_int(&mut span.input_tokens, attrs, INPUT_TOKEN_KEYS);
    fill_int(&mut span.output_tokens, attrs, OUTPUT_TOKEN_KEYS);
    fill_text(&mut span.tool_name, attrs, TOOL_NAME_KEYS);
    fill_text(&mut span.tool_arguments, attrs, TOOL_ARGUMENT_KEYS);
    fill_text(&mut span.input, attrs, INPUT_KEYS);
    fill_text(&mut span.output, attrs, OUTPUT_KEYS);
    fill_text(&mut span.agent_name, attrs, AGENT_KEYS);
    fill_int(&mut span.step, attrs, STEP_KEYS);
    fill_text(&mut span.code_filepath, attrs, FILEPATH_KEYS);
    fill_text(&mut span.code_function, attrs, FUNCTION_KEYS);
    fill_int(&mut span.code_lineno, attrs, LINENO_KEYS);
    fill_text(&mut span.error_type, attrs, ERROR_TYPE_KEYS);
    fill_text(&mut span.error_message, attrs, ERROR_MESSAGE_KEYS);

    // OpenTelemetry records exceptions as events named `exception`.
    if span.error_type.is_none() || span.error_message.is_none() {
        let exception = span.events.iter().find_map(|event| {
            (event.get("name").and_then(Value::as_str) == Some("exception"))
                .then(|| event.get("attributes").and_then(Value::as_object))
                .flatten()
        });
        if let Some(ev_attrs) = exception {
            fill_text(&mut span.error_type, ev_attrs, &["exception.type"]);
            fill_text(&mut span.error_message, ev_attrs, &["exception.message"]);
        }
    }
    // A tool span without a tool-name attribute is named after the span (OpenInference names
    // tool spans after the tool); a tool span's input is its arguments.
    if span.kind == SpanKind::Tool {
        if span.tool_name.is_none() {
            span.tool_name = Some(span.name.clone());
        }
        if span.tool_arguments.is_none() && attrs.contains("openinference.span.kind") {
            span.tool_arguments = span.input.clone();
        }
    }
    if span.error_message.is_none() && span.status == StatusCode::Error {
        span.error_message = span.status_message.clone();
    }
    // A framework that records no code location still records where an exception was
    // raised: the innermost frame of application code in its stack trace.
    if span.code_filepath.is_none() && span.code_function.is_none() {
        let stack = attrs.text(STACKTRACE_KEY).or_else(|| {
            span.events.iter().find_map(|event| {
                (event.get("name").and_then(Value::as_str) == Some("exception"))
                    .then(|| event.pointer("/attributes/exception.stacktrace"))
                    .flatten()
                    .and_then(value_text)
            })
        });
        if let Some(frame) = stack.as_deref().and_then(application_frame) {
            span.code_filepath = Some(frame.file);
            span.code_function = frame.function;
            if span.code_lineno.is_none() {
                span.code_lineno = frame.line;
            }
        }
    }
}

const STACKTRACE_KEY: &str = "exception.stacktrace";

/// One frame of a stack trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub file: String,
    pub function: Option<String>,
    pub line: Option<i64>,
}

/// Paths of code that is not the application's: installed packages, the language's own
/// library, frames without a file.
fn library_path(path: &str) -> bool {
    const MARKERS: &[&str] = &[
        "site-packages/",
        "dist-packages/",
        "/lib/python3",
        "/lib/python2",
        "node_modules/",
        "node:",
        "<frozen",
        "<string>",
        "<stdin>",
        "internal/",
    ];
    path.is_empty() || MARKERS.iter().any(|m| path.contains(m))
}

/// The innermost frame of application code in a Python or JavaScript stack trace (Python
/// prints the innermost frame last, JavaScript first); `None` when every frame is library
/// code or the text holds no frame.
pub fn application_frame(stack: &str) -> Option<Frame> {
    let python: Vec<Frame> = stack.lines().filter_map(python_frame).collect();
    if !python.is_empty() {
        return python.into_iter().rev().find(|f| !library_path(&f.file));
    }
    stack
        .lines()
        .filter_map(javascript_frame)
        .find(|f| !library_path(&f.file))
}

/// `  File "app/tools.py", line 12, in read_file`
fn python_frame(line: &str) -> Option<Frame> {
    let rest = line.trim_start().strip_prefix("File \"")?;
    let (file, rest) = rest.split_once('"')?;
    let rest = rest.strip_prefix(", line ")?;
    let (number, function) = match rest.split_once(", in ") {
        Some((n, f)) => (n, Some(f.trim().to_owned())),
        None => (rest, None),
    };
    Some(Frame {
        file: file.to_owned(),
        function: function.filter(|f| !f.is_empty() && f != "<module>"),
        line: number.trim().parse().ok(),
    })
}

/// `    at readFile (/app/tools.js:12:5)` or `    at /app/tools.js:12:5`
fn javascript_frame(line: &str) -> Option<Frame> {
    let rest = line.trim_start().strip_prefix("at ")?;
    let (function, location) = match rest.strip_suffix(')').and_then(|r| r.rsplit_once(" (")) {
        Some((f, loc)) => (Some(f.trim().to_owned()), loc),
        None => (None, rest.trim()),
    };
    let mut parts = location.rsplitn(3, ':');
    let _column = parts.next()?;
    let line_number = parts.next()?.parse().ok();
    let file = parts.next()?.to_owned();
    Some(Frame {
        file,
        function,
        line: line_number,
    })
}

/// The span's attributes plus every model field that no attribute of its convention carries
/// yet, under the first (canonical) key of that convention. Re-importing the result through
/// [`fill_from_attributes`] yields the same fields, so exports round-trip.
pub fn canonical_attributes(span: &Span) -> Map<String, Value> {
    let mut attrs = span.attributes.clone();
    let mut put = |keys: &[&str], value: Option<Value>| {
        if let Some(value) = value {
            if !keys.iter().any(|k| attrs.contains_key(*k)) {
                attrs.insert(keys[0].to_string(), value);
            }
        }
    };
    let text = |v: &Option<String>| v.clone().map(Value::String);
    let int = |v: Option<i64>| v.map(Value::from);
    put(MODEL_KEYS, text(&span.model));
    put(INPUT_TOKEN_KEYS, int(span.input_tokens));
    put(OUTPUT_TOKEN_KEYS, int(span.output_tokens));
    put(TOOL_NAME_KEYS, text(&span.tool_name));
    put(TOOL_ARGUMENT_KEYS, text(&span.tool_arguments));
    put(INPUT_KEYS, text(&span.input));
    put(OUTPUT_KEYS, text(&span.output));
    put(AGENT_KEYS, text(&span.agent_name));
    put(STEP_KEYS, int(span.step));
    put(FILEPATH_KEYS, text(&span.code_filepath));
    put(FUNCTION_KEYS, text(&span.code_function));
    put(LINENO_KEYS, int(span.code_lineno));
    put(ERROR_TYPE_KEYS, text(&span.error_type));
    put(ERROR_MESSAGE_KEYS, text(&span.error_message));
    attrs
}

/// An attribute as text: strings as they are, anything else as compact JSON.
pub fn value_text(value: &Value) -> Option<String> {
    match value {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

/// An attribute as an integer: JSON integers, integral floats and decimal strings.
pub fn value_int(value: &Value) -> Option<i64> {
    match value {
        Value::Number(n) => n.as_i64().or_else(|| {
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && f.abs() < 9.0e15)
                .map(|f| f as i64)
        }),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

fn fill_text(slot: &mut Option<String>, attrs: &impl Attributes, keys: &[&str]) {
    if slot.is_none() {
        *slot = keys.iter().find_map(|k| attrs.text(k));
    }
}

fn fill_int(slot: &mut Option<i64>, attrs: &impl Attributes, keys: &[&str]) {
    if slot.is_none() {
        *slot = keys.iter().find_map(|k| attrs.int(k));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn span_with(attrs: Value, kind: SpanKind) -> Span {
        let mut span = Span::new("t", "s", "n", kind);
        span.attributes = attrs.as_object().unwrap().clone();
        span
    }

    #[test]
    fn code_location_from_the_innermost_application_frame() {
        let stack = "Traceback (most recent call last):\n  File \"/tmp/x/qa_agent/__main__.py\", line 40, in main\n    run()\n  File \"/tmp/x/qa_agent/tools.py\", line 97, in read_file\n    lines = target.read_text()\n  File \"/usr/lib/python3.11/pathlib.py\", line 1059, in read_text\n    return f.read()\n  File \"<frozen codecs>\", line 322, in decode\nUnicodeDecodeError: 'ascii' codec can't decode byte 0xc3";
        let mut span = Span::new("t", "s", "execute_tool read_file", SpanKind::Tool);
        span.events = vec![json!({"name": "exception", "attributes": {
            "exception.type": "UnicodeDecodeError", "exception.stacktrace": stack}})];
        fill_from_attributes(&mut span);
        assert_eq!(
            span.code_filepath.as_deref(),
            Some("/tmp/x/qa_agent/tools.py")
        );
        assert_eq!(span.code_function.as_deref(), Some("read_file"));
        assert_eq!(span.code_lineno, Some(97));

        // A location the span records itself wins; library-only stacks name nothing.
        let mut own = span_with(
            json!({"code.filepath": "a.py", "code.function": "f",
            "exception.stacktrace": stack}),
            SpanKind::Tool,
        );
        fill_from_attributes(&mut own);
        assert_eq!(
            (own.code_filepath.as_deref(), own.code_function.as_deref()),
            (Some("a.py"), Some("f"))
        );
        let library = "  File \"/v/lib/python3.11/site-packages/pkg/m.py\", line 3, in g\n";
        assert_eq!(application_frame(library), None);

        let js = "TypeError: x is undefined\n    at parse (/app/src/answer.js:12:5)\n    at node:internal/main:1:1";
        assert_eq!(
            application_frame(js),
            Some(Frame {
                file: "/app/src/answer.js".into(),
                function: Some("parse".into()),
                line: Some(12)
            })
        );
        assert_eq!(
            application_frame("    at /app/run.js:3:9").map(|f| f.function),
            Some(None)
        );
    }

    #[test]
    fn genai_attributes_map_onto_fields() {
        let mut span = span_with(
            json!({"gen_ai.operation.name": "chat", "gen_ai.request.model": "m",
                   "gen_ai.usage.input_tokens": 12, "gen_ai.usage.output_tokens": "5",
                   "gen_ai.agent.name": "planner", "pathfinder.step_index": 3,
                   "code.filepath": "a.py", "code.function": "f", "code.lineno": 7}),
            SpanKind::Llm,
        );
        assert_eq!(kind_from_attributes(&span.attributes), Some(SpanKind::Llm));
        fill_from_attributes(&mut span);
        assert_eq!(span.model.as_deref(), Some("m"));
        assert_eq!((span.input_tokens, span.output_tokens), (Some(12), Some(5)));
        assert_eq!(span.agent_name.as_deref(), Some("planner"));
        assert_eq!(span.step, Some(3));
        assert_eq!(span.code_lineno, Some(7));
    }

    #[test]
    fn openinference_attributes_map_onto_fields() {
        let mut span = span_with(
            json!({"openinference.span.kind": "TOOL", "input.value": "{\"q\":1}",
                   "output.value": "ok", "llm.token_count.prompt": 4.0}),
            SpanKind::Tool,
        );
        assert_eq!(kind_from_attributes(&span.attributes), Some(SpanKind::Tool));
        span.name = "search".into();
        fill_from_attributes(&mut span);
        assert_eq!(span.tool_name.as_deref(), Some("search"));
        assert_eq!(span.tool_arguments.as_deref(), Some("{\"q\":1}"));
        assert_eq!(span.input_tokens, Some(4));
    }

    #[test]
    fn exception_event_supplies_error_fields() {
        let mut span = span_with(json!({}), SpanKind::Tool);
        span.events.push(json!({"name": "exception", "attributes":
            {"exception.type": "KeyError", "exception.message": "x"}}));
        fill_from_attributes(&mut span);
        assert_eq!(span.error_type.as_deref(), Some("KeyError"));
        assert!(span.is_error());
    }
}
