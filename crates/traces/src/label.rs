//! Ground truth: where the fault in a trace really is. Labels live in the `labels` table, which
//! the Detector's connection is not allowed to read, and are never exported with a trace.
//!
//! [`Truth`] is the project's one ground-truth type: the store keeps it inside a [`Label`], the
//! evaluation scores answers against it and the rewards pay by it.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Where the fault really is. Injected deficiencies fill the taxonomy id and the code location;
/// chat-log datasets fill `agent` and `step` (and may leave the id empty); a healthy run's id is
/// `taxonomy::NONE`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Truth {
    /// A taxonomy id such as `P16` or `C3`, or `none`. (`deficiency` is how the trainer's
    /// saved reviews spelled it before there was one truth type.)
    #[serde(default, alias = "deficiency")]
    pub deficiency_id: Option<String>,
    /// A component id from `deficiencies/components.toml`.
    #[serde(default)]
    pub component: Option<String>,
    #[serde(default)]
    pub file: Option<String>,
    #[serde(default)]
    pub function: Option<String>,
    #[serde(default)]
    pub line_start: Option<i64>,
    #[serde(default)]
    pub line_end: Option<i64>,
    /// The agent responsible for the failure (chat logs' `mistake_agent`; in a corpus, the agent
    /// of the step where the injected run first departs from its clean twin).
    #[serde(default)]
    pub agent: Option<String>,
    /// The step where the failure happens (chat logs' `mistake_step`; in a corpus, the first
    /// step where the injected run departs from its clean twin).
    #[serde(default)]
    pub step: Option<i64>,
}

impl Truth {
    /// A deficiency's truth with nothing located yet.
    pub fn deficiency(id: impl Into<String>) -> Truth {
        Truth {
            deficiency_id: Some(id.into()),
            ..Truth::default()
        }
    }

    /// The taxonomy id, or `""` where the label names none (blame-only chat logs).
    pub fn id(&self) -> &str {
        self.deficiency_id.as_deref().unwrap_or("")
    }

    /// A healthy run: its id is `none`.
    pub fn is_healthy(&self) -> bool {
        self.id().eq_ignore_ascii_case(taxonomy::NONE)
    }
}

/// One stored ground-truth answer for a trace: its [`Truth`], with the reason and the label as
/// its producer wrote it. In JSON the truth's fields sit beside `trace_id` (flattened), as they
/// always have.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Label {
    pub trace_id: String,
    #[serde(flatten)]
    pub truth: Truth,
    #[serde(default)]
    pub reason: Option<String>,
    /// The label as its producer wrote it, for fields not modelled above.
    #[serde(default)]
    pub source: Value,
}

impl Label {
    /// An empty label for `trace_id`; fill the fields that apply.
    pub fn new(trace_id: impl Into<String>) -> Label {
        Label::of(trace_id, Truth::default())
    }

    /// The label of `trace_id` saying `truth`.
    pub fn of(trace_id: impl Into<String>, truth: Truth) -> Label {
        Label {
            trace_id: trace_id.into(),
            truth,
            reason: None,
            source: Value::Object(Default::default()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_label_reads_and_writes_the_flat_json_it_always_had() {
        let text = r#"{"trace_id":"t1","deficiency_id":"P16","component":"llm_client","file":"a.py","step":3,"reason":"r","source":{"episode":"e"}}"#;
        let label: Label = serde_json::from_str(text).unwrap();
        assert_eq!(label.truth.id(), "P16");
        assert_eq!(label.truth.step, Some(3));
        assert_eq!(label.reason.as_deref(), Some("r"));
        let back = serde_json::to_value(&label).unwrap();
        assert_eq!(back["deficiency_id"], "P16");
        assert_eq!(back["file"], "a.py");
        assert!(back.get("truth").is_none());
        let again: Label = serde_json::from_value(back).unwrap();
        assert_eq!(again, label);
    }

    #[test]
    fn healthy_is_the_none_id_in_any_case() {
        assert!(Truth::deficiency("NONE").is_healthy());
        assert!(!Truth::deficiency("P1").is_healthy());
        assert!(!Truth::default().is_healthy());
        assert_eq!(Truth::default().id(), "");
    }
}
