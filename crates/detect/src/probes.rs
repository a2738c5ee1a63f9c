//! The probe library: named, parameterised SQL measurements of one trace, each written so that
//! its rows *are* its digest.
//!
//! A small model reads a few hundred characters well and a wide table badly, and a cut at a
//! fixed character count (the old `observation_chars`) threw away whichever signal came last.
//! So every probe returns one column, `signal`, one short line per non-empty signal (`error
//! RecursionError on tool load_schema x3 …`, `flag refusal 2`), and leaves out zero counts and
//! empty groups in SQL. [`digest`] keeps every row of the observation; only a probe's own
//! `LIMIT` bounds it, and an observation that hit the tool's row limit says so.
//!
//! The probes are ordinary `sql:` calls through the Detector's guarded tool: a policy that runs
//! them leaves an honest transcript, and a user can run any of them with `pathfinder detect tool
//! --sql`. The library covers the expert's battery and more: shape, error groups, signature
//! flags, tool use and repetition, the LLM's token trajectory and request parameters, span
//! names, the last spans, hand-offs between agents, tool-argument validity, timing and code
//! locations.

use crate::episode::{Policy, View};
use crate::policies::quote;
use crate::sql::SqlTool;

/// One named measurement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probe {
    /// A short identifier (`errors`, `flags`, …), also the option a policy chooses.
    pub name: &'static str,
    /// What it measures, in a few words (shown to policies that choose probes).
    pub purpose: &'static str,
    /// The query, with `{T}` for the quoted trace id; returns one column, `signal`.
    sql: &'static str,
}

impl Probe {
    /// The `sql:` action that runs this probe on `trace_id`.
    pub fn call(&self, trace_id: &str) -> String {
        format!("sql: {}", self.sql.replace("{T}", &quote(trace_id)))
    }

    /// The query alone.
    pub fn query(&self, trace_id: &str) -> String {
        self.sql.replace("{T}", &quote(trace_id))
    }
}

