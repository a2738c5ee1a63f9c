//! The `bash` tool's language: one pipeline of allowlisted programs joined by `|`, parsed here
//! (quotes and escapes as in POSIX sh) and never handed to a shell. Everything that would make
//! a shell do more than run those programs — redirection, command substitution, variables,
//! `;`, `&&`, `||`, background jobs, globs, newlines — is refused with the byte offset and a
//! reason, so a policy learns the rule from the observation.
//!
//! This is the first of two layers: the sandbox ([`crate::sandbox`]) assumes a parsed pipeline
//! may still try anything its programs can do (awk's `system()`, sed's `e`/`w`) and contains it.

use std::fmt;

/// Programs the Detector may run, in the order the prompt lists them.
pub const ALLOWED_PROGRAMS: &[&str] = &[
    "jq", "grep", "awk", "sed", "sort", "uniq", "head", "tail", "wc", "cut", "tr", "cat", "nl",
    "paste",
];

/// Longest pipeline text accepted, in bytes.
pub const MAX_PIPELINE_BYTES: usize = 8_192;
/// Most programs in one pipeline.
pub const MAX_STAGES: usize = 8;
/// Most arguments of one program.
pub const MAX_ARGS: usize = 64;

/// One program of a pipeline with its arguments, quotes removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stage {
    pub program: String,
    pub args: Vec<String>,
}

/// A parsed pipeline: at least one stage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pipeline {
    pub stages: Vec<Stage>,
}

/// Why a pipeline was refused, with the byte offset into the text the policy wrote.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct PipelineError {
    pub offset: usize,
    pub reason: String,
}

impl fmt::Display for PipelineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "refused at byte {}: {}", self.offset, self.reason)
    }
}

fn refuse<T>(offset: usize, reason: impl Into<String>) -> Result<T, PipelineError> {
    Err(PipelineError {
        offset,
        reason: reason.into(),
    })
}

enum Token {
    Word { text: String, offset: usize },
    Pipe { offset: usize },
}

/// Parses and checks a pipeline: syntax first, then the allowlist and per-program rules.
pub fn parse(text: &str) -> Result<Pipeline, PipelineError> {
    if text.len() > MAX_PIPELINE_BYTES {
        return refuse(
            MAX_PIPELINE_BYTES,
            format!(
                "the pipeline is {} bytes long (at most {MAX_PIPELINE_BYTES})",
                text.len()
            ),
        );
    }
    let tokens = tokenize(text)?;
    let mut stages: Vec<(usize, Vec<(String, usize)>)> = vec![(0, Vec::new())];
    for token in tokens {
        match token {
            Token::Word { text, offset } => {
                let stage = stages.last_mut().expect("at least one stage");
                if stage.1.is_empty() {
                    stage.0 = offset;
                }
                stage.1.push((text, offset));
            }
            Token::Pipe { offset } => {
                if stages.last().is_some_and(|s| s.1.is_empty()) {
                    return refuse(offset, "`|` with no command before it");
                }
                stages.push((offset + 1, Vec::new()));
            }
        }
    }
    if stages.len() == 1 && stages[0].1.is_empty() {
        return refuse(0, "the pipeline is empty; write e.g. `jq -c 'select(.status.code == \"ERROR\")' spans.jsonl | head`");
    }
    if let Some(last) = stages.last() {
        if last.1.is_empty() {
            return refuse(text.len(), "`|` with no command after it");
        }
    }
    if stages.len() > MAX_STAGES {
        return refuse(
            stages[MAX_STAGES].0,
            format!(
                "{} programs in one pipeline (at most {MAX_STAGES})",
                stages.len()
            ),
        );
    }
    let mut checked = Vec::with_capacity(stages.len());
    for (offset, words) in stages {
        checked.push(check_stage(offset, words)?);
    }
    Ok(Pipeline { stages: checked })
}

