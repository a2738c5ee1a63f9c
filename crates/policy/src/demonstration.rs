//! Demonstrations for the supervised warm start: an expert investigation rewritten as the
//! conversation the learned Detector would have had, in the grammar's own tokenisation, so the
//! warm start teaches exactly the replies the policy can later sample.

use detect::{Action, Transcript, Verdict};
use model::ChatTokenizer;

use crate::chat::{ChatFormat, Conversation};
use crate::grammar::ActionGrammar;
use crate::prompt;
use crate::Result;

/// The evidence of a labelled answer the expert did not reach: short, since every generated
/// token costs a forward pass, and true of any investigation that ran probes.
const LABEL_EVIDENCE: &str = "the rows the calls above returned";

/// The answer a demonstration ends in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DemoAnswer<'a> {
    /// The expert's own verdict, right or wrong.
    Expert,
    /// The trace's label (deficiency id, component): the expert's probes, then the true answer.
    /// The scripted expert names the right type for a minority of traces, and a warm start that
    /// copies its answers learns its mistakes along with its tool use.
    Label(&'a str, &'a str),
}

/// The learned Detector's conversation for `transcript`, keeping at most `max_probes` tool
/// calls before the answer. History and delegation turns are dropped (the learned policy has
/// neither tool), and so are turns whose observation was refused or malformed. `None` when the
/// answer (see [`DemoAnswer`]) is missing or not one the grammar can write.
#[allow(clippy::too_many_arguments)]
pub fn demonstration(
    tokenizer: &ChatTokenizer,
    format: ChatFormat,
    grammar: &ActionGrammar,
    transcript: &Transcript,
    chatlog: bool,
    max_probes: usize,
    observation_chars: usize,
    answer: DemoAnswer<'_>,
) -> Result<Option<Conversation>> {
    let verdict = match transcript.verdict() {
        Some(Verdict::Deficiency {
            deficiency_id,
            component,
            evidence,
            ..
        }) => Some((
            deficiency_id.as_str(),
            component.as_str(),
            evidence.as_str(),
        )),
        _ => None,
    };
    // The expert's evidence argues for its own answer; a label it missed gets none of it.
    let (deficiency_id, component, evidence) = match (answer, verdict) {
        (DemoAnswer::Expert, Some(v)) => v,
        (DemoAnswer::Expert, None) => return Ok(None),
        (DemoAnswer::Label(id, component), Some((vid, vcomp, evidence)))
            if (vid, vcomp) == (id, component) =>
        {
            (id, component, evidence)
        }
        (DemoAnswer::Label(id, component), _) => (id, component, ""),
    };
    let Some(answer) = grammar.answer_tokens(tokenizer, deficiency_id, component)? else {
        return Ok(None);
    };
    let mut c = Conversation::new();
    c.push_message(tokenizer, "system", &prompt::detector_system(chatlog))?;
    c.push_message(
        tokenizer,
        "user",
        &prompt::detector_task(&transcript.investigated_trace),
    )?;
    let mut probes = 0;
    for turn in &transcript.turns {
        if probes >= max_probes {
            break;
        }
        let (head, body) = match &turn.action {
            Some(Action::Sql { query }) => ("sql", query),
            Some(Action::Bash { pipeline }) => ("bash", pipeline),
            _ => continue,
        };
        if matches!(
            turn.observation.status,
            detect::Status::Refused | detect::Status::Malformed
        ) {
            continue;
        }
        let mut reply = grammar.head_tokens(tokenizer, head)?;
        reply.extend(tokenizer.encode(&format!(" {}", one_line(body)), false)?);
        reply.push(format.im_end);
        c.open_reply(tokenizer)?;
        let allowed = grammar.allowed_sets(&reply);
        c.push_reply(tokenizer, format, &reply, allowed)?;
        c.push_message(
            tokenizer,
            "user",
            &prompt::observation(&turn.observation, observation_chars),
        )?;
        probes += 1;
    }
    let mut reply = grammar.head_tokens(tokenizer, "answer")?;
    reply.extend(answer);
    // A verdict without evidence does not parse; an answer without its own points at the rows
    // the probes returned.
    let evidence = match one_line(evidence) {
        e if e.is_empty() => LABEL_EVIDENCE.to_owned(),
        e => e,
    };
    reply.extend(tokenizer.encode(&format!(" {evidence}"), false)?);
    reply.push(format.im_end);
    c.open_reply(tokenizer)?;
    let allowed = grammar.allowed_sets(&reply);
    c.push_reply(tokenizer, format, &reply, allowed)?;
    Ok(Some(c))
}

/// The learned Detector writes each call on one line (generation stops at a newline), so a
/// demonstration does too: line breaks become spaces, which SQL and the pipelines the expert
/// writes read the same way.
fn one_line(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}