/// Every probe, in the order the battery runs them.
pub const LIBRARY: &[Probe] = &[
    Probe {
        name: "shape",
        purpose: "size, errors, steps, outcome and span kinds",
        sql: "SELECT signal FROM (\
SELECT 0 AS o, 'trace spans ' || span_count || ' errors ' || error_count || ' steps ' || COALESCE(max_step, 0) || ' status ' || status || COALESCE(' outcome ' || outcome, '') || ' tokens in ' || input_tokens || ' out ' || output_tokens AS signal FROM traces WHERE trace_id = {T} \
UNION ALL SELECT 1, 'kind ' || kind || ' ' || COUNT(*) || CASE WHEN SUM(is_error) > 0 THEN ' failed ' || SUM(is_error) ELSE '' END FROM spans WHERE trace_id = {T} GROUP BY kind) ORDER BY o, signal",
    },
    Probe {
        name: "errors",
        purpose: "error groups: type, span, code, count, first step, message",
        sql: "SELECT 'error ' || COALESCE(error_type, '?') || ' on ' || kind || ' ' || name || COALESCE(' in ' || code_function, '') || ' x' || COUNT(*) || ' step ' || COALESCE(MIN(step), '?') || ': ' || substr(COALESCE(MAX(error_message), ''), 1, 90) AS signal \
FROM spans WHERE trace_id = {T} AND is_error = 1 GROUP BY error_type, kind, name ORDER BY MIN(seq) LIMIT 8",
    },
    Probe {
        name: "flags",
        purpose: "signature flags in errors, model replies and their token counts",
        sql: "SELECT 'flag ' || f || ' ' || n AS signal FROM (\
SELECT 'temperature' AS f, SUM(is_error AND error_message LIKE '%temperature%') AS n FROM spans WHERE trace_id = {T} \
UNION ALL SELECT 'tool_choice', SUM(is_error AND error_message LIKE '%tool_choice%') FROM spans WHERE trace_id = {T} \
UNION ALL SELECT 'response_format', SUM(is_error AND (error_message LIKE '%response_format%' OR error_message LIKE '%invalid schema%')) FROM spans WHERE trace_id = {T} \
UNION ALL SELECT 'recursion', SUM(error_type = 'RecursionError') FROM spans WHERE trace_id = {T} \
UNION ALL SELECT 'dict_mutation', SUM(error_message LIKE '%changed size during iteration%') FROM spans WHERE trace_id = {T} \
UNION ALL SELECT 'undecodable', SUM(error_type = 'UnicodeDecodeError') FROM spans WHERE trace_id = {T} \
UNION ALL SELECT 'context_overflow', SUM(is_error AND (error_message LIKE '%context length%' OR error_message LIKE '%context_length%')) FROM spans WHERE trace_id = {T} \
UNION ALL SELECT 'json_decode', SUM(error_type = 'JSONDecodeError') FROM spans WHERE trace_id = {T} \
UNION ALL SELECT 'enum_mismatch', SUM(is_error AND error_message LIKE '%is not one of%') FROM spans WHERE trace_id = {T} \
UNION ALL SELECT 'null_argument', SUM(is_error AND (error_message LIKE '%None is not of type%' OR error_message LIKE '%NoneType%')) FROM spans WHERE trace_id = {T} \
UNION ALL SELECT 'tool_call_id', SUM(is_error AND error_message LIKE '%tool_call_id%') FROM spans WHERE trace_id = {T} \
UNION ALL SELECT 'timeout', SUM(error_type IN ('TimeoutError', 'CancelledError')) FROM spans WHERE trace_id = {T} \
UNION ALL SELECT 'rate_limit', SUM(is_error AND (error_message LIKE '%429%' OR error_message LIKE '%rate limit%')) FROM spans WHERE trace_id = {T} \
UNION ALL SELECT 'refusal', SUM(kind = 'llm' AND (output LIKE '%not allowed to%' OR output LIKE '%would violate%' OR output LIKE '%under the rules%')) FROM spans WHERE trace_id = {T} \
UNION ALL SELECT 'fenced_reply', SUM(kind = 'llm' AND output LIKE '```%') FROM spans WHERE trace_id = {T} \
UNION ALL SELECT 'empty_reply', SUM(kind = 'llm' AND COALESCE(output, '') = '') FROM spans WHERE trace_id = {T} \
UNION ALL SELECT 'token_undercount', SUM(kind = 'llm' AND output_tokens >= 0 AND length(output) >= 40 AND output_tokens * 20 < length(output)) FROM spans WHERE trace_id = {T} \
UNION ALL SELECT 'retry_span', SUM(name LIKE '%retry%' OR name LIKE '%backoff%') FROM spans WHERE trace_id = {T} \
UNION ALL SELECT 'summarize_span', SUM(name LIKE '%summar%' OR name LIKE '%compress%' OR name LIKE '%truncat%') FROM spans WHERE trace_id = {T}\
) WHERE n > 0",
    },
    Probe {
        name: "tools",
        purpose: "tool calls, failures, longest runs and identical repeats",
        sql: "SELECT signal FROM (\
SELECT 0 AS o, calls AS k, 'tool ' || tool_name || ' calls ' || calls || CASE WHEN errors > 0 THEN ' failed ' || errors ELSE '' END || ' run ' || max_consecutive AS signal FROM trace_tools WHERE trace_id = {T} \
UNION ALL SELECT 1, n, 'repeat ' || tool_name || ' same arguments x' || n || CASE WHEN errs > 0 THEN ' failed ' || errs ELSE '' END FROM (\
SELECT tool_name, COUNT(*) AS n, SUM(is_error) AS errs FROM spans WHERE trace_id = {T} AND kind = 'tool' GROUP BY tool_name, tool_arguments HAVING COUNT(*) >= 2)\
) ORDER BY o, k DESC, signal LIMIT 10",
    },
    Probe {
        name: "llm",
        purpose: "LLM calls: token trajectory, repeated replies, request parameters",
        sql: "SELECT signal FROM (\
SELECT 0 AS o, 'llm calls ' || COUNT(*) || ' input tokens ' || COALESCE(MIN(input_tokens), 0) || '..' || COALESCE(MAX(input_tokens), 0) || ' drops ' || COALESCE(SUM(input_tokens < prev), 0) || ' distinct replies ' || COUNT(DISTINCT output) || ' max output tokens ' || COALESCE(MAX(output_tokens), 0) AS signal \
FROM (SELECT input_tokens, output_tokens, output, LAG(input_tokens) OVER (ORDER BY seq) AS prev FROM spans WHERE trace_id = {T} AND kind = 'llm') HAVING COUNT(*) > 0 \
UNION ALL SELECT 1, 'request ' || replace(key, 'gen_ai.', '') || ' ' || substr(CAST(value AS TEXT), 1, 40) || ' x' || COUNT(*) FROM spans, json_each(spans.attributes) \
WHERE trace_id = {T} AND kind = 'llm' AND (key LIKE 'gen_ai.request.%' OR key LIKE 'gen_ai.response.finish%') GROUP BY key, value\
) ORDER BY o, signal LIMIT 12",
    },
    Probe {
        name: "spans",
        purpose: "the most frequent span names by kind",
        sql: "SELECT 'span ' || kind || ' ' || name || ' x' || COUNT(*) || CASE WHEN SUM(is_error) > 0 THEN ' failed ' || SUM(is_error) ELSE '' END AS signal \
FROM spans WHERE trace_id = {T} GROUP BY kind, name ORDER BY COUNT(*) DESC, name LIMIT 12",
    },
    Probe {
        name: "last",
        purpose: "how the run ended: its last three spans",
        sql: "SELECT 'last ' || kind || ' ' || name || ' ' || status_code || COALESCE(' ' || error_type, '') AS signal \
FROM (SELECT kind, name, status_code, error_type, seq FROM spans WHERE trace_id = {T} AND parent_span_id IS NOT NULL ORDER BY seq DESC LIMIT 3) ORDER BY seq",
    },
    Probe {
        name: "handoffs",
        purpose: "agents involved and hand-offs between them",
        sql: "SELECT signal FROM (\
SELECT 0 AS o, 'agents ' || COUNT(DISTINCT agent_name) || ' handoffs ' || COALESCE(SUM(agent_name <> prev), 0) AS signal \
FROM (SELECT agent_name, LAG(agent_name) OVER (ORDER BY seq) AS prev FROM spans WHERE trace_id = {T} AND agent_name IS NOT NULL) HAVING COUNT(DISTINCT agent_name) > 0 \
UNION ALL SELECT 1, 'agent ' || agent_name || ' spans ' || COUNT(*) || ' llm ' || SUM(kind = 'llm') || ' tool ' || SUM(kind = 'tool') FROM spans WHERE trace_id = {T} AND agent_name IS NOT NULL GROUP BY agent_name\
) ORDER BY o, signal LIMIT 8",
    },
    Probe {
        name: "arguments",
        purpose: "tool-call arguments: unparseable, null, empty",
        sql: "SELECT 'arguments ' || f || ' ' || n AS signal FROM (\
SELECT 'unparseable' AS f, SUM(tool_arguments IS NOT NULL AND json_valid(tool_arguments) = 0) AS n FROM spans WHERE trace_id = {T} AND kind = 'tool' \
UNION ALL SELECT 'null_value', SUM(tool_arguments LIKE '%: null%' OR tool_arguments LIKE '%:null%') FROM spans WHERE trace_id = {T} AND kind = 'tool' \
UNION ALL SELECT 'empty', SUM(tool_arguments IN ('{}', '')) FROM spans WHERE trace_id = {T} AND kind = 'tool' \
UNION ALL SELECT 'distinct', COUNT(DISTINCT tool_arguments) FROM spans WHERE trace_id = {T} AND kind = 'tool'\
) WHERE n > 0",
    },
    // Durations by decade from 10 s, and nothing below: a span's duration under 10 s is the
    // machine's load as much as the agent's doing. Two runs of one deterministic agent differ in
    // every span's milliseconds, and with the Detector reading traces beside the agents 22% of
    // live traces had a span of 100 ms or more against 5% of the corpus's (BENCHMARKS.md,
    // "Live traces that cover the templates"), a shift between what the Detector trains on and
    // what it is evaluated on. A hang or a timeout lasts 10 s or more.
    Probe {
        name: "timing",
        purpose: "the slowest span names (10 s or longer, by decade)",
        sql: "SELECT 'slow ' || kind || ' ' || name || ' ' || CASE \
WHEN MAX(duration_ns) >= 100000000000 THEN '100s+' ELSE '10s+' END AS signal \
FROM spans WHERE trace_id = {T} AND parent_span_id IS NOT NULL AND duration_ns IS NOT NULL GROUP BY kind, name \
HAVING MAX(duration_ns) >= 10000000000 \
ORDER BY (MAX(duration_ns) >= 100000000000) DESC, kind, name LIMIT 3",
    },
    Probe {
        name: "code",
        purpose: "code locations the spans were emitted from",
        sql: "SELECT 'code ' || code_function || ' ' || kind || ' x' || COUNT(*) || CASE WHEN SUM(is_error) > 0 THEN ' failed ' || SUM(is_error) ELSE '' END AS signal \
FROM spans WHERE trace_id = {T} AND code_function IS NOT NULL GROUP BY code_function, kind ORDER BY SUM(is_error) DESC, COUNT(*) DESC, code_function LIMIT 10",
    },
];

