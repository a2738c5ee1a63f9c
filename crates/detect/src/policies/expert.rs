//! The scripted expert: probes the trace signature of each deficiency family with real SQL and
//! shell queries (error signatures, repeated and failing tool calls, runs of one tool, token
//! trajectories, repetition, the last span, agent hand-offs, refusal phrases, fenced outputs,
//! unparseable tool arguments), delegates a look at the failing spans to a subagent, and
//! answers with the hypothesis the measurements support best, citing them as evidence. It reads
//! nothing but its observations, so its transcripts are honest demonstrations.

use std::collections::BTreeMap;

use crate::investigation::{Policy, View};
use crate::policies::blame;
use crate::policies::{one_row, quote};

/// One measurement: why, and the call (with `{T}` for the quoted trace id).
struct Probe {
    thought: &'static str,
    call: &'static str,
    /// A bash probe whose observation is one count.
    count_as: Option<&'static str>,
}

const PROBES: &[Probe] = &[
    Probe {
        thought: "Start with the trace's shape: size, errors, steps and the mix of span kinds, and the steps where the model is first called and where the first error shows.",
        call: "sql: SELECT span_count, error_count, COALESCE(max_step, 0) AS max_step,\n  (SELECT COUNT(*) FROM spans WHERE trace_id = {T} AND kind = 'tool') AS tool_spans,\n  (SELECT COUNT(*) FROM spans WHERE trace_id = {T} AND kind = 'llm') AS llm_spans,\n  COALESCE((SELECT MIN(step) FROM spans WHERE trace_id = {T} AND kind = 'llm'), -1) AS first_llm_step,\n  COALESCE((SELECT MIN(step) FROM spans WHERE trace_id = {T} AND is_error = 1), -1) AS first_error_step,\n  COALESCE((SELECT code_filepath || ':' || COALESCE(code_function, '') FROM spans WHERE trace_id = {T} AND is_error = 1 AND code_filepath IS NOT NULL ORDER BY end_time_ns, depth DESC LIMIT 1), '-') AS error_code,\n  COALESCE((SELECT tool_name FROM spans WHERE trace_id = {T} AND is_error = 1 AND kind = 'tool' ORDER BY end_time_ns, depth DESC LIMIT 1), '-') AS error_tool\nFROM traces WHERE trace_id = {T}",
        count_as: None,
    },
    Probe {
        thought: "Which errors occur, where first, and on which kind of span?",
        call: "sql: SELECT error_type, kind, COUNT(*) AS n, MIN(step) AS first_step, substr(MAX(error_message), 1, 100) AS message\nFROM spans WHERE trace_id = {T} AND is_error = 1 GROUP BY error_type, kind ORDER BY n DESC LIMIT 10",
        count_as: None,
    },
    Probe {
        thought: "Test the explicit-error signatures against the error text of the failing spans.",
        call: "sql: SELECT\n  COALESCE(SUM(error_message LIKE '%temperature%'), 0) AS temperature,\n  COALESCE(SUM(error_message LIKE '%tool_choice%'), 0) AS tool_choice,\n  COALESCE(SUM(error_message LIKE '%response_format%' OR error_message LIKE '%invalid schema%'), 0) AS response_format,\n  COALESCE(SUM(error_type = 'RecursionError'), 0) AS recursion,\n  COALESCE(SUM(error_message LIKE '%changed size during iteration%'), 0) AS dict_mutation,\n  COALESCE(SUM(error_type = 'UnicodeDecodeError'), 0) AS undecodable,\n  COALESCE(SUM(error_message LIKE '%context length%' OR error_message LIKE '%context_length%'), 0) AS context_overflow,\n  COALESCE(SUM(error_type = 'JSONDecodeError'), 0) AS json_decode,\n  COALESCE(SUM(error_message LIKE '%is not one of%'), 0) AS enum_mismatch,\n  COALESCE(SUM(error_message LIKE '%None is not of type%' OR error_message LIKE '%NoneType%'), 0) AS null_argument,\n  COALESCE(SUM(error_message LIKE '%tool_call_id%'), 0) AS tool_call_id,\n  COALESCE(SUM(error_type IN ('TimeoutError', 'CancelledError')), 0) AS timeouts\nFROM spans WHERE trace_id = {T} AND is_error = 1",
        count_as: None,
    },
    Probe {
        thought: "Look at tool usage: longest run of one tool, repeated identical calls, and whether they fail.",
        call: "sql: SELECT\n  COALESCE((SELECT MAX(max_consecutive) FROM trace_tools WHERE trace_id = {T}), 0) AS longest_run,\n  COALESCE((SELECT SUM(errors) FROM trace_tools WHERE trace_id = {T}), 0) AS tool_errors,\n  COALESCE(MAX(n), 0) AS max_identical_calls,\n  COALESCE(MAX(errs), 0) AS max_identical_failures,\n  COALESCE((SELECT COUNT(DISTINCT tool_arguments) FROM spans WHERE trace_id = {T} AND tool_name =\n    (SELECT tool_name FROM trace_tools WHERE trace_id = {T} ORDER BY max_consecutive DESC LIMIT 1)), 0) AS distinct_args_in_run\nFROM (SELECT COUNT(*) AS n, SUM(is_error) AS errs FROM spans WHERE trace_id = {T} AND kind = 'tool' GROUP BY tool_name, tool_arguments)",
        count_as: None,
    },
    Probe {
        thought: "Check the LLM side: input token trajectory, repetition of outputs, summarisation steps.",
        call: "sql: SELECT COUNT(*) AS llm_calls,\n  COALESCE(SUM(input_tokens < prev), 0) AS token_drops,\n  COALESCE(MAX(input_tokens), 0) AS max_input_tokens,\n  COUNT(DISTINCT output) AS distinct_outputs,\n  (SELECT COUNT(*) FROM spans WHERE trace_id = {T} AND (name LIKE '%summar%' OR name LIKE '%compress%' OR name LIKE '%truncat%')) AS summarize_spans\nFROM (SELECT input_tokens, output, LAG(input_tokens) OVER (ORDER BY seq) AS prev FROM spans WHERE trace_id = {T} AND kind = 'llm')",
        count_as: None,
    },
    Probe {
        thought: "How did the run end: what kind of span came last, and did it fail?",
        call: "sql: SELECT kind AS last_kind, is_error AS last_failed FROM spans WHERE trace_id = {T} AND parent_span_id IS NOT NULL ORDER BY seq DESC LIMIT 1",
        count_as: None,
    },
    Probe {
        thought: "Are several agents involved, and do they hand work back and forth?",
        call: "sql: SELECT COUNT(DISTINCT agent_name) AS agents, COALESCE(SUM(agent_name <> prev), 0) AS handoffs\nFROM (SELECT agent_name, LAG(agent_name) OVER (ORDER BY seq) AS prev FROM spans WHERE trace_id = {T} AND kind = 'agent' AND parent_span_id IS NOT NULL)",
        count_as: None,
    },
    Probe {
        thought: "Do the model's replies refuse work by citing rules?",
        call: "bash: jq -r 'select(.kind == \"llm\") | .attributes[\"output.value\"] // empty' spans.jsonl | grep -c -i -E 'not allowed to|would violate|under the rules'",
        count_as: Some("refusals"),
    },
    Probe {
        thought: "Do the model's replies wrap JSON in Markdown fences?",
        call: "bash: jq -r 'select(.kind == \"llm\") | .attributes[\"output.value\"] // empty' spans.jsonl | grep -c '^```'",
        count_as: Some("fenced_replies"),
    },
    Probe {
        thought: "Are tool-call arguments whole JSON objects, or cut-off fragments?",
        call: "bash: jq -r 'select(.kind == \"tool\") | .attributes[\"gen_ai.tool.call.arguments\"] // empty | try (fromjson | \"ok\") catch \"cut\"' spans.jsonl | grep -c cut",
        count_as: Some("unparseable_args"),
    },
];

