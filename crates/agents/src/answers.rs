//! Answers as people write them: a number with separators and signs (`1,234.5`, `$12`, `45%`),
//! text with quotes, case and spacing that do not change it. Both the judge (comparing an
//! answer with the expected one) and the task loader (checking that a numeric task's expected
//! answer is a number) read answers this way.

/// A number written as people write them: `1,234.5`, `$12`, `45%`, ` -3 `.
pub fn parse_number(text: &str) -> Option<f64> {
    let cleaned: String = normalise_text(text)
        .chars()
        .filter(|c| !matches!(c, ',' | '$' | '%' | '€' | '£' | ' ' | '_'))
        .collect();
    if cleaned.is_empty() {
        return None;
    }
    cleaned.parse::<f64>().ok().filter(|v| v.is_finite())
}

/// Lowercased, whitespace collapsed, without surrounding quotes or a trailing full stop.
pub fn normalise_text(text: &str) -> String {
    let mut s = text.trim();
    loop {
        let before = s;
        for (open, close) in [("\"", "\""), ("'", "'"), ("`", "`"), ("“", "”"), ("*", "*")] {
            if s.len() >= open.len() + close.len() && s.starts_with(open) && s.ends_with(close) {
                s = s[open.len()..s.len() - close.len()].trim();
            }
        }
        s = s.strip_suffix('.').unwrap_or(s).trim();
        if s == before {
            break;
        }
    }
    s.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .to_lowercase()
}
