//! The catalog's types. Enumerations carry their display names, which are also their spelling
//! in the TOML files.

use serde::Serialize;
use std::fmt;

/// Where a deficiency type comes from (the paper's §4.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// Bugs fixed in the pull-request histories of real agent frameworks (P-types).
    Production,
    /// Design flaws from agent-engineering principles (C-types).
    Conceptual,
}

impl Family {
    pub const ALL: [Family; 2] = [Family::Production, Family::Conceptual];

    pub fn as_str(self) -> &'static str {
        match self {
            Family::Production => "production",
            Family::Conceptual => "conceptual",
        }
    }

    /// The id prefix of this family's types.
    pub fn prefix(self) -> char {
        match self {
            Family::Production => 'P',
            Family::Conceptual => 'C',
        }
    }
}

macro_rules! named_enum {
    ($(#[$meta:meta])* $name:ident { $($variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name { $($variant),+ }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The spelling used in the catalog files and on the command line.
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }

            /// Parses the exact catalog spelling, or case-insensitively.
            pub fn parse(text: &str) -> Option<$name> {
                $name::ALL.iter().copied().find(|v| v.as_str().eq_ignore_ascii_case(text.trim()))
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }
    };
}

named_enum! {
    /// The paper's sub-headings of Appendix A: six per family.
    Category {
        Streaming => "Streaming & Response Handling",
        ContextTokens => "Context & Token Management",
        ModelApi => "Model API Issues",
        ToolSchema => "Tool Schema Conflicts",
        AsyncConcurrency => "Async & Concurrency",
        ParsingEncoding => "Parsing & Encoding",
        ArchitectureControl => "Architecture & Control Flow",
        PromptDesign => "Prompt & Instruction Design",
        ToolDesign => "Tool Design & Integration",
        ContextMemory => "Context & Memory Management",
        Coordination => "Coordination & Multi-Agent",
        EvaluationTermination => "Evaluation & Termination",
    }
}

impl Category {
    /// The family every type in this category belongs to.
    pub fn family(self) -> Family {
        match self {
            Category::Streaming
            | Category::ContextTokens
            | Category::ModelApi
            | Category::ToolSchema
            | Category::AsyncConcurrency
            | Category::ParsingEncoding => Family::Production,
            _ => Family::Conceptual,
        }
    }
}

named_enum! {
    /// How a deficiency shows itself when the agent runs.
    Manifestation {
        Crash => "crash",
        ExplicitError => "explicit_error",
        Silent => "silent",
    }
}

named_enum! {
    /// The framework whose pull-request history a production type was taken from.
    SourceFramework {
        SweAgent => "SWE-agent",
        Camel => "CAMEL",
        OpenDeepResearch => "Open Deep Research",
        QwenAgent => "Qwen-Agent",
    }
}

/// A place in an agent where a deficiency can live, such as `llm_client.stream`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Component {
    pub id: String,
    pub description: String,
}

/// One deficiency type of the catalog.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Deficiency {
    /// `P1`…`P27` or `C1`…`C23`.
    pub id: String,
    pub name: String,
    pub category: Category,
    pub family: Family,
    /// For production types: the framework the bug was found in.
    pub source_framework: Option<SourceFramework>,
    pub manifestation: Manifestation,
    /// Component ids this type can target, most specific first.
    pub components: Vec<String>,
    /// What the defective code does and why it hurts.
    pub mechanism: String,
    /// What an analyst would observe in the traces.
    pub trace_signature: String,
}

impl Deficiency {
    /// The numeric part of the id (16 for P16).
    pub fn number(&self) -> u32 {
        self.id[1..].parse().unwrap_or(0)
    }
}
