//! Clipping long text and redacting secrets before text reaches a prompt or the store.

use std::sync::LazyLock;

use regex::Regex;

/// The marker that replaces a redacted secret.
pub const REDACTED: &str = "[REDACTED]";

/// Secrets that must never reach a prompt: API keys, bearer tokens, credentials in
/// `key=value` form, e-mail addresses.
static SECRET_PATTERNS: LazyLock<Vec<Regex>> = LazyLock::new(|| {
    [
        // Authorization headers and bearer tokens.
        r"(?i)\bbearer\s+[A-Za-z0-9\-._~+/]{8,}=*",
        // Provider keys: OpenAI/Anthropic (sk-…), GitHub (ghp_…), Slack (xox?-…), AWS, Google.
        r"\bsk-[A-Za-z0-9_\-]{16,}",
        r"\bgh[pousr]_[A-Za-z0-9]{20,}",
        r"\bxox[abprs]-[A-Za-z0-9\-]{10,}",
        r"\bAKIA[0-9A-Z]{16}\b",
        r"\bAIza[0-9A-Za-z_\-]{35}\b",
        // key = value credentials, quoted or not: api_key=..., "password": "...".
        r#"(?i)\b(api[_\-]?key|access[_\-]?token|auth[_\-]?token|secret|password|passwd)\b["']?\s*[:=]\s*["']?[^\s"',;}]{4,}"#,
        // E-mail addresses.
        r"\b[A-Za-z0-9._%+\-]+@[A-Za-z0-9\-]+(\.[A-Za-z0-9\-]+)*\.[A-Za-z]{2,}\b",
    ]
    .iter()
    .map(|p| Regex::new(p).expect("secret pattern is a valid regex"))
    .collect()
});

/// Replaces every secret in `text` with [`REDACTED`].
pub fn redact_secrets(text: &str) -> String {
    let mut out = text.to_string();
    for pattern in SECRET_PATTERNS.iter() {
        if pattern.is_match(&out) {
            out = pattern.replace_all(&out, REDACTED).into_owned();
        }
    }
    out
}

/// The longest prefix of `text` of at most `max_bytes` bytes that ends on a char boundary.
pub fn prefix_at_boundary(text: &str, max_bytes: usize) -> &str {
    if text.len() <= max_bytes {
        return text;
    }
    let mut end = max_bytes;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// `text` cut to at most `max_chars` characters, with a note of how much was dropped.
pub fn clip_chars(text: &str, max_chars: usize) -> String {
    let total = text.chars().count();
    if total <= max_chars {
        return text.to_string();
    }
    let kept: String = text.chars().take(max_chars).collect();
    format!("{kept}…[+{} chars]", total - max_chars)
}

/// Text for a prompt: secrets redacted first (so a clipped secret cannot leak its prefix),
/// then clipped, with newlines shown as `\n` so one value stays on one line.
pub fn prompt_safe(text: &str, max_chars: usize) -> String {
    clip_chars(&redact_secrets(text), max_chars)
        .replace('\r', "\\r")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_keys_tokens_and_emails() {
        let text = "Authorization: Bearer abcdefghijklmnop123 key sk-proj-ABCDEFGHIJKLMNOPQRST \
                    mail ada@example.org api_key=\"s3cr3t-value\" ghp_abcdefghijklmnopqrstuvwxyz";
        let out = redact_secrets(text);
        for secret in [
            "abcdefghijklmnop123",
            "sk-proj",
            "ada@example.org",
            "s3cr3t",
            "ghp_",
        ] {
            assert!(!out.contains(secret), "{secret} leaked in {out}");
        }
        assert!(out.contains(REDACTED));
        assert_eq!(
            redact_secrets("plain words, 42 steps"),
            "plain words, 42 steps"
        );
    }

    #[test]
    fn clipping_respects_char_boundaries() {
        assert_eq!(prefix_at_boundary("héllo", 2), "h");
        assert_eq!(clip_chars("abcdef", 3), "abc…[+3 chars]");
        assert_eq!(clip_chars("abc", 3), "abc");
        assert_eq!(prompt_safe("a\nb", 10), "a\\nb");
    }
}