/// With a healthy reference run (`{R}`): the first span, in `seq` order, that acts differently
/// — its name, kind, tool or arguments, or for a span without children its status or error
/// (a run or step fails because a child failed, and the child is where it shows) — and the two
/// runs' sizes and failures. Span names lose their spaces, so each value is one word.
const REFERENCE_PROBE: &str = "sql: WITH a AS (SELECT seq, COALESCE(step, -1) AS step, replace(name, ' ', '_') AS name, kind, status_code AS st, COALESCE(error_type, '') AS err, COALESCE(tool_name, '') AS tool, COALESCE(tool_arguments, '') AS args,\n    EXISTS (SELECT 1 FROM spans c WHERE c.trace_id = s.trace_id AND c.parent_span_id = s.span_id) AS parent FROM spans s WHERE trace_id = {T}),\n  b AS (SELECT seq, replace(name, ' ', '_') AS name, kind, status_code AS st, COALESCE(error_type, '') AS err, COALESCE(tool_name, '') AS tool, COALESCE(tool_arguments, '') AS args FROM spans WHERE trace_id = {R}),\n  d AS (SELECT a.seq, a.step, a.name, COALESCE(b.name, 'nothing') AS ref_name FROM a LEFT JOIN b ON a.seq = b.seq\n    WHERE b.seq IS NULL OR a.name <> b.name OR a.kind <> b.kind OR a.tool <> b.tool OR a.args <> b.args OR (NOT a.parent AND (a.st <> b.st OR a.err <> b.err)) ORDER BY a.seq LIMIT 1)\nSELECT (SELECT COUNT(*) FROM a) AS spans, (SELECT COUNT(*) FROM b) AS ref_spans,\n  (SELECT COUNT(*) FROM a WHERE st = 'ERROR') AS errors, (SELECT COUNT(*) FROM b WHERE st = 'ERROR') AS ref_errors,\n  COALESCE((SELECT seq FROM d), -1) AS departs_seq, COALESCE((SELECT step FROM d), -1) AS departs_step,\n  COALESCE((SELECT name FROM d), '-') AS departs_at, COALESCE((SELECT ref_name FROM d), '-') AS ref_at,\n  COALESCE((SELECT step FROM a ORDER BY seq DESC LIMIT 1), -1) AS last_step";