/// Turns an investigation by the whole battery takes: one per probe, then the answer.
pub fn battery_turns() -> usize {
    LIBRARY.len() + 1
}

/// The probe called `name`.
pub fn by_name(name: &str) -> Option<&'static Probe> {
    LIBRARY.iter().find(|p| p.name == name)
}

/// The digest of a probe's observation: every signal row, without the table's header and row
/// count. An observation that is not a `signal` table (a refusal, an error) is kept whole, and
/// a table that hit the tool's row limit keeps the tool's note saying so.
pub fn digest(observation: &str) -> String {
    let mut lines = observation.lines();
    match lines.next() {
        Some(h) if h.trim() == "signal" => {}
        _ => return observation.trim_end().to_owned(),
    }
    let mut out = Vec::new();
    for line in lines {
        let t = line.trim();
        if t.is_empty() {
            continue;
        }
        // The tool's closing line: "(N rows)" is implied by the rows, "more rows exist" is not.
        if t.starts_with('(') && t.ends_with(')') && t.contains("row") {
            if t.contains("more rows") {
                out.push(t.to_owned());
            }
            continue;
        }
        out.push(t.to_owned());
    }
    if out.is_empty() {
        "none".into()
    } else {
        out.join("\n")
    }
}

/// Splits a digest into the lowercase word tokens a bag-of-words reader uses, with numbers
/// replaced by their order of magnitude (`#0`, `#1`, `#2`, … for 0, 1–9, 10–99, …) so that
/// counts generalise across traces of different length.
pub fn tokens(digest: &str) -> Vec<String> {
    digest
        .split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
        .map(|w| {
            if w.chars().all(|c| c.is_ascii_digit()) {
                let trimmed = w.trim_start_matches('0');
                format!("#{}", trimmed.len().min(9))
            } else {
                w.to_lowercase()
            }
        })
        .collect()
}

