//! The text format of a Detector turn: what every policy (a 135M-parameter model included)
//! writes, and its parser. Kept small on purpose:
//!
//! ```text
//! optional reasoning, any number of lines
//! TOOL: ARGUMENT
//! ```
//!
//! Exactly one line starts with a tool name and a colon (case does not matter; a Markdown code
//! fence around the call is ignored). The tools:
//!
//! | call | argument |
//! |---|---|
//! | `sql: SELECT …` | one SQLite SELECT; may continue on the following lines |
//! | `bash: jq … spans.jsonl \| sort` | one pipeline, one line |
//! | `history: QUESTION` or `history 10m: QUESTION` | earlier questions and answers (window `30s`, `10m`, `2h`, `all`; default all) |
//! | `delegate: TASK` | a subagent investigation; more tasks on following lines starting with `- ` run concurrently |
//! | `answer: P16 tools.schema \| EVIDENCE` | the verdict: deficiency id, component, evidence |
//! | `answer: agent NAME step N \| EVIDENCE` | for chat-log traces: the responsible agent and step |
//!
//! A subagent ends with `answer: SUMMARY` (free text for the main agent). Every malformed turn
//! gets an error observation naming the line and the fix; nothing here panics.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Tool names in the order the prompt lists them.
pub const TOOLS: &[&str] = &["sql", "bash", "history", "delegate", "answer"];
/// Most subagents one `delegate` call may start.
pub const MAX_DELEGATE_TASKS: usize = 4;

/// One parsed tool call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "tool", rename_all = "lowercase")]
pub enum Action {
    Sql {
        query: String,
    },
    Bash {
        pipeline: String,
    },
    History {
        question: String,
        /// `None`: the whole investigation (and run, when shared).
        #[serde(default, with = "opt_secs")]
        window: Option<Duration>,
    },
    Delegate {
        tasks: Vec<String>,
    },
    /// The raw answer text; [`parse_verdict`] reads it for a main agent, a subagent's is its
    /// summary.
    Answer {
        text: String,
    },
}

impl Action {
    pub fn tool(&self) -> &'static str {
        match self {
            Action::Sql { .. } => "sql",
            Action::Bash { .. } => "bash",
            Action::History { .. } => "history",
            Action::Delegate { .. } => "delegate",
            Action::Answer { .. } => "answer",
        }
    }

    /// The call as the policy would write it (canonical form).
    pub fn render(&self) -> String {
        match self {
            Action::Sql { query } => format!("sql: {query}"),
            Action::Bash { pipeline } => format!("bash: {pipeline}"),
            Action::History {
                question,
                window: None,
            } => format!("history: {question}"),
            Action::History {
                question,
                window: Some(w),
            } => format!("history {}: {question}", render_window(*w)),
            Action::Delegate { tasks } if tasks.len() == 1 => format!("delegate: {}", tasks[0]),
            Action::Delegate { tasks } => {
                let mut s = "delegate:".to_string();
                for t in tasks {
                    s.push_str("\n- ");
                    s.push_str(t);
                }
                s
            }
            Action::Answer { text } => format!("answer: {text}"),
        }
    }
}

/// A turn: the free text before the call, and the call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Turn {
    pub thought: String,
    pub action: Action,
}

/// A malformed turn, located by line (1-based) in the policy's text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ActionError {
    pub line: usize,
    pub reason: String,
}

impl fmt::Display for ActionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "malformed call (line {}): {}", self.line, self.reason)
    }
}

fn err<T>(line: usize, reason: impl Into<String>) -> Result<T, ActionError> {
    Err(ActionError {
        line,
        reason: reason.into(),
    })
}

/// A call's head: the tool, the window text, where the argument starts.
type Head<'a> = (&'static str, Option<&'a str>, usize);

/// `TOOL[ WINDOW]:` at the start of a line: the tool, the window text, the argument's start.
fn call_head(line: &str) -> Option<Head<'_>> {
    let trimmed = line.trim_start();
    let indent = line.len() - trimmed.len();
    let colon = trimmed.find(':')?;
    let head = &trimmed[..colon];
    let mut parts = head.split_whitespace();
    let name = parts.next()?;
    let tool = TOOLS.iter().find(|t| t.eq_ignore_ascii_case(name))?;
    let window = match (parts.next(), parts.next()) {
        (None, _) => None,
        (Some(w), None) if *tool == "history" => Some(w),
        _ => return None,
    };
    Some((tool, window, indent + colon + 1))
}

