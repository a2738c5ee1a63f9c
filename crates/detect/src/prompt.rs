//! The system prompt: the task, the call format, the tools this run allows, the files, the
//! discovered schema and the deficiency catalog. Pure text assembly, no I/O.

use std::fmt::Write as _;

use crate::env::{Ablations, Actor, SPANS_FILE, TRACE_FILE};
use crate::sandbox::EPISODE_MOUNT;
use crate::shell::ALLOWED_PROGRAMS;

/// What goes into a prompt.
pub struct PromptInput<'a> {
    pub trace_id: &'a str,
    pub role: Actor,
    /// A subagent's task.
    pub task: Option<&'a str>,
    pub chatlog: bool,
    pub schema: Option<&'a str>,
    pub ablations: Ablations,
    pub output_chars: usize,
    pub max_turns: usize,
    pub catalog: &'a taxonomy::Catalog,
}

pub fn system_prompt(p: &PromptInput<'_>) -> String {
    let mut s = String::new();
    match (p.role, p.task) {
        (Actor::Main, _) => {
            let _ = writeln!(
                s,
                "You are the Detector. Trace `{}` records an AI agent run that went wrong because of one deficiency in the agent's code. Investigate the trace with the tools and name the deficiency type and the component it lives in.",
                p.trace_id
            );
            if p.chatlog {
                s.push_str("This trace is a multi-agent chat log: you may instead name the agent and the step responsible.\n");
            }
        }
        (Actor::Subagent(_), task) => {
            let _ = writeln!(
                s,
                "You are a subagent of the Detector investigating trace `{}`. Your task: {}\nInvestigate it with the tools and finish with `answer: SUMMARY`, a short factual summary of what you found (the main agent sees only that summary).",
                p.trace_id,
                task.unwrap_or("(none given)")
            );
        }
    }
    s.push_str("\n## How to call a tool\nWrite optional reasoning, then exactly one line that starts with a tool name and a colon. One call per turn.\n");
    if !p.ablations.no_sql {
        s.push_str(
            "sql: SELECT ...            one SQLite SELECT over the trace store (may span lines)\n",
        );
    }
    if !p.ablations.no_shell {
        let _ = writeln!(
            s,
            "bash: PIPELINE             one line: programs joined by |, no redirection, no ; && $( ); programs: {}",
            ALLOWED_PROGRAMS.join(" ")
        );
    }
    if !p.ablations.no_history {
        s.push_str("history: QUESTION          earlier questions and answers of this investigation (`history 10m: ...` for the last 10 minutes)\n");
    }
    if p.role == Actor::Main && !p.ablations.no_subagents {
        s.push_str("delegate: TASK             a subagent investigates TASK and returns a summary; list more tasks on lines starting with `- ` to run them in parallel\n");
    }
    match p.role {
        Actor::Main => {
            s.push_str("answer: ID COMPONENT | EVIDENCE   ends the investigation, e.g. `answer: P16 tools.schema | RecursionError in resolve_ref at startup`\n");
            s.push_str("answer: none | EVIDENCE          when the run shows no deficiency (a healthy trace)\n");
            if p.chatlog {
                s.push_str("answer: agent NAME step N | EVIDENCE   for chat logs\n");
            }
        }
        Actor::Subagent(_) => s.push_str("answer: SUMMARY            ends your investigation\n"),
    }
    let _ = writeln!(
        s,
        "Tool output is cut at {} characters. You have {} turns.",
        p.output_chars, p.max_turns
    );
    if !p.ablations.no_shell {
        let _ = writeln!(
            s,
            "\n## Files (working directory {EPISODE_MOUNT}, read-only)\n{TRACE_FILE}: the trace's summary row and per-tool rollup (JSON)\n{SPANS_FILE}: one span per line: trace_id, span_id, parent_span_id, name, kind, start_time_unix_nano, end_time_unix_nano, status {{code, message}}, attributes {{...}}"
        );
    }
    if let Some(schema) = p.schema {
        if !p.ablations.no_sql {
            let _ = write!(s, "\n## Trace store\n{schema}");
        }
    }
    if p.role == Actor::Main {
        s.push_str("\n## Deficiency types (id: name [components])\n");
        for d in p.catalog.deficiencies() {
            let _ = writeln!(s, "{}: {} [{}]", d.id, d.name, d.components.join(", "));
        }
    }
    s
}
