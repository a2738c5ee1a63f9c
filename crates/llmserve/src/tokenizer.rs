//! The approximate tokenizer used for usage, `max_tokens` and the context window.
//!
//! Real BPE vocabularies are not available offline, and agents must be able to reproduce the
//! count with a few lines of standard-library Python, so the rule is deliberately simple
//! (documented in `agents/CONTRACT.md`):
//!
//! - a maximal run of alphanumeric characters (Unicode, `_` included) costs
//!   `ceil(chars / 4)` tokens;
//! - every other non-whitespace character costs 1 token;
//! - whitespace is free.
//!
//! A prompt costs 3 tokens per message, plus the tokens of its role, content, name,
//! tool-call names and arguments and `tool_call_id`, plus 3 tokens priming the reply, plus
//! the tokens of the compact JSON of `tools` when tools are offered.

use serde_json::Value;

use crate::api::ChatRequest;

/// Tokens charged per message for the chat format's framing.
pub const TOKENS_PER_MESSAGE: usize = 3;
/// Tokens charged once per prompt for priming the reply.
pub const REPLY_PRIMING: usize = 3;

fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// One token-bearing piece of text: its byte range and its cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Piece {
    start: usize,
    end: usize,
    tokens: usize,
    word: bool,
}

fn pieces(text: &str) -> Vec<Piece> {
    let mut out = Vec::new();
    let mut chars = text.char_indices().peekable();
    while let Some((start, c)) = chars.next() {
        if c.is_whitespace() {
            continue;
        }
        if is_word(c) {
            let mut end = start + c.len_utf8();
            let mut count: usize = 1;
            while let Some(&(i, d)) = chars.peek() {
                if !is_word(d) {
                    break;
                }
                end = i + d.len_utf8();
                count += 1;
                chars.next();
            }
            out.push(Piece {
                start,
                end,
                tokens: count.div_ceil(4),
                word: true,
            });
        } else {
            out.push(Piece {
                start,
                end: start + c.len_utf8(),
                tokens: 1,
                word: false,
            });
        }
    }
    out
}

/// The approximate number of tokens in `text`.
pub fn count(text: &str) -> usize {
    pieces(text).iter().map(|p| p.tokens).sum()
}

/// `text` cut to at most `limit` tokens (cutting inside a word run at a 4-character
/// boundary), and whether anything was cut.
pub fn truncate(text: &str, limit: usize) -> (&str, bool) {
    let mut used = 0;
    let mut prev_end = 0;
    for piece in pieces(text) {
        if used + piece.tokens <= limit {
            used += piece.tokens;
            prev_end = piece.end;
            continue;
        }
        let remaining = limit - used;
        let cut = if piece.word && remaining > 0 {
            text[piece.start..]
                .char_indices()
                .nth(remaining * 4)
                .map_or(piece.end, |(i, _)| piece.start + i)
        } else {
            prev_end
        };
        return (&text[..cut], true);
    }
    (text, false)
}

/// The prompt tokens of a request (messages, framing and tool definitions).
pub fn prompt_tokens(request: &ChatRequest) -> usize {
    let mut total = REPLY_PRIMING;
    for message in &request.messages {
        total += TOKENS_PER_MESSAGE + count(&message.role) + count(&message.text());
        if let Some(name) = &message.name {
            total += count(name);
        }
        if let Some(id) = &message.tool_call_id {
            total += count(id);
        }
        for call in message.tool_calls.iter().flatten() {
            if let Some(name) = call.pointer("/function/name").and_then(Value::as_str) {
                total += count(name);
            }
            if let Some(args) = call.pointer("/function/arguments").and_then(Value::as_str) {
                total += count(args);
            }
        }
    }
    if let Some(tools) = &request.tools {
        if !tools.is_empty() {
            total += count(&Value::Array(tools.clone()).to_string());
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_words_punctuation_and_whitespace() {
        assert_eq!(count(""), 0);
        assert_eq!(count("   \n\t"), 0);
        assert_eq!(count("cat"), 1);
        assert_eq!(count("cats"), 1);
        assert_eq!(count("catsz"), 2);
        assert_eq!(count("hello, world!"), 2 + 1 + 2 + 1);
        assert_eq!(count("{\"a\":1}"), 7);
        // Non-ASCII letters are word characters, counted per character, not per byte.
        assert_eq!(count("Zürich"), 2);
        assert_eq!(count("日本語です"), 2);
        assert_eq!(count("snake_case_name"), 4);
    }

    #[test]
    fn truncate_keeps_whole_budget() {
        assert_eq!(truncate("hello world", 10), ("hello world", false));
        assert_eq!(truncate("hello world", 2), ("hello", true));
        // "abcdefghij" costs 3 tokens; one token keeps 4 characters.
        assert_eq!(truncate("abcdefghij", 1), ("abcd", true));
        assert_eq!(truncate("a, b", 1), ("a", true));
        assert_eq!(truncate("a, b", 0), ("", true));
        let (cut, _) = truncate("Zürich Zürich", 2);
        assert_eq!(cut, "Zürich");
        for limit in 0..12 {
            let (cut, _) = truncate("The answer is {\"x\": [1, 2, 3]} ok", limit);
            assert!(count(cut) <= limit);
        }
    }
}