/// Parses one turn of policy text.
pub fn parse(text: &str) -> Result<Turn, ActionError> {
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("```"))
        .collect();
    let heads: Vec<(usize, Head<'_>)> = lines
        .iter()
        .enumerate()
        .filter_map(|(i, l)| call_head(l).map(|h| (i, h)))
        .collect();
    let Some(&(first, (tool, window, start))) = heads.first() else {
        return err(
            1,
            "no tool call found; start a line with `sql:`, `bash:`, `history:`, `delegate:` or `answer:`",
        );
    };
    if let Some(&(second, (other, ..))) = heads.get(1) {
        return err(
            second + 1,
            format!(
                "one tool call per turn: `{tool}:` on line {} and `{other}:` on line {}",
                first + 1,
                second + 1
            ),
        );
    }
    let thought = lines[..first].join("\n").trim().to_string();
    let head_arg = lines[first][start..].trim();
    let rest: Vec<(usize, &str)> = lines[first + 1..]
        .iter()
        .enumerate()
        .map(|(i, l)| (first + 2 + i, *l))
        .filter(|(_, l)| !l.trim().is_empty())
        .collect();
    let line_no = first + 1;
    let action = match tool {
        "sql" => {
            let mut query = head_arg.to_string();
            for (_, l) in &rest {
                query.push('\n');
                query.push_str(l);
            }
            let query = query.trim().to_string();
            if query.is_empty() {
                return err(line_no, "`sql:` needs a query, e.g. `sql: SELECT kind, COUNT(*) FROM spans GROUP BY kind`");
            }
            Action::Sql { query }
        }
        "bash" => {
            if let Some((n, _)) = rest.first() {
                return err(
                    *n,
                    "a bash pipeline is one line; the call continues on another line",
                );
            }
            if head_arg.is_empty() {
                return err(line_no, "`bash:` needs a pipeline, e.g. `bash: jq -r .name spans.jsonl | sort | uniq -c`");
            }
            Action::Bash {
                pipeline: head_arg.to_string(),
            }
        }
        "history" => {
            if let Some((n, _)) = rest.first() {
                return err(*n, "a history question is one line");
            }
            if head_arg.is_empty() {
                return err(
                    line_no,
                    "`history:` needs a question, e.g. `history: error rate by tool`",
                );
            }
            let window = match window {
                None => None,
                Some(w) => match parse_window(w) {
                    Ok(w) => w,
                    Err(reason) => return err(line_no, reason),
                },
            };
            Action::History {
                question: head_arg.to_string(),
                window,
            }
        }
        "delegate" => {
            let mut tasks: Vec<String> = Vec::new();
            if !head_arg.is_empty() {
                tasks.push(head_arg.to_string());
            }
            for (_, l) in &rest {
                let l = l.trim();
                match l.strip_prefix("- ").or_else(|| l.strip_prefix("* ")) {
                    Some(task) => tasks.push(task.trim().to_string()),
                    None => match tasks.last_mut() {
                        Some(last) => {
                            last.push(' ');
                            last.push_str(l);
                        }
                        None => tasks.push(l.to_string()),
                    },
                }
            }
            tasks.retain(|t| !t.is_empty());
            if tasks.is_empty() {
                return err(line_no, "`delegate:` needs a task, e.g. `delegate: explain the errors of the search tool`");
            }
            if tasks.len() > MAX_DELEGATE_TASKS {
                return err(
                    line_no,
                    format!(
                        "{} tasks in one call (at most {MAX_DELEGATE_TASKS})",
                        tasks.len()
                    ),
                );
            }
            Action::Delegate { tasks }
        }
        "answer" => {
            let mut text = head_arg.to_string();
            for (_, l) in &rest {
                text.push(' ');
                text.push_str(l.trim());
            }
            if text.trim().is_empty() {
                return err(line_no, "`answer:` needs a verdict, e.g. `answer: P16 tools.schema | RecursionError at startup`");
            }
            Action::Answer {
                text: text.trim().to_string(),
            }
        }
        _ => unreachable!("TOOLS covers every name"),
    };
    Ok(Turn { thought, action })
}

/// `30s`, `10m`, `2h`, `all` (= no window).
pub fn parse_window(text: &str) -> Result<Option<Duration>, String> {
    let t = text
        .trim_matches(|c| c == '(' || c == ')')
        .to_ascii_lowercase();
    if t == "all" {
        return Ok(None);
    }
    let (digits, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len()));
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("window `{text}`: write e.g. `30s`, `10m`, `2h` or `all`"))?;
    let secs = match unit {
        "s" | "" => n,
        "m" => n * 60,
        "h" => n * 3600,
        _ => return Err(format!("window `{text}`: unit must be s, m or h")),
    };
    Ok(Some(Duration::from_secs(secs)))
}

