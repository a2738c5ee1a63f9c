//! Scripts: the scripted LLM's solution path for one agent on one task.
//!
//! `agents/tasks/scripts/NAME/TASK_ID.json` holds, per conversation, the assistant replies in
//! order. A request names its script with `X-Pathfinder-Script: NAME/TASK_ID/CONVERSATION` and
//! gets step *n*, *n* being the number of assistant messages already in its prompt; past the
//! end the last step repeats. Parsing is strict (unknown fields are errors) so that a typo in
//! a script is reported with its file and field instead of silently playing a different path.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::Deserialize;
use serde_json::Value;

/// A script that could not be found or is malformed.
#[derive(Debug, thiserror::Error)]
pub enum ScriptError {
    #[error("bad script key {key:?}: {reason} (expected NAME/TASK_ID/CONVERSATION)")]
    BadKey { key: String, reason: &'static str },
    #[error("no script for agent {agent:?} and task {task:?}: {path} does not exist")]
    NotFound {
        agent: String,
        task: String,
        path: PathBuf,
    },
    #[error("{path}: cannot read")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
    #[error("{path}: no conversation {conversation:?} (the script has: {available})")]
    NoConversation {
        path: PathBuf,
        conversation: String,
        available: String,
    },
}

/// `NAME/TASK_ID/CONVERSATION`, each part a safe file-name component. The task part may carry
/// `@RUN`, a tag the runner gives each agent run so that a [`Fault`]'s attempts are counted per
/// run; the tag changes nothing else (the reply's surface is seeded without it).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ScriptKey {
    pub agent: String,
    pub task: String,
    pub conversation: String,
    pub run: Option<String>,
}

impl ScriptKey {
    pub fn parse(text: &str) -> Result<ScriptKey, ScriptError> {
        let bad = |reason| ScriptError::BadKey {
            key: text.to_owned(),
            reason,
        };
        let parts: Vec<&str> = text.trim().split('/').collect();
        if parts.len() != 3 {
            return Err(bad("it must have exactly three '/'-separated parts"));
        }
        let (task, run) = match parts[1].split_once('@') {
            Some((task, run)) => (task, Some(run)),
            None => (parts[1], None),
        };
        for part in [parts[0], task, parts[2]].iter().chain(run.as_ref()) {
            let safe = !part.is_empty()
                && !part.starts_with('.')
                && part
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
            if !safe {
                return Err(bad("parts may hold only letters, digits, '-', '_' and '.', and may not start with '.'"));
            }
        }
        Ok(ScriptKey {
            agent: parts[0].to_owned(),
            task: task.to_owned(),
            conversation: parts[2].to_owned(),
            run: run.map(str::to_owned),
        })
    }

    /// The key without its run tag, as a header would send it.
    pub fn as_header(&self) -> String {
        format!("{}/{}/{}", self.agent, self.task, self.conversation)
    }
}

/// One scripted tool call; `arguments` is an object (serialised compactly) or raw JSON text.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedCall {
    pub name: String,
    pub arguments: Value,
}

impl ScriptedCall {
    /// The arguments as the JSON text a model would emit.
    pub fn arguments_text(&self) -> String {
        match &self.arguments {
            Value::String(raw) => raw.clone(),
            other => other.to_string(),
        }
    }
}

/// One assistant reply of a conversation.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    #[serde(default)]
    pub content: Option<String>,
    #[serde(default)]
    pub tool_calls: Vec<ScriptedCall>,
    /// A note for humans reading the script; never sent.
    #[serde(default)]
    pub comment: Option<String>,
    /// How the model reacts to what its last tool call returned (see [`Reaction`]).
    #[serde(default)]
    pub unless_observation_mentions: Option<Reaction>,
    /// A transient provider failure on this step (see [`Fault`]).
    #[serde(default)]
    pub provider_fault: Option<Fault>,
    /// Facts (numbers, file names) this step states that the model works out itself — a sum,
    /// a date difference, a file name from a listing's naming pattern — rather than copies
    /// from its prompt; [`crate::script_departure`] does not look for them in the prompt.
    #[serde(default)]
    pub computed: Vec<String>,
}

/// A provider failure the first `attempts` requests for a step meet, as real APIs fail now
/// and then: an HTTP error status (429 rate limit, 5xx), or a stream that breaks off before
/// its finish reason and `[DONE]` (`cut_stream`, streamed requests only). A clean agent
/// retries or falls back and goes on; an agent whose retries or fallbacks were injected away
/// does not. Attempts are counted per run (the key's `@RUN` tag) and step.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fault {
    #[serde(default = "one")]
    pub attempts: u32,
    #[serde(default)]
    pub status: Option<u16>,
    #[serde(default)]
    pub cut_stream: bool,
}