/// Types whose only trace may be in token counts, which two healthy runs need not share.
const COUNT_ONLY_TYPES: &[&str] = &["P1", "P6", "P8", "P10"];

/// Index of the probe after which the expert may delegate a look at the failing spans.
const DELEGATE_AFTER: usize = 1;

#[derive(Default)]
pub struct ExpertPolicy {
    features: BTreeMap<String, String>,
    next_probe: usize,
    delegated: bool,
    /// The healthy reference compared with (its id, and whether it ran the same task).
    compared: Option<(String, bool)>,
    awaiting: Option<Pending>,
    /// On a chat log: the blame probes made so far, and the per-turn table read back.
    blame_calls: usize,
    turns: Vec<blame::Turn>,
}

enum Pending {
    Probe(usize),
    Reference,
    Delegate,
    BlameOverview,
    BlameTurns,
}

impl ExpertPolicy {
    pub fn new() -> ExpertPolicy {
        ExpertPolicy::default()
    }

    fn num(&self, key: &str) -> i64 {
        self.features
            .get(key)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }

    fn text(&self, key: &str) -> &str {
        self.features.get(key).map(String::as_str).unwrap_or("")
    }

    fn absorb(&mut self, view: &View<'_>) {
        let Some(pending) = self.awaiting.take() else {
            return;
        };
        let Some(last) = view.turns.last() else {
            return;
        };
        let obs = &last.observation.text;
        match pending {
            Pending::Probe(i) => {
                if let Some(name) = PROBES[i].count_as {
                    let n = obs
                        .lines()
                        .next()
                        .and_then(|l| l.trim().parse::<i64>().ok())
                        .unwrap_or(0);
                    self.features.insert(name.to_string(), n.to_string());
                } else {
                    for (k, v) in one_row(obs) {
                        self.features.insert(k, v);
                    }
                }
            }
            Pending::Delegate => {
                self.features.insert(
                    "subagent_summary".into(),
                    obs.lines().next().unwrap_or("").to_string(),
                );
            }
            Pending::Reference => {
                for (k, v) in one_row(obs) {
                    self.features.insert(format!("ref:{k}"), v);
                }
            }
            Pending::BlameOverview => {
                for (k, v) in one_row(obs) {
                    self.features.insert(k, v);
                }
            }
            Pending::BlameTurns => self.turns = blame::parse_turns(obs),
        }
    }

