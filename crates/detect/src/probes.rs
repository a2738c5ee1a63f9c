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

use crate::action::{CodeLocation, Verdict};
use crate::investigation::{Policy, View};
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
    /// Whether a learned reader may read its digest. Every feature probe reads the `events`
    /// view and words of its own; a probe that names the code (`code`) serves localisation
    /// only, since function and module names identify a framework, not a mistake.
    pub feature: bool,
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
///
/// The feature probes read the store's framework-neutral `events` view (traces' SCHEMA.md) and
/// never print a span name, a service, a module path, a tool's or an agent's own name: tools
/// and agents are `tool1`, `agent2`, … in the order the run first used them, wrapper spans a
/// framework adds around the work (`workflow`, `other`) are not counted, agent turns are
/// counted only as hand-offs (a framework may open one per message), finish reasons are
/// named as the OpenAI API names them (`tool_calls`, `length`, `stop`, `content_filter`), an error is counted
/// once where it was raised (not again on each span it propagated through), and a span's
/// status is `ok` or `failed` (frameworks differ in setting `OK` or leaving it unset). Two
/// runs that do the same thing under different frameworks' names give the same digests.
pub const LIBRARY: &[Probe] = &[
    Probe {
        name: "shape",
        purpose: "outcome, errors, tokens and events by kind",
        sql: "SELECT signal FROM (\
SELECT 0 AS o, 'run ' || CASE WHEN SUM(parent_span_id IS NULL AND is_error = 1) > 0 THEN 'failed' ELSE 'ok' END || ' errors ' || SUM(is_error = 1 AND event NOT IN ('other', 'workflow')) || ' tokens in ' || COALESCE(SUM(CASE WHEN event = 'llm_call' THEN input_tokens END), 0) || ' out ' || COALESCE(SUM(CASE WHEN event = 'llm_call' THEN output_tokens END), 0) AS signal FROM events WHERE trace_id = {T} HAVING COUNT(*) > 0 \
UNION ALL SELECT 1, 'event ' || event || ' ' || COUNT(*) || CASE WHEN SUM(is_error) > 0 THEN ' failed ' || SUM(is_error) ELSE '' END FROM events WHERE trace_id = {T} AND event NOT IN ('other', 'workflow', 'agent_turn') GROUP BY event) ORDER BY o, signal",
        feature: true,
    },
    Probe {
        name: "errors",
        purpose: "errors where they were raised: family, type, event, count, message",
        sql: "WITH tl AS (SELECT tool, 'tool' || ROW_NUMBER() OVER (ORDER BY MIN(seq)) AS alias FROM events WHERE trace_id = {T} AND tool IS NOT NULL GROUP BY tool) \
SELECT 'error ' || COALESCE(error_family, 'unspecified') || ' ' || COALESCE(error_type, '?') || ' on ' || event || COALESCE(' ' || tl.alias, '') || ' x' || COUNT(*) || ': ' || substr(COALESCE(MAX(error_message), ''), 1, 90) AS signal \
FROM events e LEFT JOIN tl ON tl.tool = e.tool WHERE e.trace_id = {T} AND e.is_error = 1 \
AND NOT EXISTS (SELECT 1 FROM spans c WHERE c.trace_id = e.trace_id AND c.parent_span_id = e.span_id AND c.is_error = 1) \
GROUP BY error_family, error_type, event, tl.alias ORDER BY MIN(seq) LIMIT 8",
        feature: true,
    },
    Probe {
        name: "flags",
        purpose: "signature flags in errors, model replies and their token counts",
        sql: "SELECT 'flag ' || f || ' ' || n AS signal FROM (\
SELECT 'temperature' AS f, SUM(is_error AND error_message LIKE '%temperature%') AS n FROM events WHERE trace_id = {T} \
UNION ALL SELECT 'tool_choice', SUM(is_error AND error_message LIKE '%tool_choice%') FROM events WHERE trace_id = {T} \
UNION ALL SELECT 'response_format', SUM(is_error AND (error_message LIKE '%response_format%' OR error_message LIKE '%invalid schema%')) FROM events WHERE trace_id = {T} \
UNION ALL SELECT 'recursion', SUM(error_family = 'recursion') FROM events WHERE trace_id = {T} \
UNION ALL SELECT 'dict_mutation', SUM(error_message LIKE '%changed size during iteration%') FROM events WHERE trace_id = {T} \
UNION ALL SELECT 'undecodable', SUM(error_family = 'encoding') FROM events WHERE trace_id = {T} \
UNION ALL SELECT 'context_overflow', SUM(error_family = 'context_overflow') FROM events WHERE trace_id = {T} \
UNION ALL SELECT 'json_decode', SUM(error_type = 'JSONDecodeError') FROM events WHERE trace_id = {T} \
UNION ALL SELECT 'enum_mismatch', SUM(is_error AND error_message LIKE '%is not one of%') FROM events WHERE trace_id = {T} \
UNION ALL SELECT 'null_argument', SUM(is_error AND (error_message LIKE '%None is not of type%' OR error_message LIKE '%NoneType%')) FROM events WHERE trace_id = {T} \
UNION ALL SELECT 'tool_call_id', SUM(is_error AND error_message LIKE '%tool_call_id%') FROM events WHERE trace_id = {T} \
UNION ALL SELECT 'timeout', SUM(error_family = 'timeout') FROM events WHERE trace_id = {T} \
UNION ALL SELECT 'rate_limit', SUM(error_family = 'rate_limit') FROM events WHERE trace_id = {T} \
UNION ALL SELECT 'refusal', SUM(event = 'llm_call' AND (reply LIKE '%not allowed to%' OR reply LIKE '%would violate%' OR reply LIKE '%under the rules%')) FROM events WHERE trace_id = {T} \
UNION ALL SELECT 'fenced_reply', SUM(event = 'llm_call' AND reply LIKE '```%') FROM events WHERE trace_id = {T} \
UNION ALL SELECT 'empty_reply', SUM(event = 'llm_call' AND COALESCE(reply, '') = '') FROM events WHERE trace_id = {T} \
UNION ALL SELECT 'token_undercount', SUM(event = 'llm_call' AND output_tokens >= 0 AND length(reply) >= 40 AND output_tokens * 20 < length(reply)) FROM events WHERE trace_id = {T} \
UNION ALL SELECT 'retry_span', SUM(event = 'retry') FROM events WHERE trace_id = {T} \
UNION ALL SELECT 'summarize_span', SUM(name LIKE '%summar%' OR name LIKE '%compress%' OR name LIKE '%truncat%') FROM spans WHERE trace_id = {T}\
) WHERE n > 0",
        feature: true,
    },
    Probe {
        name: "tools",
        purpose: "tool calls, failures, longest runs and identical repeats",
        sql: "WITH tl AS (SELECT tool, 'tool' || ROW_NUMBER() OVER (ORDER BY MIN(seq)) AS alias FROM events WHERE trace_id = {T} AND tool IS NOT NULL GROUP BY tool) \
SELECT signal FROM (\
SELECT 0 AS o, calls AS k, 'tool ' || tl.alias || ' calls ' || calls || CASE WHEN errors > 0 THEN ' failed ' || errors ELSE '' END || ' run ' || max_consecutive AS signal FROM trace_tools JOIN tl ON tl.tool = trace_tools.tool_name WHERE trace_id = {T} \
UNION ALL SELECT 1, n, 'repeat ' || tl.alias || ' same arguments x' || n || CASE WHEN errs > 0 THEN ' failed ' || errs ELSE '' END FROM (\
SELECT tool, COUNT(*) AS n, SUM(is_error) AS errs FROM events WHERE trace_id = {T} AND event = 'tool_call' GROUP BY tool, arguments HAVING COUNT(*) >= 2) AS r JOIN tl ON tl.tool = r.tool\
) ORDER BY o, k DESC, signal LIMIT 10",
        feature: true,
    },
    Probe {
        name: "llm",
        purpose: "LLM calls: token trajectory, repeated replies, finish reasons",
        sql: "SELECT signal FROM (\
SELECT 0 AS o, 'llm calls ' || COUNT(*) || ' input tokens ' || COALESCE(MIN(input_tokens), 0) || '..' || COALESCE(MAX(input_tokens), 0) || ' drops ' || COALESCE(SUM(input_tokens < prev), 0) || ' distinct replies ' || COUNT(DISTINCT reply) || ' max output tokens ' || COALESCE(MAX(output_tokens), 0) AS signal \
FROM (SELECT input_tokens, output_tokens, reply, LAG(input_tokens) OVER (ORDER BY seq) AS prev FROM events WHERE trace_id = {T} AND event = 'llm_call') HAVING COUNT(*) > 0 \
UNION ALL SELECT 1, 'finish ' || reason || ' x' || COUNT(*) FROM (SELECT CASE \
WHEN raw LIKE '%tool%' OR raw LIKE '%function%' THEN 'tool_calls' \
WHEN raw IN ('length', 'max_tokens', 'max_output_tokens', 'model_length') THEN 'length' \
WHEN raw IN ('stop', 'end_turn', 'stop_sequence', 'eos', 'complete') THEN 'stop' \
WHEN raw LIKE '%filter%' OR raw LIKE '%safety%' THEN 'content_filter' ELSE raw END AS reason \
FROM (SELECT lower(substr(replace(replace(replace(CAST(value AS TEXT), '[', ''), ']', ''), '\"', ''), 1, 40)) AS raw FROM spans, json_each(spans.attributes) \
WHERE trace_id = {T} AND kind = 'llm' AND key IN ('gen_ai.response.finish_reasons', 'llm.finish_reason'))) GROUP BY reason\
) ORDER BY o, signal LIMIT 12",
        feature: true,
    },
    Probe {
        name: "sequence",
        purpose: "which event follows which, and how often",
        sql: "SELECT 'then ' || prev || ' ' || cur || ' x' || COUNT(*) AS signal FROM (\
SELECT event || CASE WHEN is_error = 1 THEN '_failed' ELSE '' END AS cur, LAG(event || CASE WHEN is_error = 1 THEN '_failed' ELSE '' END) OVER (ORDER BY seq) AS prev \
FROM events WHERE trace_id = {T} AND event NOT IN ('other', 'workflow', 'agent_turn')) WHERE prev IS NOT NULL \
GROUP BY prev, cur ORDER BY COUNT(*) DESC, signal LIMIT 12",
        feature: true,
    },
    Probe {
        name: "last",
        purpose: "how the run ended: its last three events",
        sql: "SELECT 'last ' || event || ' ' || CASE WHEN is_error = 1 THEN 'failed' ELSE 'ok' END || COALESCE(' ' || error_family, '') AS signal \
FROM (SELECT event, is_error, error_family, seq FROM events WHERE trace_id = {T} AND parent_span_id IS NOT NULL AND event NOT IN ('other', 'workflow') ORDER BY seq DESC LIMIT 3) ORDER BY seq",
        feature: true,
    },
    Probe {
        name: "handoffs",
        purpose: "agents involved and hand-offs between them",
        sql: "WITH RECURSIVE tree(span_id, agent) AS (\
SELECT span_id, agent FROM events WHERE trace_id = {T} AND parent_span_id IS NULL \
UNION ALL SELECT e.span_id, COALESCE(e.agent, tree.agent) FROM events e JOIN tree ON e.parent_span_id = tree.span_id WHERE e.trace_id = {T}), \
work AS (SELECT e.seq, e.event, tree.agent FROM events e JOIN tree ON tree.span_id = e.span_id WHERE e.trace_id = {T} AND e.event IN ('llm_call', 'tool_call', 'retrieval') AND tree.agent IS NOT NULL), \
al AS (SELECT agent, 'agent' || ROW_NUMBER() OVER (ORDER BY MIN(seq)) AS alias FROM work GROUP BY agent) \
SELECT signal FROM (\
SELECT 0 AS o, 'agents ' || COUNT(DISTINCT agent) || ' handoffs ' || COALESCE(SUM(agent <> prev), 0) AS signal \
FROM (SELECT agent, LAG(agent) OVER (ORDER BY seq) AS prev FROM work) HAVING COUNT(DISTINCT agent) > 0 \
UNION ALL SELECT 1, 'agent ' || al.alias || ' llm ' || SUM(event = 'llm_call') || ' tool ' || SUM(event = 'tool_call') FROM work JOIN al ON al.agent = work.agent GROUP BY al.alias\
) ORDER BY o, signal LIMIT 8",
        feature: true,
    },
    Probe {
        name: "arguments",
        purpose: "tool-call arguments: unparseable, null, empty",
        sql: "SELECT 'arguments ' || f || ' ' || n AS signal FROM (\
SELECT 'unparseable' AS f, SUM(arguments_valid = 0) AS n FROM events WHERE trace_id = {T} AND event = 'tool_call' \
UNION ALL SELECT 'null_value', SUM(arguments LIKE '%: null%' OR arguments LIKE '%:null%') FROM events WHERE trace_id = {T} AND event = 'tool_call' \
UNION ALL SELECT 'empty', SUM(arguments IN ('{}', '')) FROM events WHERE trace_id = {T} AND event = 'tool_call' \
UNION ALL SELECT 'distinct', COUNT(DISTINCT arguments) FROM events WHERE trace_id = {T} AND event = 'tool_call'\
) WHERE n > 0",
        feature: true,
    },
    // Durations by decade from 10 s, and nothing below: a span's duration under 10 s is the
    // machine's load as much as the agent's doing. Two runs of one deterministic agent differ in
    // every span's milliseconds, and with the Detector reading traces beside the agents 22% of
    // live traces had a span of 100 ms or more against 5% of the corpus's (BENCHMARKS.md,
    // "Live traces that cover the templates"), a shift between what the Detector trains on and
    // what it is evaluated on. A hang or a timeout lasts 10 s or more.
    Probe {
        name: "timing",
        purpose: "the slowest kinds of event (10 s or longer, by decade)",
        sql: "SELECT 'slow ' || event || ' ' || CASE \
WHEN MAX(duration_ns) >= 100000000000 THEN '100s+' ELSE '10s+' END AS signal \
FROM events WHERE trace_id = {T} AND parent_span_id IS NOT NULL AND duration_ns IS NOT NULL AND event NOT IN ('other', 'workflow') GROUP BY event \
HAVING MAX(duration_ns) >= 10000000000 \
ORDER BY (MAX(duration_ns) >= 100000000000) DESC, event LIMIT 3",
        feature: true,
    },
    Probe {
        name: "code",
        purpose: "code locations the spans were emitted from",
        sql: "SELECT 'code ' || code_function || ' ' || kind || ' x' || COUNT(*) || CASE WHEN SUM(is_error) > 0 THEN ' failed ' || SUM(is_error) ELSE '' END AS signal \
FROM spans WHERE trace_id = {T} AND code_function IS NOT NULL GROUP BY code_function, kind ORDER BY SUM(is_error) DESC, COUNT(*) DESC, code_function LIMIT 10",
        feature: false,
    },
];

