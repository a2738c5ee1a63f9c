//! Request validation that a real provider performs before generating anything.
//!
//! Independent of the backend: a scripted run must fail exactly where a production run would,
//! so that a deficiency in an agent's request building shows up as the same 400.

use serde_json::{Map, Value};

use crate::api::{ApiError, ChatRequest};
use crate::tokenizer;

const ROLES: &[&str] = &["system", "developer", "user", "assistant", "tool"];
const SCHEMA_TYPES: &[&str] = &[
    "object", "array", "string", "number", "integer", "boolean", "null",
];

/// Checks everything but the context window. Errors name the offending parameter.
pub fn request(req: &ChatRequest) -> Result<(), ApiError> {
    if req.model.trim().is_empty() {
        return Err(ApiError::invalid(
            Some("model".into()),
            "you must provide a model parameter",
        ));
    }
    if let Some(t) = req.temperature {
        if !(0.0..=2.0).contains(&t) {
            return Err(ApiError::invalid(
                Some("temperature".into()),
                format!("{t} is greater than the maximum of 2 or less than the minimum of 0 - 'temperature'"),
            )
            .with_code("invalid_value"));
        }
    }
    if let Some(p) = req.top_p {
        if !(0.0..=1.0).contains(&p) {
            return Err(ApiError::invalid(
                Some("top_p".into()),
                format!("{p} is out of range [0, 1] - 'top_p'"),
            )
            .with_code("invalid_value"));
        }
    }
    for (name, value) in [
        ("max_tokens", req.max_tokens),
        ("max_completion_tokens", req.max_completion_tokens),
    ] {
        if let Some(v) = value {
            if v < 1 {
                return Err(ApiError::invalid(
                    Some(name.into()),
                    format!("{v} is less than the minimum of 1 - '{name}'"),
                )
                .with_code("invalid_value"));
            }
        }
    }
    if let Some(n) = req.n {
        if n != 1 {
            return Err(ApiError::invalid(
                Some("n".into()),
                format!("n = {n} is not supported by this server; only n = 1 is."),
            ));
        }
    }
    if req.stream_options.is_some() && !req.streaming() {
        return Err(ApiError::invalid(
            Some("stream_options".into()),
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
        ));
    }
    if let Some(opts) = &req.stream_options {
        let ok = opts.as_object().is_some_and(|o| {
            o.iter()
                .all(|(k, v)| k == "include_usage" && v.is_boolean())
        });
        if !ok {
            return Err(ApiError::invalid(
                Some("stream_options".into()),
                "stream_options must be an object with an optional boolean 'include_usage'.",
            ));
        }
    }
    if let Some(stop) = &req.stop {
        let ok = match stop {
            Value::Null | Value::String(_) => true,
            Value::Array(items) => items.len() <= 4 && items.iter().all(Value::is_string),
            _ => false,
        };
        if !ok {
            return Err(ApiError::invalid(
                Some("stop".into()),
                "'stop' must be a string or an array of at most 4 strings.",
            ));
        }
    }
    messages(req)?;
    tools(req)?;
    tool_choice(req)?;
    response_format(req)?;
    Ok(())
}

/// Rejects prompts that do not fit the window with the completion budget they ask for.
pub fn context_window(req: &ChatRequest, window: usize) -> Result<usize, ApiError> {
    let prompt = tokenizer::prompt_tokens(req);
    let completion = req.completion_limit().unwrap_or(0);
    if prompt + completion > window {
        let message = if completion > 0 {
            format!(
                "This model's maximum context length is {window} tokens. However, you requested \
                 {} tokens ({prompt} in the messages, {completion} in the completion). Please \
                 reduce the length of the messages or completion.",
                prompt + completion
            )
        } else {
            format!(
                "This model's maximum context length is {window} tokens. However, your messages \
                 resulted in {prompt} tokens. Please reduce the length of the messages."
            )
        };
        return Err(ApiError::invalid(Some("messages".into()), message)
            .with_code("context_length_exceeded"));
    }
    Ok(prompt)
}