    /// A chat log: the overview, the per-turn table, then `agent NAME step N` (see
    /// [`blame`]).
    fn act_blame(&mut self, view: &View<'_>) -> String {
        let sql = view.system_prompt.contains("\nsql: ");
        let bash = view.system_prompt.contains("\nbash: ");
        if self.blame_calls == 0 && sql && view.turns_left > 2 {
            self.blame_calls = 1;
            self.awaiting = Some(Pending::BlameOverview);
            return format!(
                "A chat log: count its turns, agents, hand-offs and failed code executions.\n{}",
                blame::overview(view.trace_id)
            );
        }
        if self.blame_calls <= 1 && (sql || bash) && view.turns_left > 1 {
            self.blame_calls = 2;
            self.awaiting = Some(Pending::BlameTurns);
            let call = if bash {
                blame::turn_table_bash()
            } else {
                blame::turn_table_sql(view.trace_id)
            };
            return format!("Per turn: did it fail, does it make up data, which of its new facts do later turns and the final answer rely on?\n{call}");
        }
        match blame::blame(&self.turns) {
            Some((agent, step, why)) => format!(
                "{why}.\nanswer: agent {agent} step {step} | {why}; {} turns, {} agents, {} hand-offs",
                self.num("turns"),
                self.num("agents"),
                self.num("handoffs")
            ),
            None => "No acting turn could be read from this log.\nanswer: none | no acting turn measured".into(),
        }
    }