fn one() -> u32 {
    1
}

/// A step's alternative for when the latest observation does not say what the model needs to
/// go on: a model told only "read_file failed" cannot correct the path it got wrong, so it
/// repeats the call, while one told "harrowmere/lighthose.md not found" fixes the typo. This is
/// what makes a deficiency in error reporting (C15) change a scripted run at all.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reaction {
    /// Texts any one of which, in the observation since the model's last reply (see
    /// [`crate::api::ChatRequest::last_observation`]), lets the step play as written.
    pub any_of: Vec<String>,
    /// The step played otherwise; it may not react in turn.
    pub play: Box<Step>,
}

impl Step {
    /// The step to play given what the prompt says after the model's last reply (`None`
    /// before its first reply); `last_observation` is only called for a step that reacts.
    pub fn react(&self, last_observation: impl FnOnce() -> Option<String>) -> &Step {
        let Some(reaction) = &self.unless_observation_mentions else {
            return self;
        };
        match last_observation() {
            Some(text) if !reaction.any_of.iter().any(|needle| text.contains(needle)) => {
                &reaction.play
            }
            _ => self,
        }
    }

    /// The commands and tools the step uses: its tool calls' names, and the first word of
    /// each fenced block in its text (a command-line agent's action, `run_tests`).
    pub fn commands(&self) -> Vec<String> {
        let mut out: Vec<String> = self.tool_calls.iter().map(|c| c.name.clone()).collect();
        if let Some(content) = &self.content {
            for block in content.split("```").skip(1).step_by(2) {
                if let Some(word) = block.split_whitespace().next() {
                    out.push(word.to_owned());
                }
            }
        }
        out
    }
}

/// A parsed script file.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Script {
    pub agent: String,
    pub task: String,
    pub conversations: BTreeMap<String, Vec<Step>>,
    #[serde(default)]
    pub comment: Option<String>,
}

impl Script {
    /// Parses and checks a script; `path` is only used in messages.
    pub fn parse(path: &Path, text: &str) -> Result<Script, ScriptError> {
        let invalid = |reason: String| ScriptError::Invalid {
            path: path.to_owned(),
            reason,
        };
        let script: Script = serde_json::from_str(text)
            .map_err(|e| invalid(format!("line {}, column {}: {}", e.line(), e.column(), e)))?;
        if script.conversations.is_empty() {
            return Err(invalid("field `conversations`: no conversation".into()));
        }
        for (name, steps) in &script.conversations {
            if steps.is_empty() {
                return Err(invalid(format!("field `conversations.{name}`: no step")));
            }
            for (i, step) in steps.iter().enumerate() {
                let at = format!("conversations.{name}[{i}]");
                if step.content.is_none() && step.tool_calls.is_empty() {
                    return Err(invalid(format!(
                        "field `{at}`: a step needs `content` or `tool_calls`"
                    )));
                }
                if let Some(fault) = &step.provider_fault {
                    let at = format!("{at}.provider_fault");
                    let problem = match (fault.status, fault.cut_stream) {
                        (Some(429 | 500..=599), false) | (None, true) => None,
                        (Some(status), false) => Some(format!(
                            "field `{at}.status`: {status} is not a transient failure (429 or 5xx)"
                        )),
                        _ => Some(format!(
                            "field `{at}`: give exactly one of `status` and `cut_stream`"
                        )),
                    };
                    if let Some(problem) = problem {
                        return Err(invalid(problem));
                    }
                    if fault.attempts == 0 {
                        return Err(invalid(format!(
                            "field `{at}.attempts`: must be at least 1"
                        )));
                    }
                }
                if let Some(reaction) = &step.unless_observation_mentions {
                    let at = format!("{at}.unless_observation_mentions");
                    if reaction.any_of.iter().all(|t| t.is_empty()) {
                        return Err(invalid(format!(
                            "field `{at}.any_of`: needs at least one non-empty text"
                        )));
                    }
                    let play = &reaction.play;
                    if play.unless_observation_mentions.is_some() || play.provider_fault.is_some() {
                        return Err(invalid(format!(
                            "field `{at}.play`: a reaction's step may not react or fail in turn"
                        )));
                    }
                    if play.content.is_none() && play.tool_calls.is_empty() {
                        return Err(invalid(format!(
                            "field `{at}.play`: a step needs `content` or `tool_calls`"
                        )));
                    }
                }
                for (j, call) in step.tool_calls.iter().enumerate() {
                    if call.name.is_empty() {
                        return Err(invalid(format!("field `{at}.tool_calls[{j}].name`: empty")));
                    }
                    if !(call.arguments.is_object() || call.arguments.is_string()) {
                        return Err(invalid(format!(
                            "field `{at}.tool_calls[{j}].arguments`: must be an object or a JSON string"
                        )));
                    }
                }
            }
        }
        Ok(script)
    }

