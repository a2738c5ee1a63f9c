//! Renders a completion as the server-sent events of a streamed response.
//!
//! The shape follows OpenAI's stream: a first chunk carrying the role, content deltas, tool
//! calls (the first delta of each carrying `index`, `id`, `type` and the name, later ones
//! argument fragments), a chunk with the `finish_reason`, optionally a usage chunk with empty
//! `choices`, and `data: [DONE]`. Surface variation comes from the completion's
//! `variation_seed`: fragment lengths, and SSE comment lines (`: keep-alive`) between events,
//! which a conforming SSE client ignores.

use serde_json::{json, Value};

use crate::api::{Completion, ResponseMeta, Usage};
use crate::rng::SplitMix64;

/// The longest content fragment of one chunk, in characters.
const MAX_CONTENT_FRAGMENT: usize = 12;
/// The longest argument fragment of one chunk, in characters.
const MAX_ARGUMENT_FRAGMENT: usize = 16;

/// `text` split into fragments of 1..=`max` characters (never inside a UTF-8 sequence).
pub fn split_fragments(text: &str, max: usize, rng: &mut SplitMix64) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let n = rng.range(1, max).min(chars.len() - i);
        out.push(chars[i..i + n].iter().collect());
        i += n;
    }
    out
}

/// One `data:` event.
fn event(value: &Value) -> String {
    format!("data: {value}\n\n")
}

