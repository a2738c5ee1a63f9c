//! The `scripted` backend: replays `agents/tasks/scripts/NAME/TASK_ID.json`.
//!
//! The solution path is fixed by the script, and the model departs from it where the request
//! lacks what a real model needs to follow it ([`crate::script_departure`]); the surface varies, seeded by the request's
//! `seed`, the script key and the step, so that two runs with the same seed see byte-identical
//! replies while different seeds exercise the agent's parsing: JSON content is sometimes
//! wrapped in a Markdown fence, tool-call ids differ, and (in [`crate::sse`]) chunk lengths and
//! keep-alive comments vary.

use std::collections::HashMap;
use std::sync::Mutex;

use serde_json::Value;

use crate::api::{ApiError, ChatRequest, Completion, FinishReason, ToolCallOut};
use crate::backend::{ChatBackend, RequestContext};
use crate::rng::{variation_seed, SplitMix64};
use crate::script::{Fault, ScriptError, ScriptKey, ScriptStore};
use crate::script_departure::{self, Departure};
use crate::SCRIPTED_MODEL;

/// Plays scripts from a [`ScriptStore`].
#[derive(Debug)]
pub struct ScriptedBackend {
    store: ScriptStore,
    /// Requests that met a step's [`crate::script::Fault`] so far, by run, conversation and step.
    faulted: Mutex<HashMap<(ScriptKey, usize), u32>>,
    /// Every departure from a script so far, as `SCRIPT@RUN turn N: DEPARTURE (WHY)`.
    departed: Mutex<Vec<String>>,
}

impl ScriptedBackend {
    pub fn new(store: ScriptStore) -> ScriptedBackend {
        ScriptedBackend {
            store,
            faulted: Mutex::new(HashMap::new()),
            departed: Mutex::new(Vec::new()),
        }
    }

    /// Whether this request meets its step's fault: the first `attempts` requests of a run
    /// for the step do (for `cut_stream`, only streamed requests count).
    fn meets_fault(&self, key: &ScriptKey, turn: usize, fault: &Fault, streaming: bool) -> bool {
        if fault.cut_stream && !streaming {
            return false;
        }
        let mut faulted = self.faulted.lock().expect("fault counter poisoned");
        let seen = faulted.entry((key.clone(), turn)).or_insert(0);
        if *seen >= fault.attempts {
            return false;
        }
        *seen += 1;
        true
    }

    /// Every departure from a script so far, as `SCRIPT@RUN turn N: DEPARTURE (WHY)`: none
    /// for a clean agent.
    pub fn departures(&self) -> Vec<String> {
        self.departed
            .lock()
            .expect("departure log poisoned")
            .clone()
    }

    pub fn store(&self) -> &ScriptStore {
        &self.store
    }
}

/// How a JSON reply is dressed: plain, in a ```json fence, or in a bare ``` fence.
pub fn dress_json(content: &str, rng: &mut SplitMix64) -> String {
    let trimmed = content.trim();
    let is_json = (trimmed.starts_with('{') || trimmed.starts_with('['))
        && serde_json::from_str::<Value>(trimmed).is_ok();
    if !is_json {
        return content.to_owned();
    }
    match rng.range(0, 19) {
        0..=9 => content.to_owned(),
        10..=16 => format!("```json\n{trimmed}\n```"),
        _ => format!("```\n{trimmed}\n```"),
    }
}

/// The error body a real provider sends for a transient failure with `status`.
fn provider_error(status: u16) -> ApiError {
    if status == 429 {
        let mut err = ApiError::server(
            429,
            "Rate limit reached for requests. Please try again shortly.",
        );
        err.kind = "rate_limit_error";
        err.code = Some("rate_limit_exceeded".into());
        err
    } else {
        ApiError::server(
            status,
            "The server had an error while processing your request. Please retry.",
        )
    }
}