fn messages(req: &ChatRequest) -> Result<(), ApiError> {
    if req.messages.is_empty() {
        return Err(ApiError::invalid(
            Some("messages".into()),
            "[] is too short - 'messages'",
        ));
    }
    // Tool-call ids the prompt still owes a `tool` message for.
    let mut pending: Vec<String> = Vec::new();
    for (i, m) in req.messages.iter().enumerate() {
        let param = format!("messages.[{i}]");
        if !ROLES.contains(&m.role.as_str()) {
            return Err(ApiError::invalid(
                Some(format!("{param}.role")),
                format!(
                    "'{}' is not one of ['system', 'assistant', 'user', 'tool', 'developer'] - '{param}.role'",
                    m.role
                ),
            ));
        }
        match &m.content {
            None | Some(Value::Null) | Some(Value::String(_)) => {}
            Some(Value::Array(parts)) => {
                for (j, part) in parts.iter().enumerate() {
                    if part.get("type").and_then(Value::as_str) != Some("text")
                        || !part.get("text").is_some_and(Value::is_string)
                    {
                        return Err(ApiError::invalid(
                            Some(format!("{param}.content.[{j}]")),
                            "content parts must be {\"type\": \"text\", \"text\": string}",
                        ));
                    }
                }
            }
            Some(_) => {
                return Err(ApiError::invalid(
                    Some(format!("{param}.content")),
                    "content must be a string, an array of content parts, or null",
                ))
            }
        }
        if m.role != "tool" && !pending.is_empty() {
            return Err(ApiError::invalid(
                Some("messages".into()),
                format!(
                    "An assistant message with 'tool_calls' must be followed by tool messages \
                     responding to each 'tool_call_id'. The following tool_call_ids did not have \
                     response messages: {}",
                    pending.join(", ")
                ),
            ));
        }
        match m.role.as_str() {
            "assistant" => {
                let calls = m.tool_calls.as_deref().unwrap_or(&[]);
                let has_content =
                    matches!(&m.content, Some(Value::String(_)) | Some(Value::Array(_)));
                if !has_content && calls.is_empty() {
                    return Err(ApiError::invalid(
                        Some(format!("{param}.content")),
                        "Invalid value for 'content': expected a string, got null.",
                    ));
                }
                for (j, call) in calls.iter().enumerate() {
                    let id = call.get("id").and_then(Value::as_str);
                    let name = call.pointer("/function/name").and_then(Value::as_str);
                    let args = call.pointer("/function/arguments");
                    if id.is_none() || name.is_none() || !args.is_some_and(Value::is_string) {
                        return Err(ApiError::invalid(
                            Some(format!("{param}.tool_calls.[{j}]")),
                            "a tool call needs 'id', 'function.name' and 'function.arguments' (a JSON string)",
                        ));
                    }
                    pending.push(id.unwrap_or_default().to_owned());
                }
            }
            "tool" => {
                let Some(id) = &m.tool_call_id else {
                    return Err(ApiError::invalid(
                        Some(format!("{param}.tool_call_id")),
                        "Missing parameter 'tool_call_id': messages with role 'tool' must have a 'tool_call_id'.",
                    ));
                };
                match pending.iter().position(|p| p == id) {
                    Some(k) => {
                        pending.remove(k);
                    }
                    None => {
                        return Err(ApiError::invalid(
                            Some(format!("{param}.role")),
                            "Invalid parameter: messages with role 'tool' must be a response to a \
                             preceeding message with 'tool_calls'.",
                        ))
                    }
                }
            }
            _ => {}
        }
    }
    if !pending.is_empty() {
        return Err(ApiError::invalid(
            Some("messages".into()),
            format!(
                "An assistant message with 'tool_calls' must be followed by tool messages \
                 responding to each 'tool_call_id'. The following tool_call_ids did not have \
                 response messages: {}",
                pending.join(", ")
            ),
        ));
    }
    Ok(())
}