/// One probe's name and the digest of its observation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeResult {
    pub probe: &'static str,
    pub digest: String,
}

/// Runs every probe of the library on `trace_id` through `sql`, as the battery policy does in
/// an episode (the same queries and the same digests), without an episode around it: training
/// sets are built this way.
pub fn run_battery(sql: &SqlTool, trace_id: &str) -> Vec<ProbeResult> {
    LIBRARY
        .iter()
        .map(|p| ProbeResult {
            probe: p.name,
            digest: match sql.run(&p.query(trace_id)) {
                Ok(obs) => digest(&obs),
                Err(e) => e.to_string(),
            },
        })
        .collect()
}

/// The battery's digests as one text, a `[name]` line before each probe's signals: what a
/// model reads before it decides.
pub fn battery_text(results: &[ProbeResult]) -> String {
    let mut out = String::new();
    for r in results {
        out.push('[');
        out.push_str(r.probe);
        out.push_str("]\n");
        out.push_str(&r.digest);
        out.push('\n');
    }
    out
}

/// The battery's digests as lines of tokens (see [`tokens`]), each line's first token its
/// probe's name, for a bag-of-words reader.
pub fn battery_lines(results: &[ProbeResult]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for r in results {
        for line in r.digest.lines() {
            let mut t = vec![r.probe.to_string()];
            t.extend(tokens(line));
            out.push(t);
        }
    }
    out
}

/// Decides from a finished battery: returns the `answer:` line (or any final text).
pub type Decide = Box<dyn FnMut(&[ProbeResult]) -> Result<String, String> + Send>;

/// A policy that runs the whole probe library in order, one `sql:` call a turn, then answers
/// with whatever `decide` makes of the digests. The classifier reference and the learned
/// Detector's whole-choice decision both investigate this way, so their transcripts are real
/// tool calls a person can replay.
pub struct BatteryPolicy {
    name: String,
    decide: Decide,
    results: Vec<ProbeResult>,
}