/// Splits into words and pipes, removing quotes; refuses every other shell operator.
fn tokenize(text: &str) -> Result<Vec<Token>, PipelineError> {
    let bytes = text.as_bytes();
    let mut tokens = Vec::new();
    let mut word = String::new();
    let mut word_start: Option<usize> = None;
    let mut chars = text.char_indices().peekable();
    macro_rules! end_word {
        () => {
            if let Some(start) = word_start.take() {
                tokens.push(Token::Word {
                    text: std::mem::take(&mut word),
                    offset: start,
                });
            }
        };
    }
    while let Some((i, c)) = chars.next() {
        let at_word_start = word_start.is_none();
        match c {
            ' ' | '\t' => end_word!(),
            '\n' | '\r' => return refuse(i, "a newline would start a second command; write one pipeline on one line"),
            '|' => {
                if bytes.get(i + 1) == Some(&b'|') {
                    return refuse(i, "`||` (run on failure) is not allowed; only `|` joins programs");
                }
                if bytes.get(i + 1) == Some(&b'&') {
                    return refuse(i, "`|&` is not allowed; only `|` joins programs (stderr is shown anyway)");
                }
                end_word!();
                tokens.push(Token::Pipe { offset: i });
            }
            '&' => {
                let what = if bytes.get(i + 1) == Some(&b'&') { "`&&` (run on success)" } else { "`&` (background job)" };
                return refuse(i, format!("{what} is not allowed; write one pipeline"));
            }
            ';' => return refuse(i, "`;` would start a second command; write one pipeline"),
            '>' | '<' => {
                return refuse(i, format!(
                    "redirection `{c}` is not allowed: programs read the episode files named as arguments and write only to the tool's output"
                ))
            }
            '`' => return refuse(i, "command substitution (backticks) is not allowed"),
            '$' => {
                if bytes.get(i + 1) == Some(&b'(') {
                    return refuse(i, "command substitution `$(` is not allowed");
                }
                return refuse(i, "`$` outside single quotes would expand a variable; put jq and awk programs in single quotes");
            }
            '(' | ')' => return refuse(i, format!("`{c}` (subshell or grouping) is not allowed; quote it if it is part of a pattern")),
            '{' | '}' => {
                return refuse(i, format!("unquoted `{c}` (brace expansion or grouping) is not allowed; put programs in single quotes"))
            }
            '*' | '?' | '[' | ']' => {
                return refuse(i, format!(
                    "unquoted `{c}` is a glob, and globs are not expanded; name the files (trace.json, spans.jsonl) and quote patterns"
                ))
            }
            '~' if at_word_start => return refuse(i, "`~` (home directory) is not expanded; the episode files are in the working directory"),
            '#' if at_word_start => return refuse(i, "`#` would start a comment; quote it if it is part of a pattern"),
            '!' if at_word_start => return refuse(i, "`!` (negation or history) is not allowed; quote it if it is part of a pattern"),
            '\\' => {
                word_start.get_or_insert(i);
                match chars.next() {
                    None => return refuse(i, "a trailing backslash escapes nothing"),
                    Some((j, '\n')) => return refuse(j, "a backslash-newline would continue onto a second line; write one line"),
                    Some((_, escaped)) => word.push(escaped),
                }
            }
            '\'' => {
                word_start.get_or_insert(i);
                loop {
                    match chars.next() {
                        None => return refuse(i, "unterminated single quote (opened here)"),
                        Some((_, '\'')) => break,
                        Some((j, '\n')) => return refuse(j, "a newline inside quotes; write one pipeline on one line (use \\n inside jq/awk/sed programs)"),
                        Some((_, other)) => word.push(other),
                    }
                }
            }
            '"' => {
                word_start.get_or_insert(i);
                loop {
                    match chars.next() {
                        None => return refuse(i, "unterminated double quote (opened here)"),
                        Some((_, '"')) => break,
                        Some((j, '\n')) => return refuse(j, "a newline inside quotes; write one pipeline on one line"),
                        Some((j, '`')) => return refuse(j, "backticks inside double quotes are command substitution; use single quotes"),
                        Some((j, '$')) => {
                            let next = bytes.get(j + 1).copied();
                            if next.is_some_and(|b| b == b'(' || b == b'{' || b == b'_' || b.is_ascii_alphanumeric() || b"@*#?$!-".contains(&b)) {
                                return refuse(j, "`$` inside double quotes would expand; put jq and awk programs in single quotes");
                            }
                            word.push('$');
                        }
                        Some((_, '\\')) => match chars.peek().copied() {
                            Some((_, e @ ('"' | '\\' | '$' | '`'))) => {
                                chars.next();
                                word.push(e);
                            }
                            _ => word.push('\\'),
                        },
                        Some((_, other)) => word.push(other),
                    }
                }
            }
            other => {
                word_start.get_or_insert(i);
                word.push(other);
            }
        }
    }
    end_word!();
    Ok(tokens)
}

