//! A Detector's investigation, turn by turn: what the policy wrote, the call, the
//! observation; subagents nested under the turn that started them; the outcome.

use std::fmt::Write as _;

use detect::{Outcome, Status, Transcript};

use crate::html::{duration, escape_into, value_into};

/// Renders one transcript (and, recursively, its subagents').
pub fn render(out: &mut String, t: &Transcript) {
    let _ = write!(
        out,
        "<div class=\"investigation\"><p class=\"meta\">{} · policy <code>",
        role_label(t)
    );
    escape_into(out, &t.policy);
    let _ = write!(
        out,
        "</code> · {} turns · {} tokens · {}</p>",
        t.turns.len(),
        t.total_tokens,
        duration(t.ended_unix_ns - t.started_unix_ns)
    );
    if let Some(task) = &t.task {
        out.push_str("<p><strong>task:</strong> ");
        escape_into(out, task);
        out.push_str("</p>");
    }
    out.push_str("<details class=\"fold\"><summary>system prompt</summary>");
    value_into(out, &t.system_prompt);
    out.push_str("</details>");
    out.push_str("<ol class=\"turns\">");
    for turn in &t.turns {
        let tool = turn
            .action
            .as_ref()
            .map(|a| a.tool())
            .unwrap_or("malformed");
        let ok = turn.observation.status == Status::Ok;
        let _ = write!(
            out,
            "<li class=\"turn\"><div class=\"meta\"><span class=\"badge k-tool\">{tool}</span> \
             {} + {} tokens · tool {}",
            turn.action_tokens,
            turn.observation_tokens,
            duration(turn.ended_unix_ns - turn.acted_unix_ns)
        );
        if !ok {
            let _ = write!(
                out,
                " <span class=\"badge st-ERROR\">{}</span>",
                format!("{:?}", turn.observation.status).to_lowercase()
            );
        }
        out.push_str("</div>");
        if !turn.thought.trim().is_empty() {
            out.push_str("<div class=\"thought\"><em>thought</em>");
            value_into(out, &turn.thought);
            out.push_str("</div>");
        }
        out.push_str("<div class=\"call\"><em>call</em>");
        match &turn.action {
            Some(a) => value_into(out, &a.render()),
            None => value_into(out, &turn.text),
        }
        out.push_str("</div>");
        for sub in &turn.subagents {
            out.push_str("<details class=\"subagent card\"><summary>");
            escape_into(out, &role_label(sub));
            if let Some(task) = &sub.task {
                out.push_str(": ");
                let short: String = task.chars().take(100).collect();
                escape_into(out, &short);
            }
            out.push_str("</summary>");
            render(out, sub);
            out.push_str("</details>");
        }
        let _ = write!(
            out,
            "<div class=\"obs{}\"><em>observation</em>",
            if ok { "" } else { " obs-err" }
        );
        value_into(out, &turn.observation.text);
        out.push_str("</div></li>");
    }
    out.push_str("</ol>");
    let class = match t.outcome {
        Outcome::Answered { .. } | Outcome::Summary { .. } => "right",
        _ => "wrong",
    };
    let _ = write!(out, "<p><strong>outcome:</strong> <span class=\"{class}\">");
    escape_into(out, &t.outcome.describe());
    out.push_str("</span></p></div>");
}

fn role_label(t: &Transcript) -> String {
    t.role.label()
}