/// All events of the streamed response, in order, each a complete `data: …\n\n` (or comment)
/// block ending with `data: [DONE]`. `usage` is sent when the request asked for it.
pub fn events(meta: &ResponseMeta, completion: &Completion, usage: Option<Usage>) -> Vec<String> {
    let mut rng = SplitMix64::new(completion.variation_seed);
    let include_usage = usage.is_some();
    let chunk = |delta: Value, finish: Option<&str>| {
        let mut c = json!({
            "id": meta.id,
            "object": "chat.completion.chunk",
            "created": meta.created,
            "model": meta.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
        });
        if include_usage {
            c["usage"] = Value::Null;
        }
        c
    };
    let mut data: Vec<Value> = vec![chunk(json!({"role": "assistant", "content": ""}), None)];
    if let Some(content) = &completion.content {
        for fragment in split_fragments(content, MAX_CONTENT_FRAGMENT, &mut rng) {
            data.push(chunk(json!({ "content": fragment }), None));
        }
    }
    for (index, call) in completion.tool_calls.iter().enumerate() {
        let mut fragments = split_fragments(&call.arguments, MAX_ARGUMENT_FRAGMENT, &mut rng);
        // The opening delta sometimes already carries the first argument fragment.
        let first = if !fragments.is_empty() && rng.chance(1, 2) {
            fragments.remove(0)
        } else {
            String::new()
        };
        data.push(chunk(
            json!({"tool_calls": [{"index": index, "id": call.id, "type": "function",
                                   "function": {"name": call.name, "arguments": first}}]}),
            None,
        ));
        for fragment in fragments {
            data.push(chunk(
                json!({"tool_calls": [{"index": index, "function": {"arguments": fragment}}]}),
                None,
            ));
        }
    }
    if completion.cut_stream {
        // The connection drops halfway through the reply: what arrived is all there is.
        data.truncate(data.len().div_ceil(2));
        return data.iter().map(event).collect();
    }
    data.push(chunk(json!({}), Some(completion.finish_reason.as_str())));
    if let Some(usage) = usage {
        data.push(json!({
            "id": meta.id,
            "object": "chat.completion.chunk",
            "created": meta.created,
            "model": meta.model,
            "choices": [],
            "usage": usage.to_json(),
        }));
    }
    let mut out = Vec::with_capacity(data.len() + 4);
    for value in &data {
        if rng.chance(1, 10) {
            out.push(": keep-alive\n\n".to_owned());
        }
        out.push(event(value));
    }
    out.push("data: [DONE]\n\n".to_owned());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{FinishReason, ToolCallOut};

    fn meta() -> ResponseMeta {
        ResponseMeta {
            id: "chatcmpl-1".into(),
            created: 1,
            model: "m".into(),
        }
    }

    /// (id, name, arguments) of one reassembled tool call.
    type Call = (String, String, String);

    /// Parses events back the way a client would: content, tool calls, finish reason, usage.
    fn reassemble(events: &[String]) -> (String, Vec<Call>, String, Option<Value>) {
        let mut content = String::new();
        let mut calls: Vec<Call> = Vec::new();
        let mut finish = String::new();
        let mut usage = None;
        let mut done = false;
        for e in events {
            assert!(e.ends_with("\n\n"));
            if e.starts_with(':') {
                continue;
            }
            let payload = e.strip_prefix("data: ").unwrap().trim_end();
            assert!(!done, "event after [DONE]");
            if payload == "[DONE]" {
                done = true;
                continue;
            }
            let v: Value = serde_json::from_str(payload).unwrap();
            if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
                usage = Some(u.clone());
            }
            let Some(choice) = v["choices"].get(0) else {
                continue;
            };
            if let Some(f) = choice["finish_reason"].as_str() {
                finish = f.to_owned();
            }
            let delta = &choice["delta"];
            if let Some(c) = delta["content"].as_str() {
                content.push_str(c);
            }
            for tc in delta["tool_calls"].as_array().into_iter().flatten() {
                let i = tc["index"].as_u64().unwrap() as usize;
                if i == calls.len() {
                    calls.push(Default::default());
                }
                if let Some(id) = tc["id"].as_str() {
                    calls[i].0 = id.into();
                }
                if let Some(n) = tc["function"]["name"].as_str() {
                    calls[i].1 = n.into();
                }
                if let Some(a) = tc["function"]["arguments"].as_str() {
                    calls[i].2.push_str(a);
                }
            }
        }
        assert!(done);
        (content, calls, finish, usage)
    }

    #[test]
    fn fragments_rejoin_and_respect_char_boundaries() {
        let mut rng = SplitMix64::new(9);
        let text = "Zürich – 東京 and more text 😀!";
        let parts = split_fragments(text, 5, &mut rng);
        assert_eq!(parts.concat(), text);
        assert!(parts.iter().all(|p| (1..=5).contains(&p.chars().count())));
        assert!(split_fragments("", 5, &mut rng).is_empty());
    }

    #[test]
    fn content_stream_reassembles() {
        for seed in 0..30 {
            let c = Completion {
                content: Some("The answer is 42, said the café owner.".into()),
                tool_calls: vec![],
                finish_reason: FinishReason::Stop,
                variation_seed: seed,
                cut_stream: false,
            };
            let (content, calls, finish, usage) = reassemble(&events(&meta(), &c, None));
            assert_eq!(content, c.content.clone().unwrap());
            assert!(calls.is_empty());
            assert_eq!(finish, "stop");
            assert!(usage.is_none());
        }
    }

    #[test]
    fn tool_calls_reassemble_with_usage_last() {
        let c = Completion {
            content: None,
            tool_calls: vec![
                ToolCallOut {
                    id: "call_a".into(),
                    name: "search".into(),
                    arguments: r#"{"query": "rivers of Europe"}"#.into(),
                },
                ToolCallOut {
                    id: "call_b".into(),
                    name: "calculator".into(),
                    arguments: r#"{"expression": "2*(3+4)"}"#.into(),
                },
            ],
            finish_reason: FinishReason::ToolCalls,
            variation_seed: 5,
            cut_stream: false,
        };
        let usage = Usage {
            prompt_tokens: 10,
            completion_tokens: 7,
        };
        let evs = events(&meta(), &c, Some(usage));
        let (content, calls, finish, got_usage) = reassemble(&evs);
        assert_eq!(content, "");
        assert_eq!(finish, "tool_calls");
        assert_eq!(calls.len(), 2);
        assert_eq!(
            calls[0],
            (
                "call_a".into(),
                "search".into(),
                c.tool_calls[0].arguments.clone()
            )
        );
        assert_eq!(calls[1].2, c.tool_calls[1].arguments);
        assert_eq!(got_usage.unwrap()["total_tokens"], 17);
        // The usage chunk is the last data event before [DONE], with empty choices.
        let last_data = evs.iter().rev().find(|e| e.starts_with("data: {")).unwrap();
        assert!(last_data.contains("\"choices\":[]"));
        // Arguments really are split across several chunks.
        assert!(evs.iter().filter(|e| e.contains("\"arguments\"")).count() > 3);
    }

    #[test]
    fn same_seed_same_bytes() {
        let c = Completion {
            content: Some("abc def ghi jkl mno pqr".into()),
            tool_calls: vec![],
            finish_reason: FinishReason::Stop,
            variation_seed: 77,
            cut_stream: false,
        };
        assert_eq!(events(&meta(), &c, None), events(&meta(), &c, None));
        let mut other = c.clone();
        other.variation_seed = 78;
        assert_ne!(events(&meta(), &c, None), events(&meta(), &other, None));
    }
}