/// The allowlist and per-program rules. Refusals here are conveniences (clear messages early);
/// the sandbox would contain each of these anyway.
fn check_stage(offset: usize, words: Vec<(String, usize)>) -> Result<Stage, PipelineError> {
    let mut words = words.into_iter();
    let (program, _) = words.next().expect("stages are non-empty");
    if program.contains('=') {
        return refuse(
            offset,
            format!("`{program}`: environment assignments are not allowed"),
        );
    }
    if program.contains('/') {
        return refuse(
            offset,
            format!("`{program}`: name the program (e.g. `jq`), not a path"),
        );
    }
    if !ALLOWED_PROGRAMS.contains(&program.as_str()) {
        return refuse(
            offset,
            format!(
                "`{program}` is not an allowed program; allowed: {}",
                ALLOWED_PROGRAMS.join(" ")
            ),
        );
    }
    let args: Vec<(String, usize)> = words.collect();
    if args.len() > MAX_ARGS {
        return refuse(
            args[MAX_ARGS].1,
            format!(
                "{program} has {} arguments (at most {MAX_ARGS})",
                args.len()
            ),
        );
    }
    let mut options_done = false;
    for (arg, at) in &args {
        if arg.contains('\0') {
            return refuse(*at, "NUL bytes cannot be passed to a program");
        }
        if arg == "--" {
            options_done = true;
        }
        if options_done || !arg.starts_with('-') {
            continue;
        }
        match program.as_str() {
            "sed" if is_sed_in_place(arg) => {
                return refuse(*at, "`sed -i` edits files in place; the episode files are read-only (print the result instead)")
            }
            "sort" if arg.starts_with("--compress-program") || arg.starts_with("--compress-prog") => {
                return refuse(*at, "`sort --compress-program` runs another program; it is not allowed")
            }
            "awk" if arg.starts_with("--load") || arg == "-l" || arg.starts_with("--exec") || arg == "-E" => {
                return refuse(*at, format!("`awk {arg}` loads extensions or a program file; put the program inline in single quotes"))
            }
            _ => {}
        }
    }
    Ok(Stage {
        program,
        args: args.into_iter().map(|(a, _)| a).collect(),
    })
}

/// `-i`, `-iSUFFIX`, `--in-place…`, or a cluster of sed's short flags containing `i`.
fn is_sed_in_place(arg: &str) -> bool {
    if arg.starts_with("--in-place") || arg.starts_with("-i") {
        return true;
    }
    !arg.starts_with("--")
        && arg.len() > 1
        && arg[1..].chars().all(|c| "nrsuzEi".contains(c))
        && arg.contains('i')
}

/// Renders a pipeline back as shell text with every argument single-quoted (for transcripts
/// and the unsandboxed reference in the benchmark).
pub fn render(pipeline: &Pipeline) -> String {
    pipeline
        .stages
        .iter()
        .map(|s| {
            std::iter::once(s.program.clone())
                .chain(
                    s.args
                        .iter()
                        .map(|a| format!("'{}'", a.replace('\'', "'\\''"))),
                )
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect::<Vec<_>>()
        .join(" | ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stages(text: &str) -> Vec<Vec<String>> {
        parse(text)
            .unwrap()
            .stages
            .into_iter()
            .map(|s| std::iter::once(s.program).chain(s.args).collect())
            .collect()
    }

    #[test]
    fn parses_quotes_escapes_and_pipes() {
        assert_eq!(
            stages(r#"jq -r '.name | ascii_downcase' spans.jsonl | sort | uniq -c"#),
            vec![
                vec!["jq", "-r", ".name | ascii_downcase", "spans.jsonl"],
                vec!["sort"],
                vec!["uniq", "-c"]
            ]
        );
        assert_eq!(
            stages(r#"grep -c "a\"b" x"#),
            vec![vec!["grep", "-c", "a\"b", "x"]]
        );
        assert_eq!(stages(r"grep a\ b x"), vec![vec!["grep", "a b", "x"]]);
        assert_eq!(stages(r#"grep 'it''s' x"#), vec![vec!["grep", "its", "x"]]);
        assert_eq!(
            stages(r#"grep "cost: 5$" x"#),
            vec![vec!["grep", "cost: 5$", "x"]]
        );
        assert_eq!(stages("grep '' x"), vec![vec!["grep", "", "x"]]);
    }

    #[test]
    fn refuses_shell_operators_with_offsets() {
        for (text, offset, needle) in [
            ("cat x > y", 6, "redirection"),
            ("cat x; ls", 5, "`;`"),
            ("cat x && ls", 6, "`&&`"),
            ("cat x || ls", 6, "`||`"),
            ("cat x &", 6, "background"),
            ("cat $(ls)", 4, "`$(`"),
            ("cat `ls`", 4, "backticks"),
            ("cat *.jsonl", 4, "glob"),
            ("cat x\nls", 5, "newline"),
            ("cat \"$HOME\"", 5, "double quotes"),
            ("cat 'x", 4, "unterminated"),
            ("| cat", 0, "no command before"),
            ("cat |", 5, "no command after"),
            ("python3 -c 1", 0, "not an allowed program"),
            ("/bin/cat x", 0, "not a path"),
            ("sed -i s/a/b/ x", 4, "in place"),
            ("sed -ni p x", 4, "in place"),
            ("sort --compress-program=sh x", 5, "compress"),
        ] {
            let err = parse(text).unwrap_err();
            assert_eq!(err.offset, offset, "{text}: {err}");
            assert!(err.reason.contains(needle), "{text}: {err}");
        }
    }

    #[test]
    fn render_round_trips() {
        let p = parse(r#"jq -r '.a' spans.jsonl | grep "it's" | sort"#).unwrap();
        assert_eq!(parse(&render(&p)).unwrap(), p);
    }
}