fn tools(req: &ChatRequest) -> Result<(), ApiError> {
    let Some(tools) = &req.tools else {
        return Ok(());
    };
    let mut seen = Vec::new();
    for (i, tool) in tools.iter().enumerate() {
        let param = format!("tools[{i}]");
        if tool.get("type").and_then(Value::as_str) != Some("function") {
            return Err(ApiError::invalid(
                Some(format!("{param}.type")),
                format!("Invalid value for '{param}.type': expected 'function'."),
            ));
        }
        let Some(function) = tool.get("function").and_then(Value::as_object) else {
            return Err(ApiError::invalid(
                Some(format!("{param}.function")),
                format!("Missing required parameter: '{param}.function'."),
            ));
        };
        let name = function.get("name").and_then(Value::as_str).unwrap_or("");
        let name_ok = !name.is_empty()
            && name.len() <= 64
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !name_ok {
            return Err(ApiError::invalid(
                Some(format!("{param}.function.name")),
                format!(
                    "Invalid '{param}.function.name': string does not match pattern. Expected a \
                     string that matches the pattern '^[a-zA-Z0-9_-]{{1,64}}$', got {:?}.",
                    name
                ),
            )
            .with_code("invalid_value"));
        }
        if seen.contains(&name) {
            return Err(ApiError::invalid(
                Some("tools".into()),
                format!("Duplicate tool name: '{name}'. Tool names must be unique."),
            ));
        }
        seen.push(name);
        if let Some(d) = function.get("description") {
            if !d.is_string() {
                return Err(ApiError::invalid(
                    Some(format!("{param}.function.description")),
                    "the description must be a string",
                ));
            }
        }
        if let Some(params) = function.get("parameters") {
            let root = params;
            if root.get("type").and_then(Value::as_str) != Some("object") {
                return Err(ApiError::invalid(
                    Some(format!("{param}.function.parameters")),
                    format!(
                        "Invalid schema for function '{name}': schema must be a JSON Schema of \
                         'type: \"object\"', got 'type: {}'.",
                        root.get("type").map_or("None".to_owned(), Value::to_string)
                    ),
                )
                .with_code("invalid_function_parameters"));
            }
            schema(root, root, "").map_err(|why| {
                ApiError::invalid(
                    Some(format!("{param}.function.parameters")),
                    format!("Invalid schema for function '{name}': {why}"),
                )
                .with_code("invalid_function_parameters")
            })?;
        }
    }
    Ok(())
}

