//! A trace as text for a prompt: one compact line per span, in start order.

fn cut(text: &str, chars: usize) -> String {
    let one_line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if one_line.chars().count() <= chars {
        one_line
    } else {
        let mut s: String = one_line.chars().take(chars).collect();
        s.push('…');
        s
    }
}

/// One span as one compact line: step, agent, kind, name, tool and arguments, status, code
/// location, token counts (input/output), error, input and output (each free-text field cut to `field_chars` characters,
/// whitespace collapsed).
pub fn render_span(span: &traces::Span, field_chars: usize) -> String {
    let mut parts = Vec::new();
    if let Some(step) = span.step {
        parts.push(format!("#{step}"));
    }
    if let Some(agent) = &span.agent_name {
        parts.push(format!("[{agent}]"));
    }
    parts.push(format!("{:?} {}", span.kind, span.name).to_lowercase());
    if let Some(tool) = &span.tool_name {
        parts.push(format!("tool={tool}"));
    }
    if let Some(args) = &span.tool_arguments {
        parts.push(format!("args={}", cut(args, field_chars)));
    }
    let status = format!("{:?}", span.status).to_lowercase();
    if status != "unset" {
        parts.push(format!("status={status}"));
    }
    if let Some(file) = &span.code_filepath {
        let func = span.code_function.as_deref().unwrap_or("?");
        parts.push(format!("code={file}:{func}"));
    }
    match (span.input_tokens, span.output_tokens) {
        (None, None) => {}
        (i, o) => parts.push(format!(
            "tokens={}/{}",
            i.map_or("?".into(), |n| n.to_string()),
            o.map_or("?".into(), |n| n.to_string())
        )),
    }
    if let Some(t) = &span.error_type {
        parts.push(format!("error={t}"));
    }
    for (key, value) in [
        ("error_message", &span.error_message),
        ("status_message", &span.status_message),
        ("in", &span.input),
        ("out", &span.output),
    ] {
        if let Some(v) = value.as_deref().filter(|v| !v.trim().is_empty()) {
            parts.push(format!("{key}={}", cut(v, field_chars)));
        }
    }
    parts.join(" ")
}

/// A trace's spans ordered by start time (then step; spans without either last, in store
/// order), one line each (see [`render_span`]).
pub fn render_spans(spans: &[traces::Span], field_chars: usize) -> Vec<String> {
    let mut sorted: Vec<&traces::Span> = spans.iter().collect();
    sorted.sort_by_key(|s| {
        (
            s.start_time_ns.unwrap_or(i64::MAX),
            s.step.unwrap_or(i64::MAX),
        )
    });
    sorted
        .into_iter()
        .map(|s| render_span(s, field_chars))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_fields_are_cut_and_whitespace_collapsed() {
        assert_eq!(cut("a  b\n c", 10), "a b c");
        assert_eq!(cut("abcdefghij", 4), "abcd…");
    }
}