    /// Each hypothesis the measurements support, with a strength and the evidence.
    fn hypotheses(&self) -> Vec<(u32, &'static str, &'static str, String)> {
        let n = |k: &str| self.num(k);
        let mut h = Vec::new();
        let mut add = |score: u32, id: &'static str, component: &'static str, why: String| {
            h.push((score, id, component, why))
        };
        if n("recursion") > 0 {
            add(
                10,
                "P16",
                "tools.schema",
                format!(
                    "{} RecursionError span(s) while loading tool schemas; {} tool spans",
                    n("recursion"),
                    n("tool_spans")
                ),
            );
        }
        if n("temperature") > 0 {
            add(
                10,
                "P11",
                "llm_client.request",
                format!(
                    "{} LLM call(s) rejected for temperature out of range, no tool span ran",
                    n("temperature")
                ),
            );
        }
        if n("tool_choice") > 0 {
            add(
                10,
                "P12",
                "llm_client.request",
                format!("{} call(s) rejected over tool_choice", n("tool_choice")),
            );
        }
        if n("response_format") > 0 {
            add(
                9,
                "P13",
                "llm_client.request",
                format!(
                    "{} call(s) rejected over response_format",
                    n("response_format")
                ),
            );
        }
        if n("dict_mutation") > 0 {
            add(
                10,
                "P20",
                "concurrency.shared_state",
                "RuntimeError: dictionary changed size during iteration after parallel agent spans"
                    .into(),
            );
        }
        if n("undecodable") > 0 {
            let last_tool = self.text("last_kind") == "tool" && n("last_failed") == 1;
            add(if last_tool { 10 } else { 7 }, "P24", "parsing.encoding", format!("UnicodeDecodeError on {} tool output(s); the run ends on that tool span: {last_tool}", n("undecodable")));
        }
        if n("context_overflow") > 0 {
            let monotonic = n("token_drops") == 0 && n("summarize_spans") == 0;
            add(if monotonic { 9 } else { 6 }, "P5", "context.window", format!(
                "context-length error at {} input tokens; input tokens dropped {} time(s) on the way and {} summarisation spans ran",
                n("max_input_tokens"), n("token_drops"), n("summarize_spans")
            ));
        }
        if n("json_decode") > 0 {
            if n("fenced_replies") > 0 {
                add(
                    9,
                    "P25",
                    "parsing.json_extract",
                    format!(
                        "{} JSONDecodeError(s) right after {} fenced model replies",
                        n("json_decode"),
                        n("fenced_replies")
                    ),
                );
            }
            if n("unparseable_args") > 0 {
                add(
                    9,
                    "P2",
                    "llm_client.stream",
                    format!(
                        "{} JSONDecodeError(s); {} tool-call arguments are cut-off JSON fragments",
                        n("json_decode"),
                        n("unparseable_args")
                    ),
                );
            }
        }
        if n("enum_mismatch") > 0 {
            add(
                9,
                "P18",
                "tools.validation",
                format!(
                    "{} validation failure(s) 'is not one of' on enum arguments",
                    n("enum_mismatch")
                ),
            );
        }
        if n("null_argument") > 0 {
            add(
                9,
                "P17",
                "tools.validation",
                format!(
                    "{} failure(s) on null optional arguments",
                    n("null_argument")
                ),
            );
        }
        if n("tool_call_id") > 0 {
            add(
                6,
                "P14",
                "llm_client.provider_format",
                "errors name tool_call_id after the first tool result".into(),
            );
        }
        if n("timeouts") > 0 {
            add(
                5,
                "P22",
                "concurrency.sync",
                format!("{} timeout/cancellation error(s)", n("timeouts")),
            );
        }
        if n("max_identical_failures") >= 3 {
            add(7, "C3", "orchestrator.reflection", format!(
                "the same tool call failed {} times with identical arguments; the agent never changed course",
                n("max_identical_failures")
            ));
        }
        if n("max_identical_calls") >= 3
            && n("max_identical_failures") == 0
            && n("summarize_spans") > 0
        {
            add(8, "P9", "context.summarize", format!(
                "an identical successful tool call repeated {} times, each after one of {} history compressions",
                n("max_identical_calls"), n("summarize_spans")
            ));
        }
        if n("longest_run") >= 8
            && n("distinct_args_in_run") * 10 >= n("longest_run") * 8
            && n("tool_errors") == 0
        {
            add(8, "C12", "tools.registry", format!(
                "{} consecutive calls of one tool with {} distinct arguments: one small unit per call",
                n("longest_run"), n("distinct_args_in_run")
            ));
        }
        if n("refusals") >= 2 {
            add(
                8,
                "C11",
                "prompt.system",
                format!(
                    "{} model replies refuse work by citing rules; {} tool spans",
                    n("refusals"),
                    n("tool_spans")
                ),
            );
        }
        if n("handoffs") >= 4 && n("tool_spans") <= 1 {
            add(
                8,
                "C6",
                "orchestrator.delegation",
                format!(
                    "{} hand-offs between {} agents and no real tool work",
                    n("handoffs"),
                    n("agents")
                ),
            );
        }
        if n("llm_calls") >= 8
            && n("distinct_outputs") * 4 <= n("llm_calls")
            && n("tool_spans") == 0
        {
            add(7, "C1", "orchestrator.termination", format!(
                "{} LLM calls with only {} distinct outputs: the same refine loop repeats until the step cap",
                n("llm_calls"), n("distinct_outputs")
            ));
        }
        h.sort_by_key(|x| std::cmp::Reverse(x.0));
        h
    }