/// Sanity of one JSON schema node; `at` is its JSON-pointer-like location for messages.
fn schema(node: &Value, root: &Value, at: &str) -> Result<(), String> {
    let here = if at.is_empty() { "(root)" } else { at };
    let Some(obj) = node.as_object() else {
        if node.is_boolean() {
            return Ok(());
        }
        return Err(format!(
            "In context=('{here}'), schema must be an object or a boolean, got {node}."
        ));
    };
    if let Some(t) = obj.get("type") {
        let names: Vec<&Value> = match t {
            Value::Array(items) => items.iter().collect(),
            other => vec![other],
        };
        for n in names {
            if !n.as_str().is_some_and(|s| SCHEMA_TYPES.contains(&s)) {
                return Err(format!("In context=('{here}'), {n} is not a valid type."));
            }
        }
        let is = |want: &str| match t {
            Value::String(s) => s == want,
            Value::Array(items) => items.iter().any(|i| i.as_str() == Some(want)),
            _ => false,
        };
        if is("array") && !obj.contains_key("items") && !obj.contains_key("prefixItems") {
            return Err(format!(
                "In context=('{here}'), array schema missing items."
            ));
        }
    }
    if let Some(props) = obj.get("properties") {
        let Some(props) = props.as_object() else {
            return Err(format!(
                "In context=('{here}'), 'properties' must be an object."
            ));
        };
        for (k, v) in props {
            schema(v, root, &format!("{at}/properties/{k}"))?;
        }
    }
    if let Some(req) = obj.get("required") {
        let Some(items) = req.as_array() else {
            return Err(format!(
                "In context=('{here}'), 'required' must be an array."
            ));
        };
        let props = obj.get("properties").and_then(Value::as_object);
        for item in items {
            let Some(key) = item.as_str() else {
                return Err(format!(
                    "In context=('{here}'), 'required' must hold strings, got {item}."
                ));
            };
            if !props.is_some_and(|p| p.contains_key(key)) {
                return Err(format!(
                    "In context=('{here}'), 'required' names '{key}', which is not in 'properties'."
                ));
            }
        }
    }
    if let Some(e) = obj.get("enum") {
        if e.as_array().is_none_or(|a| a.is_empty()) {
            return Err(format!(
                "In context=('{here}'), 'enum' must be a non-empty array."
            ));
        }
    }
    if let Some(items) = obj.get("items") {
        schema(items, root, &format!("{at}/items"))?;
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        if let Some(list) = obj.get(key) {
            let Some(list) = list.as_array().filter(|l| !l.is_empty()) else {
                return Err(format!(
                    "In context=('{here}'), '{key}' must be a non-empty array."
                ));
            };
            for (i, s) in list.iter().enumerate() {
                schema(s, root, &format!("{at}/{key}/{i}"))?;
            }
        }
    }
    for key in ["$defs", "definitions"] {
        if let Some(defs) = obj.get(key) {
            let Some(defs) = defs.as_object() else {
                return Err(format!("In context=('{here}'), '{key}' must be an object."));
            };
            for (k, v) in defs {
                schema(v, root, &format!("{at}/{key}/{k}"))?;
            }
        }
    }
    if let Some(r) = obj.get("$ref") {
        let Some(r) = r.as_str() else {
            return Err(format!("In context=('{here}'), '$ref' must be a string."));
        };
        resolve_ref(root, r).ok_or_else(|| {
            format!("In context=('{here}'), reference to component '{r}' which was not found in the schema.")
        })?;
    }
    Ok(())
}

/// Resolves a local `$ref` (`#`, `#/$defs/X`, any JSON pointer under `#`).
fn resolve_ref<'a>(root: &'a Value, reference: &str) -> Option<&'a Value> {
    let pointer = reference.strip_prefix('#')?;
    if pointer.is_empty() {
        return Some(root);
    }
    root.pointer(pointer)
}

fn tool_choice(req: &ChatRequest) -> Result<(), ApiError> {
    let Some(choice) = &req.tool_choice else {
        return Ok(());
    };
    let offered = req.tools.as_ref().is_some_and(|t| !t.is_empty());
    match choice {
        Value::String(s) if s == "none" || s == "auto" => {
            if s == "auto" && !offered {
                return Err(ApiError::invalid(
                    Some("tool_choice".into()),
                    "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified.",
                ));
            }
            Ok(())
        }
        Value::String(s) if s == "required" => {
            if !offered {
                return Err(ApiError::invalid(
                    Some("tool_choice".into()),
                    "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified.",
                ));
            }
            Ok(())
        }
        Value::Object(obj) => named_choice(obj, req),
        other => Err(ApiError::invalid(
            Some("tool_choice".into()),
            format!(
                "Invalid value for 'tool_choice': {other}. Supported values are: 'none', 'auto', \
                 'required', or {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}."
            ),
        )
        .with_code("invalid_value")),
    }
}

fn named_choice(obj: &Map<String, Value>, req: &ChatRequest) -> Result<(), ApiError> {
    if obj.get("type").and_then(Value::as_str) != Some("function") {
        return Err(ApiError::invalid(
            Some("tool_choice.type".into()),
            "Invalid value for 'tool_choice.type': expected 'function'.",
        ));
    }
    let Some(name) = obj
        .get("function")
        .and_then(|f| f.get("name"))
        .and_then(Value::as_str)
    else {
        return Err(ApiError::invalid(
            Some("tool_choice.function.name".into()),
            "Missing required parameter: 'tool_choice.function.name'.",
        ));
    };
    if !req.tool_names().iter().any(|n| n == name) {
        return Err(ApiError::invalid(
            Some("tool_choice".into()),
            format!(
                "Invalid value for 'tool_choice': tool '{name}' is not among the offered 'tools'."
            ),
        ));
    }
    Ok(())
}

