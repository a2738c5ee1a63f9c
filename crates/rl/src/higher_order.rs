//! Higher-order deficiencies (§5.5): a failed investigation becomes a new example in which the
//! Detector must find the step where its own investigation went wrong.
//!
//! The label is computed from the failure itself. The step that went wrong is the first call
//! whose observation showed the true deficiency's error signature (the keyword baseline's
//! phrases for that type) — the evidence was in view and the investigation walked past it; when
//! no observation showed it, the investigation never gathered the evidence and the answer step
//! is where it went wrong (it answered without it).

use detect::policies::KeywordPolicy;
use detect::{Action, Transcript, Verdict};
use policy::{ChoiceGrammar, Conversation, PolicyModel};
use serde::{Deserialize, Serialize};

use crate::Result;
use traces::Truth;

/// Characters of each step's call and observation shown in a review.
const STEP_CHARS: usize = 160;

/// One step of a failed investigation, as the review shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepDigest {
    pub call: String,
    pub observation: String,
}

/// A failed investigation kept for a higher-order example.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailedInvestigation {
    pub truth: Truth,
    /// What the Detector answered (`None`: it never answered).
    pub answered: Option<String>,
    pub steps: Vec<StepDigest>,
    /// The step where it went wrong (index into `steps`).
    pub went_wrong: usize,
}

fn clip(text: &str, n: usize) -> String {
    let t: String = text.chars().take(n).collect();
    t.replace('\n', " ")
}

/// The review example for `transcript` when its answer named the wrong type (or none).
pub fn from_transcript(
    transcript: &Transcript,
    truth: &Truth,
    keyword: &KeywordPolicy,
) -> Option<FailedInvestigation> {
    let answered = match transcript.verdict() {
        Some(Verdict::Deficiency { deficiency_id, .. }) => {
            if deficiency_id == truth.id() {
                return None;
            }
            Some(deficiency_id.clone())
        }
        _ => None,
    };
    let mut steps = Vec::new();
    let mut evidence_at = None;
    for turn in &transcript.turns {
        let call = match &turn.action {
            Some(Action::Sql { .. } | Action::Bash { .. } | Action::Answer { .. }) => {
                turn.text.trim().to_string()
            }
            _ => continue,
        };
        if evidence_at.is_none()
            && !matches!(turn.action, Some(Action::Answer { .. }))
            && keyword.signature_in(truth.id(), &turn.observation.text)
        {
            evidence_at = Some(steps.len());
        }
        steps.push(StepDigest {
            call: clip(&call, STEP_CHARS),
            observation: clip(&turn.observation.text, STEP_CHARS),
        });
    }
    if steps.is_empty() {
        return None;
    }
    let went_wrong = evidence_at.unwrap_or(steps.len() - 1);
    Some(FailedInvestigation {
        truth: truth.clone(),
        answered,
        steps,
        went_wrong,
    })
}

/// `step 01`, … : zero-padded so no choice is a prefix of another.
fn step_label(i: usize) -> String {
    format!("step {i:02}")
}

/// The review conversation's prompt, and the grammar of its answer.
fn review_prompt(
    pm: &PolicyModel,
    f: &FailedInvestigation,
) -> Result<(Conversation, ChoiceGrammar)> {
    let mut user = format!(
        "Your investigation answered {} but the deficiency was {}. Its steps:\n",
        f.answered.as_deref().unwrap_or("nothing"),
        f.truth.id()
    );
    for (i, s) in f.steps.iter().enumerate() {
        user.push_str(&format!(
            "{}: {} -> {}\n",
            step_label(i),
            s.call,
            s.observation
        ));
    }
    user.push_str("At which step did it go wrong?");
    let mut c = Conversation::new();
    c.push_message(
        &pm.tokenizer,
        "system",
        "You are the Detector reviewing one of your own failed investigations.",
    )?;
    c.push_message(&pm.tokenizer, "user", &user)?;
    c.open_reply(&pm.tokenizer)?;
    let labels: Vec<String> = (0..f.steps.len()).map(step_label).collect();
    let grammar = ChoiceGrammar::new(&pm.tokenizer, &labels, pm.format.im_end)?;
    Ok((c, grammar))
}