fn render_window(w: Duration) -> String {
    let s = w.as_secs();
    if s % 3600 == 0 && s > 0 {
        format!("{}h", s / 3600)
    } else if s % 60 == 0 && s > 0 {
        format!("{}m", s / 60)
    } else {
        format!("{s}s")
    }
}

/// What a main agent concluded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Verdict {
    /// A taxonomy deficiency at a component, optionally at the agent step where it first
    /// shows (`answer: P11 llm_client.request @step 3 | …`).
    Deficiency {
        deficiency_id: String,
        component: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        step: Option<i64>,
        /// The code the deficiency lives in, as far as the trace shows it (`@at FILE:FUNCTION`,
        /// either side may be empty): the level a framework without a component mapping allows.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        location: Option<CodeLocation>,
        evidence: String,
    },
    /// Chat-log traces: the agent and step responsible.
    Blame {
        agent: String,
        step: i64,
        evidence: String,
    },
}

impl Verdict {
    /// A deficiency at a component, with no step or code location named.
    pub fn deficiency(
        deficiency_id: impl Into<String>,
        component: impl Into<String>,
        evidence: impl Into<String>,
    ) -> Verdict {
        Verdict::Deficiency {
            deficiency_id: deficiency_id.into(),
            component: component.into(),
            step: None,
            location: None,
            evidence: evidence.into(),
        }
    }

    /// The named taxonomy id (`none` for a healthy answer); `None` for blame.
    pub fn deficiency_id(&self) -> Option<&str> {
        match self {
            Verdict::Deficiency { deficiency_id, .. } => Some(deficiency_id),
            Verdict::Blame { .. } => None,
        }
    }

    /// The named component; `None` for blame.
    pub fn component(&self) -> Option<&str> {
        match self {
            Verdict::Deficiency { component, .. } => Some(component),
            Verdict::Blame { .. } => None,
        }
    }

    /// The step the answer points at, if it names one.
    pub fn step(&self) -> Option<i64> {
        match self {
            Verdict::Deficiency { step, .. } => *step,
            Verdict::Blame { step, .. } => Some(*step),
        }
    }

    /// The code the answer points at, if it names any.
    pub fn location(&self) -> Option<&CodeLocation> {
        match self {
            Verdict::Deficiency { location, .. } => location.as_ref(),
            Verdict::Blame { .. } => None,
        }
    }

    /// The agent a blame answer names.
    pub fn blamed_agent(&self) -> Option<&str> {
        match self {
            Verdict::Blame { agent, .. } => Some(agent),
            Verdict::Deficiency { .. } => None,
        }
    }

    /// Canonical `answer:` text.
    pub fn render(&self) -> String {
        match self {
            Verdict::Deficiency {
                deficiency_id,
                component,
                step,
                location,
                evidence,
            } => {
                let step = step.map_or(String::new(), |s| format!(" @step {s}"));
                let at = location
                    .as_ref()
                    .map_or(String::new(), |l| format!(" @at {}", l.render()));
                format!("answer: {deficiency_id} {component}{step}{at} | {evidence}")
            }
            Verdict::Blame {
                agent,
                step,
                evidence,
            } => format!("answer: agent {agent} step {step} | {evidence}"),
        }
    }
}