/// Whether the probe called `name` is one a learned reader reads (see [`Probe::feature`]);
/// a result of a probe the library does not know is not.
pub fn is_feature(name: &str) -> bool {
    by_name(name).is_some_and(|p| p.feature)
}

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
        out.push(scrub(t).into_owned());
    }
    if out.is_empty() {
        "none".into()
    } else {
        out.join("\n")
    }
}

/// A digest line without the words that name a deployment rather than what happened: file
/// paths become `<path>`, a dotted module or class path keeps its last part
/// (`pydantic_ai.exceptions.UnexpectedModelBehavior` → `UnexpectedModelBehavior`), and hex
/// ids and UUIDs become `<id>`. Error messages quote such words, and a reader that learned them
/// would learn the framework.
pub fn scrub(line: &str) -> std::borrow::Cow<'_, str> {
    use regex::Regex;
    use std::sync::LazyLock;
    static PATH: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r#"(?:[A-Za-z]:)?[\w.~-]*(?:[/\\][\w.~-]+)+/?"#).expect("path pattern")
    });
    static DOTTED: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"\b(?:[A-Za-z_][A-Za-z0-9_]*\.)+([A-Za-z_][A-Za-z0-9_]*)\b")
            .expect("dotted pattern")
    });
    static ID: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"\b(?:[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}|(?:0x)?[0-9a-f]*[a-f][0-9a-f]*[0-9][0-9a-f]*|(?:0x)?[0-9a-f]*[0-9][0-9a-f]*[a-f][0-9a-f]*)\b")
            .expect("id pattern")
    });
    let needs = line.contains('/') || line.contains('\\') || line.contains('.') || line.len() >= 8;
    if !needs {
        return std::borrow::Cow::Borrowed(line);
    }
    let text = PATH.replace_all(line, "<path>");
    let text = DOTTED.replace_all(&text, "$1");
    let text = ID.replace_all(&text, |c: &regex::Captures<'_>| {
        // Only long runs are ids; a short hex-looking word (`be4`, `0xff`) is left alone.
        if c[0].len() >= 8 {
            "<id>".to_owned()
        } else {
            c[0].to_owned()
        }
    });
    std::borrow::Cow::Owned(text.into_owned())
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