/// Plays one review with `adapter`; returns the conversation and its reward (1 for the right
/// step, 0.5 for a neighbour, 0 otherwise).
pub fn review(
    pm: &mut PolicyModel,
    adapter: &str,
    f: &FailedInvestigation,
    temperature: f32,
    seed: u64,
) -> Result<(Conversation, f64)> {
    let (mut c, grammar) = review_prompt(pm, f)?;
    let params = model::SamplingParams {
        max_new_tokens: 8,
        temperature,
        seed,
        stop_token_ids: Some(vec![pm.format.im_end]),
        ..Default::default()
    };
    let mut cache = model::KvCache::new(&pm.model, 1);
    let reply = pm.reply(Some(adapter), &mut cache, &c, &params, &|g| {
        grammar.allowed(g)
    })?;
    let chosen = grammar.chosen(&reply);
    let allowed = grammar.allowed_sets(&reply);
    c.push_reply(&pm.tokenizer, pm.format, &reply, allowed)?;
    let reward = match chosen {
        Some(i) if i == f.went_wrong => 1.0,
        Some(i) if i.abs_diff(f.went_wrong) == 1 => 0.5,
        _ => 0.0,
    };
    Ok((c, reward))
}

#[cfg(test)]
mod tests {
    use super::*;
    use detect::{Actor, Observation, Outcome, Status, TurnRecord};

    fn turn(i: usize, text: &str, action: Action, obs: &str) -> TurnRecord {
        TurnRecord {
            index: i,
            started_unix_ns: 0,
            acted_unix_ns: 0,
            ended_unix_ns: 0,
            text: text.into(),
            thought: String::new(),
            action: Some(action),
            observation: Observation::new(obs, Status::Ok),
            action_tokens: 0,
            observation_tokens: 0,
            subagents: vec![],
        }
    }

    fn transcript(answer: &str, second_obs: &str) -> Transcript {
        let verdict = Verdict::Deficiency {
            deficiency_id: answer.into(),
            component: "tools.schema".into(),
            step: None,
            location: None,
            evidence: "e".into(),
        };
        Transcript {
            episode_id: "e".into(),
            investigated_trace: "t".into(),
            role: Actor::Main,
            task: None,
            policy: "p".into(),
            system_prompt: String::new(),
            started_unix_ns: 0,
            ended_unix_ns: 0,
            prompt_tokens: 0,
            total_tokens: 0,
            turns: vec![
                turn(
                    0,
                    "sql: SELECT 1",
                    Action::Sql {
                        query: "SELECT 1".into(),
                    },
                    "1",
                ),
                turn(
                    1,
                    "sql: SELECT error_message FROM spans",
                    Action::Sql {
                        query: "SELECT error_message FROM spans".into(),
                    },
                    second_obs,
                ),
                turn(
                    2,
                    &format!("answer: {answer} tools.schema | e"),
                    Action::Answer {
                        text: format!("{answer} tools.schema | e"),
                    },
                    "verdict recorded",
                ),
            ],
            outcome: Outcome::Answered { verdict },
        }
    }

    #[test]
    fn the_step_that_showed_the_evidence_is_where_it_went_wrong() {
        let keyword = KeywordPolicy::new().unwrap();
        let truth = Truth {
            component: Some("tools.schema".into()),
            ..Truth::deficiency("P16")
        };
        let f = from_transcript(
            &transcript("C3", "RecursionError: maximum recursion depth exceeded"),
            &truth,
            &keyword,
        )
        .expect("a failed investigation");
        assert_eq!(f.steps.len(), 3);
        assert!(keyword.signature_in("P16", "RecursionError: maximum recursion depth exceeded"));
        assert_eq!(f.went_wrong, 1);
        // No evidence anywhere: the answer step is where it went wrong.
        let f = from_transcript(&transcript("C3", "nothing"), &truth, &keyword).unwrap();
        assert_eq!(f.went_wrong, 2);
        // A correct investigation makes no example.
        assert!(from_transcript(&transcript("P16", "nothing"), &truth, &keyword).is_none());
    }
}