    /// Where the deficiency first shows: the step of the first error when the run has one, else
    /// the step after the first model call — without an error, the first request looks like a
    /// healthy run's, and the run departs where the model reacts to what came back (chosen on
    /// a corpus's train split over the first-call step itself; BENCHMARKS.md). Empty when the
    /// trace records no steps.
    fn at_step(&self) -> String {
        let step = |k: &str| self.text(k).parse::<i64>().ok().filter(|s| *s >= 0);
        // A healthy run of the same task says where this one departs from it.
        if let Some(s) = self.departure_step() {
            return format!(" @step {s}");
        }
        let first = if self.num("error_count") > 0 {
            step("first_error_step").or_else(|| step("first_step"))
        } else {
            None
        };
        first
            .or_else(|| step("first_llm_step").map(|s| s + 1))
            .map_or(String::new(), |s| format!(" @step {s}"))
    }

    /// Where in the code the failure shows: the code location of the first failing span that
    /// records one (a framework that records none still gives the innermost application frame
    /// of its exception, which the importer reads), else the first failing tool, named as the
    /// function that implements it. Empty for a run without errors.
    fn at_code(&self) -> String {
        // `-` is the probe's mark for "none" (an empty cell would shift the row's columns).
        let given = |k: &str| Some(self.text(k)).filter(|v| !v.is_empty() && *v != "-");
        if let Some(code) = given("error_code").filter(|c| *c != ":") {
            format!(" @at {}", code.trim_end_matches(':'))
        } else if let Some(tool) = given("error_tool") {
            format!(" @at :{tool}")
        } else {
            String::new()
        }
    }

    /// Whether the reference was of the same task and this run acts as it does, span for span.
    fn matches_reference(&self) -> bool {
        matches!(self.compared, Some((_, true)))
            && self.text("ref:departs_seq") == "-1"
            && self.text("ref:spans") == self.text("ref:ref_spans")
    }

    /// The step at which this run departs from a healthy run of the same task: its first
    /// differing span's, or its last span's when it stops short of the reference.
    fn departure_step(&self) -> Option<i64> {
        if !matches!(self.compared, Some((_, true))) {
            return None;
        }
        let n = |k: &str| self.text(k).parse::<i64>().ok();
        match n("ref:departs_seq") {
            Some(s) if s >= 0 => n("ref:departs_step").filter(|s| *s >= 0),
            _ if n("ref:spans") < n("ref:ref_spans") => n("ref:last_step").filter(|s| *s >= 0),
            _ => None,
        }
    }

    fn verdict(&self) -> String {
        let at = format!("{}{}", self.at_step(), self.at_code());
        let top = self.hypotheses().into_iter().next();
        if self.matches_reference()
            && !top
                .as_ref()
                .is_some_and(|(_, id, _, _)| COUNT_ONLY_TYPES.contains(id))
        {
            let reference = self.compared.as_ref().map_or("", |(id, _)| id.as_str());
            return format!(
                "The run acts as a healthy run of the same task does, span for span.\nanswer: none | same spans, tools, arguments and outcomes as healthy run {reference}"
            );
        }
        match top {
            Some((_, id, component, why)) => {
                let others: Vec<String> = self.hypotheses().iter().skip(1).take(2).map(|(s, id, _, _)| format!("{id} ({s})")).collect();
                let note = if others.is_empty() { String::new() } else { format!(" Weaker candidates: {}.", others.join(", ")) };
                format!("The measurements point to {id}.{note}\nanswer: {id} {component}{at} | {why}")
            }
            None if self.num("error_count") > 0 => format!(
                "No specific signature fired; the run failed on its first unrecovered error.\nanswer: C5 orchestrator.fallback{at} | {} error span(s) and no retry or alternative path",
                self.num("error_count")
            ),
            None => "No error and no structural signature fired: the run looks healthy.\nanswer: none | no errors, no repetition, no refusals".into(),
        }
    }
}

