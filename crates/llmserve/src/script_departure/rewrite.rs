//! Rewriting a scripted call or reply the way a model that departs would: guessed
//! arguments, invented keys, one condition at a time, facts replaced.

use super::*;

/// A key as a model names a field it was told about only in words: words joined in
/// camelCase, a single word capitalised.
pub(super) fn invented_key(key: &str) -> String {
    let mut out = String::new();
    for (i, word) in key
        .split(['_', '-', ' '])
        .filter(|w| !w.is_empty())
        .enumerate()
    {
        let mut chars = word.chars();
        if let Some(first) = chars.next() {
            if i == 0 && key.contains(['_', '-', ' ']) {
                out.extend(first.to_lowercase());
            } else {
                out.extend(first.to_uppercase());
            }
            out.push_str(chars.as_str());
        }
    }
    if out == key {
        format!("{key}_value")
    } else {
        out
    }
}

/// Whether a step does several things at once: more than one call, or a call with a list of
/// more than one item (conditions, paths, columns).
pub(super) fn step_combines(step: &Step) -> bool {
    fn long_list(v: &Value) -> bool {
        match v {
            Value::Array(items) => items.len() > 1 || items.iter().any(long_list),
            Value::Object(map) => map.values().any(long_list),
            _ => false,
        }
    }
    step.tool_calls.len() > 1
        || step.tool_calls.iter().any(|c| match &c.arguments {
            Value::String(raw) => serde_json::from_str(raw).is_ok_and(|v: Value| long_list(&v)),
            other => long_list(other),
        })
}

/// `arguments` with every list cut to its first item.
pub(super) fn first_of_each_list(arguments: &Value) -> Value {
    match arguments {
        Value::Array(items) => Value::Array(items.iter().take(1).map(first_of_each_list).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), first_of_each_list(v)))
                .collect(),
        ),
        Value::String(raw) => match serde_json::from_str::<Value>(raw) {
            Ok(parsed @ (Value::Object(_) | Value::Array(_))) => {
                Value::String(first_of_each_list(&parsed).to_string())
            }
            _ => arguments.clone(),
        },
        other => other.clone(),
    }
}

/// Arguments guessed from a tool's name alone: the first value the script would send, under
/// the generic key `input`.
pub(super) fn guessed_arguments(call: &ScriptedCall) -> Value {
    fn first_value(v: &Value) -> Option<Value> {
        match v {
            Value::Object(map) => map.values().find_map(first_value),
            Value::Array(items) => items.iter().find_map(first_value),
            Value::Null => None,
            other => Some(other.clone()),
        }
    }
    let arguments = match &call.arguments {
        Value::String(raw) => serde_json::from_str(raw).unwrap_or(Value::Null),
        other => other.clone(),
    };
    let input = first_value(&arguments).unwrap_or(Value::String(String::new()));
    serde_json::json!({ "input": input })
}

/// `text` with each fact in `missing` replaced by `with(fact)`.
pub(super) fn replace_facts(
    text: &str,
    missing: &[Fact],
    with: impl Fn(&Fact) -> String,
) -> String {
    let mut out = text.to_owned();
    for fact in missing {
        out = replace_word(&out, fact.text(), &with(fact));
    }
    out
}

/// Replaces whole-word occurrences of `word` (not inside a longer number or word).
pub(super) fn replace_word(text: &str, word: &str, with: &str) -> String {
    if word.is_empty() {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(word) {
        let before = rest[..at].chars().next_back();
        let after = rest[at + word.len()..].chars().next();
        let inside = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
        out.push_str(&rest[..at]);
        if inside(before) || inside(after) {
            out.push_str(word);
        } else {
            out.push_str(with);
        }
        rest = &rest[at + word.len()..];
    }
    out.push_str(rest);
    out
}
