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

/// `NAME/TASK_ID/CONVERSATION`, each part a safe file-name component.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ScriptKey {
    pub agent: String,
    pub task: String,
    pub conversation: String,
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
        for part in &parts {
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
            task: parts[1].to_owned(),
            conversation: parts[2].to_owned(),
        })
    }

    /// The key as sent in the header.
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
        Ok(steps[assistant_turns.min(steps.len() - 1)].clone())
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