impl Policy for ExpertPolicy {
    fn name(&self) -> String {
        "expert".into()
    }

    fn act(&mut self, view: &View<'_>) -> Result<String, String> {
        self.absorb(view);
        if view.chatlog {
            return Ok(self.act_blame(view));
        }
        let sql = view.system_prompt.contains("\nsql: ");
        let bash = view.system_prompt.contains("\nbash: ");
        let delegation = view.system_prompt.contains("\ndelegate: ");
        if !self.delegated
            && delegation
            && self.next_probe > DELEGATE_AFTER
            && self.num("error_count") > 0
        {
            self.delegated = true;
            self.awaiting = Some(Pending::Delegate);
            return Ok("Hand the failing spans to a subagent for an ordered account while I keep measuring.\ndelegate: list the failing spans of this trace in order with their step, name, error type and message, and summarise the pattern".into());
        }
        while self.next_probe < PROBES.len() {
            let i = self.next_probe;
            self.next_probe += 1;
            let probe = &PROBES[i];
            let usable = if probe.call.starts_with("sql:") {
                sql
            } else {
                bash
            };
            if !usable || view.turns_left <= 1 {
                continue;
            }
            self.awaiting = Some(Pending::Probe(i));
            return Ok(format!(
                "{}\n{}",
                probe.thought,
                probe.call.replace("{T}", &quote(view.trace_id))
            ));
        }
        if let (None, Some(reference), true, true) =
            (&self.compared, view.reference, sql, view.turns_left > 1)
        {
            self.compared = Some((reference.trace_id.clone(), reference.same_task));
            self.awaiting = Some(Pending::Reference);
            let of = if reference.same_task {
                "the same task"
            } else {
                "the same agent on another task"
            };
            return Ok(format!(
                "Compare with a healthy run of {of}: where does this run first act differently?\n{}",
                REFERENCE_PROBE
                    .replace("{T}", &quote(view.trace_id))
                    .replace("{R}", &quote(&reference.trace_id))
            ));
        }
        Ok(self.verdict())
    }

    fn subagent(&self, task: &str) -> Result<Box<dyn Policy>, String> {
        Ok(Box::new(FailingSpansAnalyst {
            task: task.to_string(),
        }))
    }
}

/// The expert's subagent: lists the failing spans and summarises them.
struct FailingSpansAnalyst {
    task: String,
}

impl Policy for FailingSpansAnalyst {
    fn name(&self) -> String {
        "expert-subagent".into()
    }

    fn act(&mut self, view: &View<'_>) -> Result<String, String> {
        if view.turns.is_empty() {
            return Ok(format!(
                "Task: {}\nsql: SELECT step, name, kind, error_type, substr(error_message, 1, 160) AS message FROM spans WHERE trace_id = {} AND is_error = 1 ORDER BY seq",
                self.task,
                quote(view.trace_id)
            ));
        }
        let obs = &view.turns[0].observation.text;
        let rows: Vec<&str> = obs
            .lines()
            .skip(1)
            .filter(|l| !l.starts_with('('))
            .collect();
        if rows.is_empty() {
            return Ok("answer: no failing spans in this trace".into());
        }
        let first = rows[0].split_whitespace().collect::<Vec<_>>();
        let mut types: BTreeMap<&str, usize> = BTreeMap::new();
        for r in &rows {
            if let Some(t) = r.split_whitespace().nth(3) {
                *types.entry(t).or_default() += 1;
            }
        }
        let types: Vec<String> = types.iter().map(|(t, n)| format!("{t} ×{n}")).collect();
        Ok(format!(
            "answer: {} failing span(s); first at step {} ({}); error types: {}",
            rows.len(),
            first.first().unwrap_or(&"?"),
            first.get(1).unwrap_or(&"?"),
            types.join(", ")
        ))
    }

    fn subagent(&self, _task: &str) -> Result<Box<dyn Policy>, String> {
        Err("subagents do not delegate".into())
    }
}