fn script_error(err: ScriptError) -> ApiError {
    let message = crate::error_chain(&err);
    match err {
        ScriptError::BadKey { .. } => {
            ApiError::invalid(Some("X-Pathfinder-Script".into()), message)
                .with_code("invalid_script_key")
        }
        ScriptError::NotFound { .. } | ScriptError::NoConversation { .. } => {
            ApiError::not_found(message, "script_not_found")
        }
        ScriptError::Io { .. } | ScriptError::Invalid { .. } => {
            ApiError::server(500, format!("broken script: {message}"))
        }
    }
}

impl ChatBackend for ScriptedBackend {
    fn name(&self) -> &str {
        "scripted"
    }

    fn models(&self) -> Vec<String> {
        vec![SCRIPTED_MODEL.to_owned()]
    }

    fn complete(
        &self,
        request: &ChatRequest,
        ctx: &RequestContext,
    ) -> Result<Completion, ApiError> {
        let Some(header) = &ctx.script_key else {
            return Err(ApiError::invalid(
                Some("X-Pathfinder-Script".into()),
                "The scripted backend needs the X-Pathfinder-Script header \
                 (NAME/TASK_ID/CONVERSATION) to know which script to play.",
            )
            .with_code("missing_script_header"));
        };
        let key = ScriptKey::parse(header).map_err(script_error)?;
        let turn = request.assistant_turns();
        let steps = self.store.conversation(&key).map_err(script_error)?;
        let script_departure::Played {
            step,
            departure,
            why,
        } = script_departure::play(&steps, turn, request);
        if departure != Departure::Scripted {
            self.departed
                .lock()
                .expect("departure log poisoned")
                .push(format!(
                    "{}@{} turn {turn}: {} ({why})",
                    key.as_header(),
                    key.run.as_deref().unwrap_or(""),
                    departure.as_str()
                ));
            tracing::debug!(
                script = %key.as_header(),
                run = key.run.as_deref().unwrap_or(""),
                turn,
                departure = departure.as_str(),
                why,
                "the scripted model departs from its script"
            );
        }
        let fault = step
            .provider_fault
            .as_ref()
            .filter(|f| self.meets_fault(&key, turn, f, request.streaming()));
        if let Some(Fault {
            status: Some(status),
            ..
        }) = fault
        {
            return Err(provider_error(*status));
        }
        let mut rng = SplitMix64::new(variation_seed(
            request.seed.unwrap_or(0),
            &key.as_header(),
            turn,
        ));
        let content = step.content.as_deref().map(|c| dress_json(c, &mut rng));
        // A model offered no tools (or told `tool_choice: "none"`) cannot call one.
        let tool_calls: Vec<ToolCallOut> = if request.tools_allowed() {
            step.tool_calls
                .iter()
                .map(|call| ToolCallOut {
                    id: format!("call_{}", rng.hex(24)),
                    name: call.name.clone(),
                    arguments: call.arguments_text(),
                })
                .collect()
        } else {
            Vec::new()
        };
        let finish_reason = if tool_calls.is_empty() {
            FinishReason::Stop
        } else {
            FinishReason::ToolCalls
        };
        let content = if tool_calls.is_empty() && content.is_none() {
            Some(String::new())
        } else {
            content
        };
        Ok(Completion {
            content,
            tool_calls,
            finish_reason,
            variation_seed: rng.next_u64(),
            cut_stream: fault.is_some_and(|f| f.cut_stream),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_is_sometimes_fenced_and_prose_never() {
        let mut fenced = 0;
        let mut plain = 0;
        for seed in 0..200 {
            let mut rng = SplitMix64::new(seed);
            let out = dress_json("{\"answer\": \"42\"}", &mut rng);
            if out.starts_with("```") {
                assert!(out.ends_with("```"));
                fenced += 1;
            } else {
                assert_eq!(out, "{\"answer\": \"42\"}");
                plain += 1;
            }
            let mut rng = SplitMix64::new(seed);
            assert_eq!(
                dress_json("The answer is {42}", &mut rng),
                "The answer is {42}"
            );
        }
        assert!(fenced > 40 && plain > 40, "{fenced} fenced, {plain} plain");
    }
}