impl BatteryPolicy {
    pub fn new(name: impl Into<String>, decide: Decide) -> BatteryPolicy {
        BatteryPolicy {
            name: name.into(),
            decide,
            results: Vec::new(),
        }
    }
}

impl Policy for BatteryPolicy {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn act(&mut self, view: &View<'_>) -> Result<String, String> {
        // The observation of the probe asked last turn.
        if self.results.len() < view.turns.len() {
            if let (Some(last), Some(probe)) = (view.turns.last(), LIBRARY.get(self.results.len()))
            {
                self.results.push(ProbeResult {
                    probe: probe.name,
                    digest: digest(&last.observation.text),
                });
            }
        }
        match LIBRARY.get(self.results.len()) {
            Some(p) if view.turns_left > 1 => Ok(p.call(view.trace_id)),
            _ => (self.decide)(&self.results).map(|answer| locate(&answer, &self.results)),
        }
    }

    fn subagent(&self, _task: &str) -> Result<Box<dyn Policy>, String> {
        Err("the probe battery does not delegate".into())
    }
}

/// The function the failing spans came from, as the `code` probe reads it (failing locations
/// first, the most failures first): framework-neutral localisation, for traces whose spans map
/// onto no component of ours. `None` when no span with a code location failed.
pub fn failing_function(results: &[ProbeResult]) -> Option<String> {
    let code = results.iter().find(|r| r.probe == "code")?;
    code.digest.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        (words.next() == Some("code") && line.contains(" failed "))
            .then(|| words.next().map(str::to_owned))
            .flatten()
    })
}

/// `answer` with ` @at :FUNCTION` added before its evidence when it names a deficiency, says
/// nowhere in the code, and a failing span's function is known.
fn locate(answer: &str, results: &[ProbeResult]) -> String {
    let Some(at) = answer.rfind("answer:") else {
        return answer.to_owned();
    };
    let (before, line) = answer.split_at(at);
    let Some((head, evidence)) = line.split_once('|') else {
        return answer.to_owned();
    };
    let first = head["answer:".len()..]
        .split_whitespace()
        .next()
        .unwrap_or("");
    if first.eq_ignore_ascii_case(taxonomy::NONE) || head.contains("@at") {
        return answer.to_owned();
    }
    match failing_function(results) {
        Some(function) => format!("{before}{} @at :{function} |{evidence}", head.trim_end()),
        None => answer.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_located_at_the_failing_function() {
        let results = vec![ProbeResult {
            probe: "code",
            digest: "code read_file tool x1 failed 1\ncode search tool x2".into(),
        }];
        assert_eq!(failing_function(&results).as_deref(), Some("read_file"));
        assert_eq!(
            locate("answer: P24 parsing.encoding | digests", &results),
            "answer: P24 parsing.encoding @at :read_file | digests"
        );
        assert_eq!(
            locate("answer: none | digests", &results),
            "answer: none | digests"
        );
        let quiet = vec![ProbeResult {
            probe: "code",
            digest: "code search tool x2".into(),
        }];
        assert_eq!(
            locate("answer: P27 tools.execution | d", &quiet),
            "answer: P27 tools.execution | d"
        );
    }

    #[test]
    fn a_digest_keeps_every_signal_row_and_the_row_limit_note() {
        let obs = "signal\nerror X on tool t x3 step 2: boom\nflag refusal 2\n(2 rows)\n";
        assert_eq!(
            digest(obs),
            "error X on tool t x3 step 2: boom\nflag refusal 2"
        );
        let obs =
            "signal\na\n(200 rows shown; more rows exist: aggregate, filter or add LIMIT/OFFSET)\n";
        assert!(digest(obs).ends_with("more rows exist: aggregate, filter or add LIMIT/OFFSET)"));
        assert_eq!(digest("signal\n(0 rows)\n"), "none");
        assert_eq!(digest("refused: no"), "refused: no");
    }

    #[test]
    fn tokens_bucket_numbers_by_magnitude() {
        assert_eq!(
            tokens("llm calls 12 input tokens 0..4000"),
            vec!["llm", "calls", "#2", "input", "tokens", "#0", "#4"]
        );
    }

    #[test]
    fn probe_names_are_unique() {
        let mut names: Vec<_> = LIBRARY.iter().map(|p| p.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), LIBRARY.len());
    }
}