    /// Step `n` of `conversation`, or its last step when `n` is past the end.
    pub fn step(&self, conversation: &str) -> Option<&[Step]> {
        self.conversations.get(conversation).map(Vec::as_slice)
    }
}

/// Loads scripts from a directory on demand and keeps them for the server's lifetime.
#[derive(Debug)]
pub struct ScriptStore {
    dir: PathBuf,
    cache: Mutex<HashMap<(String, String), Arc<Script>>>,
}

impl ScriptStore {
    /// A store over `dir` (normally `agents/tasks/scripts`).
    pub fn new(dir: impl Into<PathBuf>) -> ScriptStore {
        ScriptStore {
            dir: dir.into(),
            cache: Mutex::new(HashMap::new()),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file holding the script of `agent` on `task`.
    pub fn path_of(&self, agent: &str, task: &str) -> PathBuf {
        self.dir.join(agent).join(format!("{task}.json"))
    }

    /// The script of `agent` on `task`.
    pub fn script(&self, agent: &str, task: &str) -> Result<Arc<Script>, ScriptError> {
        let cache_key = (agent.to_owned(), task.to_owned());
        if let Some(found) = self
            .cache
            .lock()
            .expect("script cache poisoned")
            .get(&cache_key)
        {
            return Ok(found.clone());
        }
        let path = self.path_of(agent, task);
        let text = std::fs::read_to_string(&path).map_err(|source| {
            if source.kind() == std::io::ErrorKind::NotFound {
                ScriptError::NotFound {
                    agent: agent.to_owned(),
                    task: task.to_owned(),
                    path: path.clone(),
                }
            } else {
                ScriptError::Io {
                    path: path.clone(),
                    source,
                }
            }
        })?;
        let script = Script::parse(&path, &text)?;
        if script.agent != agent || script.task != task {
            return Err(ScriptError::Invalid {
                path,
                reason: format!(
                    "fields `agent`/`task` say {:?}/{:?} but the file is the script of {agent:?}/{task:?}",
                    script.agent, script.task
                ),
            });
        }
        let script = Arc::new(script);
        self.cache
            .lock()
            .expect("script cache poisoned")
            .insert(cache_key, script.clone());
        Ok(script)
    }

    /// The step to play for `key` when the prompt already holds `assistant_turns` replies.
    pub fn lookup(&self, key: &ScriptKey, assistant_turns: usize) -> Result<Step, ScriptError> {
        let steps = self.conversation(key)?;
        Ok(steps[assistant_turns.min(steps.len() - 1)].clone())
    }

    /// Every step of `key`'s conversation (never empty).
    pub fn conversation(&self, key: &ScriptKey) -> Result<Vec<Step>, ScriptError> {
        let script = self.script(&key.agent, &key.task)?;
        let steps = script
            .step(&key.conversation)
            .ok_or_else(|| ScriptError::NoConversation {
                path: self.path_of(&key.agent, &key.task),
                conversation: key.conversation.clone(),
                available: script
                    .conversations
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", "),
            })?;
        Ok(steps.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCRIPT: &str = r#"{
      "agent": "toolcaller", "task": "gaia-001",
      "conversations": {"main": [
        {"content": null, "tool_calls": [{"name": "search", "arguments": {"query": "x"}}]},
        {"content": "The answer is 42."}
      ]}
    }"#;

    fn store() -> (tempfile::TempDir, ScriptStore) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("toolcaller")).unwrap();
        std::fs::write(dir.path().join("toolcaller/gaia-001.json"), SCRIPT).unwrap();
        let store = ScriptStore::new(dir.path());
        (dir, store)
    }