/// Reads a main agent's answer text and checks ids against the catalog.
pub fn parse_verdict(text: &str, catalog: &taxonomy::Catalog) -> Result<Verdict, String> {
    let (head, evidence) = match text.split_once('|') {
        Some((h, e)) => (h.trim(), e.trim().to_string()),
        None => (text.trim(), String::new()),
    };
    if evidence.is_empty() {
        return Err(
            "add the evidence after a `|`: `answer: P16 tools.schema | what the queries showed`"
                .into(),
        );
    }
    let words: Vec<&str> = head.split_whitespace().collect();
    if words
        .first()
        .is_some_and(|w| w.eq_ignore_ascii_case("agent"))
    {
        return match words.as_slice() {
            [_, agent, step_kw, step] if step_kw.eq_ignore_ascii_case("step") => {
                let step = step
                    .parse::<i64>()
                    .map_err(|_| format!("step `{step}` is not a whole number"))?;
                Ok(Verdict::Blame {
                    agent: agent.to_string(),
                    step,
                    evidence,
                })
            }
            _ => Err("write `answer: agent NAME step N | evidence`".into()),
        };
    }
    // A healthy trace: `answer: none | …` (a component after it, if any, must be `none` too).
    if words
        .first()
        .is_some_and(|w| w.eq_ignore_ascii_case(taxonomy::NONE))
    {
        return match words.as_slice() {
            [_] => Ok(()),
            [_, c] if c.eq_ignore_ascii_case(taxonomy::NONE) => Ok(()),
            _ => Err(format!(
                "a healthy trace is answered `answer: {0} | evidence`; got {1} word(s) before `|`",
                taxonomy::NONE,
                words.len()
            )),
        }
        .map(|()| Verdict::deficiency(taxonomy::NONE, taxonomy::NONE, evidence));
    }
    const FORM: &str = "write `answer: ID COMPONENT | evidence`, optionally with `@step N` and `@at FILE:FUNCTION` before the `|` (e.g. `answer: P16 tools.schema @step 3 @at app/tools.py:lookup | …`)";
    let (id, component, rest) = match words.as_slice() {
        [id, component, rest @ ..] => (id, component, rest),
        _ => return Err(format!("{FORM}; got {} word(s) before `|`", words.len())),
    };
    let (mut step, mut location) = (None, None);
    for pair in rest.chunks(2) {
        match pair {
            [at, n] if at.eq_ignore_ascii_case("@step") && step.is_none() => {
                step = Some(
                    n.parse::<i64>()
                        .ok()
                        .filter(|s| *s >= 0)
                        .ok_or_else(|| format!("step `{n}` is not a whole number of 0 or more"))?,
                );
            }
            [at, loc] if at.eq_ignore_ascii_case("@at") && location.is_none() => {
                location = Some(CodeLocation::parse(loc).ok_or_else(|| {
                    format!("`@at {loc}`: write FILE:FUNCTION, FILE or :FUNCTION")
                })?);
            }
            _ => return Err(format!("{FORM}; could not read `{}`", pair.join(" "))),
        }
    }
    let deficiency = catalog
        .get(id)
        .ok_or_else(|| format!("unknown deficiency id `{id}`; ids are P1–P27 and C1–C23"))?;
    if catalog.component(component).is_none() {
        return Err(format!(
            "unknown component `{component}`; {} usually sits in {}",
            deficiency.id,
            deficiency.components.join(", ")
        ));
    }
    Ok(Verdict::Deficiency {
        deficiency_id: deficiency.id.clone(),
        component: component.to_string(),
        step,
        location,
        evidence,
    })
}

/// Where in the code an answer says the deficiency lives.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CodeLocation {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function: Option<String>,
}

impl CodeLocation {
    /// `FILE:FUNCTION`, `FILE` or `:FUNCTION`; `None` when both are empty.
    pub fn parse(text: &str) -> Option<CodeLocation> {
        let (file, function) = match text.rsplit_once(':') {
            Some((f, g)) => (f, g),
            None => (text, ""),
        };
        let some = |s: &str| (!s.is_empty()).then(|| s.to_owned());
        let location = CodeLocation {
            file: some(file),
            function: some(function),
        };
        (location.file.is_some() || location.function.is_some()).then_some(location)
    }

    pub fn render(&self) -> String {
        match (&self.file, &self.function) {
            (Some(f), Some(g)) => format!("{f}:{g}"),
            (Some(f), None) => f.clone(),
            (None, Some(g)) => format!(":{g}"),
            (None, None) => String::new(),
        }
    }
}