/// The feature probes' digests as lines of tokens (see [`tokens`]), each line's first token
/// its probe's name, for a bag-of-words reader.
pub fn battery_lines(results: &[ProbeResult]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for r in results.iter().filter(|r| is_feature(r.probe)) {
        for line in r.digest.lines() {
            let mut t = vec![r.probe.to_string()];
            t.extend(tokens(line));
            out.push(t);
        }
    }
    out
}

/// Decides from a finished battery: the verdict, which the policy then places at the failing
/// function ([`located`]) and answers.
pub type Decide = Box<dyn FnMut(&[ProbeResult]) -> Result<Verdict, String> + Send>;

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
            _ => (self.decide)(&self.results).map(|v| located(v, &self.results).render()),
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

/// `verdict` placed at `function` (`@at :FUNCTION`) when it names a deficiency and says nowhere
/// in the code: the one place a battery decision gets its location, for the answer the
/// transcript holds and for the trainer's sampled decisions alike.
pub fn at_function(verdict: Verdict, function: Option<&str>) -> Verdict {
    match (verdict, function) {
        (
            Verdict::Deficiency {
                deficiency_id,
                component,
                step,
                location: None,
                evidence,
            },
            Some(function),
        ) if !deficiency_id.eq_ignore_ascii_case(taxonomy::NONE) => Verdict::Deficiency {
            deficiency_id,
            component,
            step,
            location: Some(CodeLocation {
                file: None,
                function: Some(function.to_owned()),
            }),
            evidence,
        },
        (verdict, _) => verdict,
    }
}

/// `verdict` placed at the function the battery's failing spans came from, if it knows one.
pub fn located(verdict: Verdict, results: &[ProbeResult]) -> Verdict {
    at_function(verdict, failing_function(results).as_deref())
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
        let answer = |v: Verdict| v.render();
        assert_eq!(
            answer(located(
                Verdict::deficiency("P24", "parsing.encoding", "digests"),
                &results
            )),
            "answer: P24 parsing.encoding @at :read_file | digests"
        );
        assert_eq!(
            answer(located(
                Verdict::deficiency("none", "none", "digests"),
                &results
            )),
            "answer: none none | digests"
        );
        let quiet = vec![ProbeResult {
            probe: "code",
            digest: "code search tool x2".into(),
        }];
        assert_eq!(
            answer(located(
                Verdict::deficiency("P27", "tools.execution", "d"),
                &quiet
            )),
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
