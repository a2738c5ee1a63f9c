//! The prompts of the learned policies. They are short on purpose: every prompt token is paid
//! for again in each training pass, and a small model learns the call format from
//! demonstrations and the grammar, not from a long description. Pure text, no I/O.

use detect::{Observation, Status};

/// The learned Detector's system prompt.
pub fn detector_system(chatlog: bool) -> String {
    let mut s = String::from(
        "You are the Detector. An AI agent run failed because of one deficiency in the agent's code. Investigate its trace. Each reply is one call on one line:\n\
         - `sql:` and a SQLite SELECT over the tables traces, spans and trace_tools;\n\
         - `bash:` and a pipeline of jq grep awk sed sort uniq head tail wc cut tr cat over spans.jsonl and trace.json;\n\
         - `answer:`, the deficiency id (P1-P27, C1-C23), its component, `|` and your evidence. Your last reply must be an answer.\n",
    );
    if chatlog {
        s.push_str("The trace is a multi-agent chat log.\n");
    }
    s
}

/// The first user message of an investigation.
pub fn detector_task(trace_id: &str) -> String {
    format!("Investigate trace '{trace_id}'.")
}

/// An observation as the learned Detector reads it: its status and at most `chars` characters.
pub fn observation(obs: &Observation, chars: usize) -> String {
    let status = match obs.status {
        Status::Ok => "ok",
        Status::Refused => "refused",
        Status::Failed => "failed",
        Status::Malformed => "malformed",
    };
    let text = obs.text.trim_end();
    let count = text.chars().count();
    if count <= chars {
        format!("[{status}]\n{text}")
    } else {
        let cut: String = text.chars().take(chars).collect();
        format!("[{status}, {count} chars, first {chars}]\n{cut}")
    }
}

/// The Injector's system prompt.
pub fn injector_system() -> String {
    "You are the Injector. Plant one realistic deficiency into an agent's code so that the run leaves traces a careful investigator can still diagnose. Reply with the deficiency id and the template variant.".into()
}

/// The Injector's request: the agent, its component inventory and what happened to recent
/// injections (the run's history).
pub fn injector_task(agent: &str, components: &[String], history: &str) -> String {
    let mut s = format!("Agent: {agent}\nComponents: {}\n", components.join(", "));
    if !history.is_empty() {
        s.push_str(&format!("Recent results: {history}\n"));
    }
    s.push_str("Choose an injection.");
    s
}

/// The free-form Injector's request for a patch of `code` in `file`.
pub fn diff_request(file: &str, code: &str, deficiency: &str) -> String {
    format!(
        "Write a unified diff (--- a/{file}, +++ b/{file}, @@ hunks) that plants {deficiency} in this code of {file}:\n{code}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_observations_are_cut_and_say_so() {
        let obs = Observation::new("x".repeat(50), Status::Ok);
        let text = observation(&obs, 10);
        assert!(text.starts_with("[ok, 50 chars, first 10]\n"));
        assert!(text.ends_with(&"x".repeat(10)));
        assert_eq!(observation(&obs, 100), format!("[ok]\n{}", "x".repeat(50)));
    }
}