    #[test]
    fn key_parsing() {
        let key = ScriptKey::parse("toolcaller/gaia-001/main").unwrap();
        assert_eq!(key.conversation, "main");
        assert_eq!(key.as_header(), "toolcaller/gaia-001/main");
        for bad in [
            "toolcaller/gaia-001",
            "a/b/c/d",
            "../x/main",
            "a//main",
            "a/b c/main",
        ] {
            assert!(ScriptKey::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn lookup_plays_step_n_and_repeats_the_last() {
        let (_dir, store) = store();
        let key = ScriptKey::parse("toolcaller/gaia-001/main").unwrap();
        assert_eq!(store.lookup(&key, 0).unwrap().tool_calls[0].name, "search");
        assert_eq!(
            store.lookup(&key, 1).unwrap().content.as_deref(),
            Some("The answer is 42.")
        );
        assert_eq!(
            store.lookup(&key, 7).unwrap().content.as_deref(),
            Some("The answer is 42.")
        );
    }

    #[test]
    fn lookup_errors_name_what_is_missing() {
        let (_dir, store) = store();
        let missing = ScriptKey::parse("toolcaller/gaia-999/main").unwrap();
        assert!(matches!(
            store.lookup(&missing, 0),
            Err(ScriptError::NotFound { .. })
        ));
        let conv = ScriptKey::parse("toolcaller/gaia-001/planner").unwrap();
        let err = store.lookup(&conv, 0).unwrap_err().to_string();
        assert!(err.contains("planner") && err.contains("main"), "{err}");
    }

    #[test]
    fn keys_carry_an_optional_run_tag_outside_the_header() {
        let key = ScriptKey::parse("toolcaller/gaia-001@3f2a-7/main").unwrap();
        assert_eq!(key.task, "gaia-001");
        assert_eq!(key.run.as_deref(), Some("3f2a-7"));
        assert_eq!(key.as_header(), "toolcaller/gaia-001/main");
        assert!(ScriptKey::parse("toolcaller/gaia-001@/main").is_err());
        assert!(ScriptKey::parse("toolcaller/gaia-001@a b/main").is_err());
    }

    #[test]
    fn a_step_reacts_to_what_the_last_observation_says() {
        let script = Script::parse(
            Path::new("s.json"),
            r#"{"agent":"a","task":"t","conversations":{"main":[
              {"content": "fixed", "unless_observation_mentions":
                {"any_of": ["lighthose.md"], "play": {"content": "retried"}}}]}}"#,
        )
        .unwrap();
        let step = &script.step("main").unwrap()[0];
        let told = "Error: no such file 'harrowmere/lighthose.md'";
        let seen = |text: &str| {
            let text = text.to_owned();
            move || Some(text)
        };
        assert_eq!(step.react(seen(told)).content.as_deref(), Some("fixed"));
        let untold = "Error: read_file failed";
        assert_eq!(step.react(seen(untold)).content.as_deref(), Some("retried"));
        assert_eq!(step.react(|| None).content.as_deref(), Some("fixed"));
    }

    #[test]
    fn reactions_and_faults_are_checked() {
        let p = Path::new("s.json");
        let parse = |step: &str| {
            Script::parse(
                p,
                &format!(r#"{{"agent":"a","task":"t","conversations":{{"main":[{step}]}}}}"#),
            )
        };
        let err = |step: &str| parse(step).unwrap_err().to_string();
        assert!(err(r#"{"content":"x","provider_fault":{"status":404}}"#)
            .contains("conversations.main[0].provider_fault.status"));
        assert!(
            err(r#"{"content":"x","provider_fault":{"status":503,"cut_stream":true}}"#)
                .contains("exactly one")
        );
        assert!(
            err(r#"{"content":"x","provider_fault":{"status":503,"attempts":0}}"#)
                .contains("attempts")
        );
        assert!(err(r#"{"content":"x","unless_observation_mentions":{"any_of":[""],"play":{"content":"y"}}}"#)
            .contains("any_of"));
        assert!(err(r#"{"content":"x","unless_observation_mentions":{"any_of":["a"],"play":{"content":"y","provider_fault":{"status":503}}}}"#)
            .contains("play"));
        let ok =
            parse(r#"{"content":"x","provider_fault":{"cut_stream":true,"attempts":2}}"#).unwrap();
        let fault = ok.step("main").unwrap()[0].provider_fault.clone().unwrap();
        assert_eq!(
            (fault.attempts, fault.status, fault.cut_stream),
            (2, None, true)
        );
    }

    #[test]
    fn malformed_scripts_name_the_field() {
        let p = Path::new("s.json");
        let err = Script::parse(
            p,
            r#"{"agent":"a","task":"t","conversations":{"main":[{"content":null}]}}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("conversations.main[0]"), "{err}");
        let err = Script::parse(
            p,
            r#"{"agent":"a","task":"t","conversations":{"main":[{"tool_call":[]}]}}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("tool_call"), "{err}");
        let err = Script::parse(
            p,
            r#"{"agent":"a","task":"t","conversations":{"main":[{"tool_calls":[{"name":"x","arguments":3}]}]}}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("arguments"), "{err}");
    }

    #[test]
    fn script_must_match_its_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("roleplay")).unwrap();
        std::fs::write(dir.path().join("roleplay/gaia-001.json"), SCRIPT).unwrap();
        let store = ScriptStore::new(dir.path());
        assert!(store.script("roleplay", "gaia-001").is_err());
    }
}
