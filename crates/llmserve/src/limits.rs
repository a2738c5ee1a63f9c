//! What the server does to every completion after the backend: `stop` sequences, the
//! `max_tokens` budget (`finish_reason: "length"`) and the completion's token count.

use crate::api::{ChatRequest, Completion, FinishReason};
use crate::tokenizer;

/// Applies `stop` and the completion budget; returns the completion tokens.
pub fn apply(request: &ChatRequest, completion: &mut Completion) -> usize {
    if let Some(content) = &mut completion.content {
        let stops = request.stop_sequences();
        if let Some(cut) = stops
            .iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| content.find(s.as_str()))
            .min()
        {
            content.truncate(cut);
        }
    }
    let Some(limit) = request.completion_limit() else {
        return cost(completion);
    };
    let mut budget = limit;
    let mut cut_anything = false;
    if let Some(content) = &mut completion.content {
        let (kept, cut) = tokenizer::truncate(content, budget);
        budget -= tokenizer::count(kept);
        if cut {
            *content = kept.to_owned();
            cut_anything = true;
            completion.tool_calls.clear();
        }
    }
    let mut kept_calls = Vec::new();
    for mut call in std::mem::take(&mut completion.tool_calls) {
        let name = tokenizer::count(&call.name);
        if name > budget {
            cut_anything = true;
            break;
        }
        budget -= name;
        let (args, cut) = tokenizer::truncate(&call.arguments, budget);
        budget -= tokenizer::count(args);
        if cut {
            call.arguments = args.to_owned();
            kept_calls.push(call);
            cut_anything = true;
            break;
        }
        kept_calls.push(call);
    }
    completion.tool_calls = kept_calls;
    if cut_anything {
        completion.finish_reason = FinishReason::Length;
    }
    cost(completion)
}

/// The completion tokens of content, tool names and arguments.
pub fn cost(completion: &Completion) -> usize {
    completion.content.as_deref().map_or(0, tokenizer::count)
        + completion
            .tool_calls
            .iter()
            .map(|c| tokenizer::count(&c.name) + tokenizer::count(&c.arguments))
            .sum::<usize>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ToolCallOut;

    fn request(extra: &str) -> ChatRequest {
        ChatRequest::parse(
            format!(r#"{{"model":"m","messages":[{{"role":"user","content":"q"}}]{extra}}}"#)
                .as_bytes(),
        )
        .unwrap()
    }

    fn completion(content: Option<&str>, args: Option<&str>) -> Completion {
        Completion {
            content: content.map(str::to_owned),
            tool_calls: args
                .map(|a| ToolCallOut {
                    id: "call_1".into(),
                    name: "search".into(),
                    arguments: a.into(),
                })
                .into_iter()
                .collect(),
            finish_reason: if args.is_some() {
                FinishReason::ToolCalls
            } else {
                FinishReason::Stop
            },
            variation_seed: 0,
            cut_stream: false,
        }
    }

    #[test]
    fn max_tokens_cuts_content_with_length() {
        let mut c = completion(Some("one two three four five"), None);
        let used = apply(&request(r#","max_tokens":2"#), &mut c);
        assert_eq!(c.content.as_deref(), Some("one two"));
        assert_eq!(c.finish_reason, FinishReason::Length);
        assert_eq!(used, 2);
    }

    #[test]
    fn max_tokens_cuts_tool_arguments() {
        let mut c = completion(None, Some(r#"{"query": "population of Lyon"}"#));
        apply(&request(r#","max_tokens":5"#), &mut c);
        assert_eq!(c.finish_reason, FinishReason::Length);
        assert!(serde_json::from_str::<serde_json::Value>(&c.tool_calls[0].arguments).is_err());
    }

    #[test]
    fn within_budget_nothing_changes() {
        let mut c = completion(Some("short"), None);
        let before = c.clone();
        assert_eq!(apply(&request(r#","max_tokens":50"#), &mut c), 2);
        assert_eq!(c, before);
    }

    #[test]
    fn stop_sequences_cut_before_the_match() {
        let mut c = completion(Some("answer: 4\nObservation: x"), None);
        apply(&request(r#","stop":["Observation:"]"#), &mut c);
        assert_eq!(c.content.as_deref(), Some("answer: 4\n"));
        assert_eq!(c.finish_reason, FinishReason::Stop);
    }
}