mod opt_secs {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(value: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(d) => s.serialize_some(&d.as_secs()),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        Ok(Option::<u64>::deserialize(d)?.map(Duration::from_secs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_each_tool() {
        let t = parse("The errors first.\nsql: SELECT kind\nFROM spans").unwrap();
        assert_eq!(t.thought, "The errors first.");
        assert_eq!(
            t.action,
            Action::Sql {
                query: "SELECT kind\nFROM spans".into()
            }
        );
        assert_eq!(
            parse("BASH: cat spans.jsonl | wc -l").unwrap().action,
            Action::Bash {
                pipeline: "cat spans.jsonl | wc -l".into()
            }
        );
        assert_eq!(
            parse("history 10m: error rate").unwrap().action,
            Action::History {
                question: "error rate".into(),
                window: Some(Duration::from_secs(600))
            }
        );
        assert_eq!(
            parse("delegate: a\n- b\n- c").unwrap().action,
            Action::Delegate {
                tasks: vec!["a".into(), "b".into(), "c".into()]
            }
        );
        assert_eq!(
            parse("```\nanswer: P1 x | y\n```").unwrap().action,
            Action::Answer {
                text: "P1 x | y".into()
            }
        );
    }

    #[test]
    fn malformed_turns_name_the_line() {
        for (text, line, needle) in [
            ("hello", 1, "no tool call"),
            ("sql: SELECT 1\nbash: cat x", 2, "one tool call per turn"),
            ("bash: cat x\n| wc", 2, "one line"),
            ("sql:", 1, "needs a query"),
            ("history 5y: x", 1, "unit"),
            ("delegate:", 1, "needs a task"),
        ] {
            let e = parse(text).unwrap_err();
            assert_eq!(e.line, line, "{text}: {e}");
            assert!(e.reason.contains(needle), "{text}: {e}");
        }
    }

    #[test]
    fn actions_render_back_to_themselves() {
        for text in [
            "sql: SELECT 1",
            "bash: cat x | wc -l",
            "history 2h: q",
            "history: q",
            "delegate:\n- a\n- b",
            "answer: P1 x | y",
        ] {
            assert_eq!(parse(text).unwrap().action.render(), text);
        }
    }

    #[test]
    fn verdicts_are_checked_against_the_catalog() {
        let catalog = taxonomy::Catalog::embedded().unwrap();
        assert_eq!(
            parse_verdict("p16 tools.schema | RecursionError", &catalog).unwrap(),
            Verdict::Deficiency {
                deficiency_id: "P16".into(),
                component: "tools.schema".into(),
                step: None,
                location: None,
                evidence: "RecursionError".into()
            }
        );
        // Where it shows, and the text that says so read back the same.
        let at = parse_verdict("P16 tools.schema @step 3 | first failing call", &catalog).unwrap();
        assert_eq!(
            at,
            Verdict::Deficiency {
                deficiency_id: "P16".into(),
                component: "tools.schema".into(),
                step: Some(3),
                location: None,
                evidence: "first failing call".into()
            }
        );
        assert_eq!(
            at.render(),
            "answer: P16 tools.schema @step 3 | first failing call"
        );
        assert!(parse_verdict("P16 tools.schema @step -1 | x", &catalog)
            .unwrap_err()
            .contains("-1"));
        assert!(parse_verdict("P16 tools.schema @stage 3 | x", &catalog).is_err());
        // Where in the code: FILE:FUNCTION, either side alone, in either order with the step.
        let located = parse_verdict(
            "P24 parsing.encoding @at app/tools.py:read_file @step 2 | x",
            &catalog,
        )
        .unwrap();
        let Verdict::Deficiency { step, location, .. } = &located else {
            panic!("{located:?}")
        };
        assert_eq!(*step, Some(2));
        assert_eq!(
            location,
            &Some(CodeLocation {
                file: Some("app/tools.py".into()),
                function: Some("read_file".into())
            })
        );
        assert_eq!(
            located.render(),
            "answer: P24 parsing.encoding @step 2 @at app/tools.py:read_file | x"
        );
        let function_only = parse_verdict("P24 parsing.encoding @at :read_file | x", &catalog);
        assert!(matches!(
            function_only,
            Ok(Verdict::Deficiency {
                location: Some(CodeLocation {
                    file: None,
                    function: Some(_)
                }),
                ..
            })
        ));
        assert!(parse_verdict("P24 parsing.encoding @at : | x", &catalog).is_err());
        assert!(parse_verdict("P24 parsing.encoding @step 1 @step 2 | x", &catalog).is_err());
        assert!(parse_verdict("P24 parsing.encoding @at | x", &catalog).is_err());
        assert_eq!(
            parse_verdict("agent WebSurfer step 12 | wrong page", &catalog).unwrap(),
            Verdict::Blame {
                agent: "WebSurfer".into(),
                step: 12,
                evidence: "wrong page".into()
            }
        );
        assert!(parse_verdict("P99 tools.schema | x", &catalog)
            .unwrap_err()
            .contains("unknown deficiency"));
        assert!(parse_verdict("P16 tools.nope | x", &catalog)
            .unwrap_err()
            .contains("tools.schema"));
        assert!(parse_verdict("P16 tools.schema", &catalog)
            .unwrap_err()
            .contains("evidence"));
    }
}