fn response_format(req: &ChatRequest) -> Result<(), ApiError> {
    let Some(format) = &req.response_format else {
        return Ok(());
    };
    let kind = format.get("type").and_then(Value::as_str);
    match kind {
        Some("text") | Some("json_object") => Ok(()),
        Some("json_schema") => {
            let spec = format.get("json_schema");
            let name = spec.and_then(|s| s.get("name")).and_then(Value::as_str);
            if name.is_none_or(str::is_empty) {
                return Err(ApiError::invalid(
                    Some("response_format.json_schema.name".into()),
                    "Missing required parameter: 'response_format.json_schema.name'.",
                ));
            }
            match spec.and_then(|s| s.get("schema")) {
                Some(s) if s.is_object() => schema(s, s, "").map_err(|why| {
                    ApiError::invalid(
                        Some("response_format.json_schema.schema".into()),
                        format!("Invalid schema for response_format: {why}"),
                    )
                }),
                _ => Err(ApiError::invalid(
                    Some("response_format.json_schema.schema".into()),
                    "Missing required parameter: 'response_format.json_schema.schema' (an object).",
                )),
            }
        }
        _ => Err(ApiError::invalid(
            Some("response_format.type".into()),
            format!(
                "Invalid value for 'response_format.type': {}. Supported values are: 'json_object', \
                 'json_schema', and 'text'.",
                format.get("type").map_or("missing".to_owned(), Value::to_string)
            ),
        )
        .with_code("invalid_value")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn req(extra: Value) -> ChatRequest {
        let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        ChatRequest::parse(body.to_string().as_bytes()).unwrap()
    }

    fn err(extra: Value) -> ApiError {
        request(&req(extra)).unwrap_err()
    }

    fn tool(params: Value) -> Value {
        json!([{"type": "function", "function": {"name": "search", "parameters": params}}])
    }

    #[test]
    fn accepts_a_plain_request() {
        request(&req(json!({"temperature": 0.7, "max_tokens": 100}))).unwrap();
    }

    #[test]
    fn temperature_out_of_range() {
        for t in [-0.1, 2.5] {
            let e = err(json!({ "temperature": t }));
            assert_eq!((e.status, e.param.as_deref()), (400, Some("temperature")));
        }
        request(&req(json!({"temperature": 2.0}))).unwrap();
    }

    #[test]
    fn tool_choice_values() {
        let tools = tool(json!({"type": "object", "properties": {}}));
        request(&req(json!({"tools": tools, "tool_choice": "auto"}))).unwrap();
        request(&req(json!({"tools": tools, "tool_choice": "required"}))).unwrap();
        request(&req(json!({"tools": tools,
            "tool_choice": {"type": "function", "function": {"name": "search"}}})))
        .unwrap();
        assert_eq!(
            err(json!({"tools": tools, "tool_choice": "always"}))
                .param
                .as_deref(),
            Some("tool_choice")
        );
        assert!(err(json!({"tools": tools,
            "tool_choice": {"type": "function", "function": {"name": "nope"}}}))
        .message
        .contains("nope"));
        assert!(err(json!({"tool_choice": "required"}))
            .message
            .contains("only allowed when 'tools'"));
    }

    #[test]
    fn response_format_shapes() {
        request(&req(json!({"response_format": {"type": "json_object"}}))).unwrap();
        let e = err(json!({"response_format": {"type": "json"}}));
        assert_eq!(e.param.as_deref(), Some("response_format.type"));
        let e =
            err(json!({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}}));
        assert_eq!(e.param.as_deref(), Some("response_format.json_schema.name"));
        request(&req(json!({"response_format": {"type": "json_schema",
            "json_schema": {"name": "answer", "schema": {"type": "object"}}}})))
        .unwrap();
    }

    #[test]
    fn tool_schema_sanity() {
        let ok = json!({"type": "object",
            "properties": {
                "q": {"type": "string"},
                "k": {"type": ["integer", "null"]},
                "mode": {"enum": ["a", "b"]},
                "tags": {"type": "array", "items": {"type": "string"}},
                "filter": {"$ref": "#/$defs/filter"},
                "either": {"anyOf": [{"type": "string"}, {"type": "number"}]}
            },
            "required": ["q"],
            "$defs": {"filter": {"type": "object", "properties": {"col": {"type": "string"}}}}});
        request(&req(json!({ "tools": tool(ok) }))).unwrap();
        let cases = [
            (json!({"type": "array", "items": {}}), "type: \"object\""),
            (
                json!({"type": "object", "properties": {"x": {"type": "str"}}}),
                "not a valid type",
            ),
            (
                json!({"type": "object", "properties": {"x": {"type": "array"}}}),
                "missing items",
            ),
            (
                json!({"type": "object", "properties": {}, "required": ["x"]}),
                "not in 'properties'",
            ),
            (
                json!({"type": "object", "properties": {"x": {"enum": []}}}),
                "'enum'",
            ),
            (
                json!({"type": "object", "properties": {"x": {"$ref": "#/$defs/nope"}}}),
                "not found",
            ),
        ];
        for (params, needle) in cases {
            let e = err(json!({ "tools": tool(params) }));
            assert!(e.message.contains(needle), "{needle}: {}", e.message);
            assert_eq!(e.param.as_deref(), Some("tools[0].function.parameters"));
        }
        let bad_name = json!([{"type": "function", "function": {"name": "web search"}}]);
        assert_eq!(
            err(json!({ "tools": bad_name })).param.as_deref(),
            Some("tools[0].function.name")
        );
    }

    #[test]
    fn tool_messages_must_answer_tool_calls() {
        let call = json!({"id": "call_1", "type": "function",
                          "function": {"name": "search", "arguments": "{}"}});
        let body = |msgs: Value| {
            ChatRequest::parse(
                json!({"model": "m", "messages": msgs})
                    .to_string()
                    .as_bytes(),
            )
            .unwrap()
        };
        let good = body(json!([{"role": "user", "content": "q"},
            {"role": "assistant", "content": null, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "r"}]));
        request(&good).unwrap();
        let missing = body(json!([{"role": "user", "content": "q"},
            {"role": "assistant", "content": null, "tool_calls": [call]},
            {"role": "user", "content": "again"}]));
        assert!(request(&missing).unwrap_err().message.contains("call_1"));
        let orphan = body(json!([{"role": "user", "content": "q"},
            {"role": "tool", "tool_call_id": "call_9", "content": "r"}]));
        assert!(request(&orphan).unwrap_err().message.contains("preceeding"));
        let bad_role = body(json!([{"role": "robot", "content": "q"}]));
        assert_eq!(
            request(&bad_role).unwrap_err().param.as_deref(),
            Some("messages.[0].role")
        );
    }

    #[test]
    fn context_window_counts_prompt_and_budget() {
        let long = "word ".repeat(9000);
        let r = ChatRequest::parse(
            json!({"model": "m", "messages": [{"role": "user", "content": long}]})
                .to_string()
                .as_bytes(),
        )
        .unwrap();
        let e = context_window(&r, 8192).unwrap_err();
        assert_eq!(e.code.as_deref(), Some("context_length_exceeded"));
        let small = req(json!({"max_tokens": 8000}));
        assert!(context_window(&small, 8192).is_ok());
        let over = req(json!({"max_tokens": 8190}));
        assert!(context_window(&over, 8192)
            .unwrap_err()
            .message
            .contains("in the completion"));
    }

    #[test]
    fn stream_options_need_stream() {
        let e = err(json!({"stream_options": {"include_usage": true}}));
        assert_eq!(e.param.as_deref(), Some("stream_options"));
        request(&req(
            json!({"stream": true, "stream_options": {"include_usage": true}}),
        ))
        .unwrap();
    }
}
