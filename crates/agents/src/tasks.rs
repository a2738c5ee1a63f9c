//! Task suites: `agents/tasks/gaia/ID.json` and `agents/tasks/swe/ID/task.json`.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::manifest::TaskSuite;

#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    #[error("{path}: cannot read")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
    #[error("no {suite} task {id:?} in {dir} (known: {known})")]
    Unknown {
        suite: &'static str,
        id: String,
        dir: PathBuf,
        known: String,
    },
}

/// How a GAIA answer is compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AnswerType {
    Exact,
    Number,
}

/// A GAIA-like question answered with tools over the corpus.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GaiaTask {
    pub id: String,
    pub question: String,
    pub answer: String,
    pub answer_type: AnswerType,
    pub tools: Vec<String>,
}

/// A SWE-like task: a tiny repository with a failing test.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweTask {
    pub id: String,
    pub issue: String,
    pub test_command: String,
    #[serde(default)]
    pub files: Vec<String>,
    /// The task's directory (holding task.json, repo/, fix.patch); not part of the JSON.
    #[serde(skip)]
    pub dir: PathBuf,
}

impl SweTask {
    pub fn repo_dir(&self) -> PathBuf {
        self.dir.join("repo")
    }
}

/// One task of either suite.
#[derive(Debug, Clone, PartialEq)]
pub enum Task {
    Gaia(GaiaTask),
    Swe(SweTask),
}

impl Task {
    pub fn id(&self) -> &str {
        match self {
            Task::Gaia(t) => &t.id,
            Task::Swe(t) => &t.id,
        }
    }

    pub fn suite(&self) -> TaskSuite {
        match self {
            Task::Gaia(_) => TaskSuite::Gaia,
            Task::Swe(_) => TaskSuite::Swe,
        }
    }

    /// The task file as the agent receives it. A GAIA task goes without its `answer`, so an
    /// agent (or an injected change) cannot read the expected answer from its input.
    pub fn agent_view(&self) -> serde_json::Value {
        match self {
            Task::Gaia(t) => serde_json::json!({
                "id": t.id, "question": t.question,
                "answer_type": t.answer_type, "tools": t.tools,
            }),
            Task::Swe(t) => serde_json::json!({
                "id": t.id, "issue": t.issue, "test_command": t.test_command, "files": t.files,
            }),
        }
    }
}

fn read(path: &Path) -> Result<String, TaskError> {
    std::fs::read_to_string(path).map_err(|source| TaskError::Io {
        path: path.to_owned(),
        source,
    })
}

fn parse<T: for<'de> Deserialize<'de>>(path: &Path, text: &str) -> Result<T, TaskError> {
    serde_json::from_str(text).map_err(|e| TaskError::Invalid {
        path: path.to_owned(),
        reason: format!("line {}, column {}: {e}", e.line(), e.column()),
    })
}

/// Loads one GAIA task file.
pub fn load_gaia(path: &Path) -> Result<GaiaTask, TaskError> {
    let task: GaiaTask = parse(path, &read(path)?)?;
    let invalid = |reason: String| TaskError::Invalid {
        path: path.to_owned(),
        reason,
    };
    let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned());
    if stem.as_deref() != Some(task.id.as_str()) {
        return Err(invalid(format!(
            "field `id`: {:?} differs from the file name",
            task.id
        )));
    }
    if task.question.trim().is_empty() {
        return Err(invalid("field `question`: empty".into()));
    }
    if task.answer.trim().is_empty() {
        return Err(invalid("field `answer`: empty".into()));
    }
    if task.answer_type == AnswerType::Number
        && crate::answers::parse_number(&task.answer).is_none()
    {
        return Err(invalid(format!(
            "field `answer`: {:?} is not a number although `answer_type` is \"number\"",
            task.answer
        )));
    }
    const TOOLS: &[&str] = &["search", "read_file", "calculator", "table_lookup"];
    for tool in &task.tools {
        if !TOOLS.contains(&tool.as_str()) {
            return Err(invalid(format!(
                "field `tools`: unknown tool {tool:?} (known: {})",
                TOOLS.join(", ")
            )));
        }
    }
    Ok(task)
}

