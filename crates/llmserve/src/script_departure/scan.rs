//! Scanning text for what a step relies on: facts (numbers, file names, accented names) and
//! tables shown without their header.

/// A fact a step relies on: something it can only know from what it was sent.
#[derive(Debug, Clone, PartialEq)]
pub enum Fact {
    /// A number of two digits or more, as written (`2980`, `14.5`, `1,204`).
    Number(String),
    /// A word with a non-ASCII letter (`Zoë`): copied, never typed from memory.
    Accented(String),
    /// A file name with an extension (`harrowmere/lighthouse.md`).
    File(String),
}

impl Fact {
    pub fn text(&self) -> &str {
        match self {
            Fact::Number(s) | Fact::Accented(s) | Fact::File(s) => s,
        }
    }
}

/// The facts in `text`, in order, without repeats (the digits of a file name belong to that
/// file's fact, not to numbers of their own).
pub fn facts(text: &str) -> Vec<Fact> {
    let mut out: Vec<Fact> = Vec::new();
    let mut push = |f: Fact| {
        if !out.contains(&f) {
            out.push(f);
        }
    };
    let mut without_files = text.to_owned();
    for token in tokens(text) {
        if is_file(token) {
            push(Fact::File(token.to_owned()));
            without_files = without_files.replace(token, " ");
        } else if !token.is_ascii() && token.chars().any(char::is_alphabetic) {
            push(Fact::Accented(token.to_owned()));
        }
    }
    for number in numbers(&without_files) {
        if number.chars().filter(char::is_ascii_digit).count() >= 2 {
            push(Fact::Number(number.to_owned()));
        }
    }
    out
}

/// Runs of letters, digits, combining marks and `_./-`.
pub(super) fn tokens(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| !(c.is_alphanumeric() || is_mark(c) || matches!(c, '_' | '.' | '/' | '-')))
        .map(|t| t.trim_matches(|c| matches!(c, '.' | '-' | '/')))
        .filter(|t| !t.is_empty())
}

/// Combining diacritical marks (U+0300–U+036F), which NFD text carries after its letters.
pub(super) fn is_mark(c: char) -> bool {
    ('\u{300}'..='\u{36f}').contains(&c)
}

pub(super) fn is_file(token: &str) -> bool {
    const EXTENSIONS: &[&str] = &[
        "md", "txt", "csv", "json", "py", "toml", "yaml", "yml", "cfg", "ini",
    ];
    token.rsplit_once('.').is_some_and(|(stem, ext)| {
        !stem.is_empty() && stem.chars().any(char::is_alphabetic) && EXTENSIONS.contains(&ext)
    })
}

/// Numbers as written: digits with `,` or `.` between digit groups, and an optional sign.
pub(super) fn numbers(text: &str) -> Vec<&str> {
    let bytes = text.as_bytes();
    let digit = |k: usize| bytes.get(k).is_some_and(u8::is_ascii_digit);
    // `,` separates thousands only before exactly three digits (`2,980`, not `2020,2980`).
    let separator = |k: usize| match bytes[k] {
        b'.' => digit(k + 1),
        b',' => (1..=3).all(|d| digit(k + d)) && !digit(k + 4),
        _ => false,
    };
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let glued = i > 0 && (is_word_byte(bytes[i - 1]) || bytes[i - 1].is_ascii_digit());
        if bytes[i].is_ascii_digit() && !glued {
            // A sign only where the `-` is not a hyphen inside a word (`telemetry-351`).
            let signed = i > 0
                && bytes[i - 1] == b'-'
                && (i < 2 || !(is_word_byte(bytes[i - 2]) || bytes[i - 2].is_ascii_digit()));
            let start = if signed { i - 1 } else { i };
            let mut j = i;
            while j < bytes.len() && (bytes[j].is_ascii_digit() || separator(j)) {
                j += 1;
            }
            if j >= bytes.len() || !is_word_byte(bytes[j]) {
                out.push(&text[start..j]);
            }
            i = j;
        } else {
            i += 1;
        }
    }
    out
}

pub(super) fn is_word_byte(b: u8) -> bool {
    b.is_ascii_alphabetic() || b == b'_' || b >= 0x80
}

/// A number's value and its decimals; `1,204` is 1204 (a thousands separator), `2,5` is 2.5.
pub(super) fn value(number: &str) -> Option<(f64, usize)> {
    let thousands = number.split(',').skip(1).all(|group| {
        group
            .split('.')
            .next()
            .is_some_and(|digits| digits.len() == 3)
    });
    let plain = if thousands {
        number.replace(',', "")
    } else {
        number.replacen(',', ".", 1)
    };
    let decimals = plain.split_once('.').map_or(0, |(_, d)| d.len());
    plain.parse::<f64>().ok().map(|v| (v, decimals))
}

/// A table in a tool observation whose rows carry no header line: consecutive lines split by
/// the same delimiter into the same number (≥ 2) of fields, the first of which already holds a
/// number (a header names its columns).
#[derive(Debug, Clone, PartialEq)]
pub struct HeaderlessTable {
    pub rows: Vec<Vec<String>>,
}

pub(super) fn headerless_tables(text: &str) -> Vec<HeaderlessTable> {
    let mut out = Vec::new();
    for delimiter in ['\t', ','] {
        let mut block: Vec<Vec<String>> = Vec::new();
        let mut flush = |block: &mut Vec<Vec<String>>| {
            let rows = std::mem::take(block);
            if rows.len() >= 2 && rows[0].iter().any(|f| value(f).is_some()) {
                out.push(HeaderlessTable { rows });
            }
        };
        for line in text.lines() {
            let fields: Vec<String> = line.split(delimiter).map(|f| f.trim().to_owned()).collect();
            let row = fields.len() >= 2 && fields.iter().all(|f| !f.is_empty());
            if !(row
                && block
                    .first()
                    .is_none_or(|first| first.len() == fields.len()))
            {
                flush(&mut block);
            }
            if row {
                block.push(fields);
            }
        }
        flush(&mut block);
    }
    out
}
