//! Ground-truth labels: where the fault in a trace really is. They live in the `labels` table,
//! which the Detector's connection is not allowed to read, and are never exported with a trace.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One ground-truth answer for a trace. Injected deficiencies fill the code location and the
/// taxonomy ids; chat-log datasets fill `agent`, `step` and `reason`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Label {
    pub trace_id: String,
    /// A taxonomy id such as `P16` or `C3`.
    #[serde(default)]
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
    /// The agent responsible for the failure (chat logs' `mistake_agent`).
    #[serde(default)]
    pub agent: Option<String>,
    /// The step where the failure happened (chat logs' `mistake_step`).
    #[serde(default)]
    pub step: Option<i64>,
    #[serde(default)]
    pub reason: Option<String>,
    /// The label as its producer wrote it, for fields not modelled above.
    #[serde(default)]
    pub source: Value,
}

impl Label {
    /// An empty label for `trace_id`; fill the fields that apply.
    pub fn new(trace_id: impl Into<String>) -> Label {
        Label {
            trace_id: trace_id.into(),
            deficiency_id: None,
            component: None,
            file: None,
            function: None,
            line_start: None,
            line_end: None,
            agent: None,
            step: None,
            reason: None,
            source: Value::Object(Default::default()),
        }
    }
}