/// Loads one SWE task directory.
pub fn load_swe(dir: &Path) -> Result<SweTask, TaskError> {
    let path = dir.join("task.json");
    let mut task: SweTask = parse(&path, &read(&path)?)?;
    let invalid = |reason: String| TaskError::Invalid {
        path: path.clone(),
        reason,
    };
    let name = dir.file_name().map(|s| s.to_string_lossy().into_owned());
    if name.as_deref() != Some(task.id.as_str()) {
        return Err(invalid(format!(
            "field `id`: {:?} differs from the directory name",
            task.id
        )));
    }
    if task.test_command.trim().is_empty() {
        return Err(invalid("field `test_command`: empty".into()));
    }
    if !dir.join("repo").is_dir() {
        return Err(invalid(format!("{}/repo does not exist", dir.display())));
    }
    task.dir = dir.to_owned();
    Ok(task)
}

/// All tasks of a suite under `tasks_dir` (`agents/tasks`), sorted by id.
pub fn load_suite(tasks_dir: &Path, suite: TaskSuite) -> Result<Vec<Task>, TaskError> {
    let dir = tasks_dir.join(suite.as_str());
    let entries = std::fs::read_dir(&dir).map_err(|source| TaskError::Io {
        path: dir.clone(),
        source,
    })?;
    let mut paths: Vec<PathBuf> = entries.filter_map(Result::ok).map(|e| e.path()).collect();
    paths.sort();
    let mut tasks = Vec::new();
    for path in paths {
        match suite {
            TaskSuite::Gaia if path.extension().is_some_and(|e| e == "json") => {
                tasks.push(Task::Gaia(load_gaia(&path)?));
            }
            TaskSuite::Swe if path.join("task.json").is_file() => {
                tasks.push(Task::Swe(load_swe(&path)?));
            }
            _ => {}
        }
    }
    Ok(tasks)
}

/// One task of a suite by id.
pub fn load_task(tasks_dir: &Path, suite: TaskSuite, id: &str) -> Result<Task, TaskError> {
    let dir = tasks_dir.join(suite.as_str());
    let safe = !id.is_empty()
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && !id.starts_with('.');
    let (path_ok, task) = match suite {
        TaskSuite::Gaia => {
            let p = dir.join(format!("{id}.json"));
            (safe && p.is_file(), p)
        }
        TaskSuite::Swe => {
            let p = dir.join(id);
            (safe && p.join("task.json").is_file(), p)
        }
    };
    if !path_ok {
        let known = load_suite(tasks_dir, suite)
            .map(|ts| {
                ts.iter()
                    .map(|t| t.id().to_owned())
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_else(|e| format!("cannot list: {e}"));
        return Err(TaskError::Unknown {
            suite: suite.as_str(),
            id: id.to_owned(),
            dir,
            known,
        });
    }
    match suite {
        TaskSuite::Gaia => Ok(Task::Gaia(load_gaia(&task)?)),
        TaskSuite::Swe => Ok(Task::Swe(load_swe(&task)?)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaia_tasks_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let gaia = dir.path().join("gaia");
        std::fs::create_dir_all(&gaia).unwrap();
        std::fs::write(
            gaia.join("gaia-001.json"),
            r#"{"id":"gaia-001","question":"q?","answer":"1,200","answer_type":"number","tools":["search"]}"#,
        )
        .unwrap();
        let tasks = load_suite(dir.path(), TaskSuite::Gaia).unwrap();
        assert_eq!(tasks.len(), 1);
        let view = tasks[0].agent_view();
        assert!(view.get("answer").is_none());
        assert_eq!(view["question"], "q?");

        std::fs::write(
            gaia.join("gaia-002.json"),
            r#"{"id":"gaia-002","question":"q?","answer":"many","answer_type":"number","tools":[]}"#,
        )
        .unwrap();
        let err = load_suite(dir.path(), TaskSuite::Gaia)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("gaia-002.json") && err.contains("not a number"),
            "{err}"
        );

        let err = load_task(dir.path(), TaskSuite::Gaia, "gaia-404")
            .unwrap_err()
            .to_string();
        assert!(err.contains("gaia-404"), "{err}");
    }
}
