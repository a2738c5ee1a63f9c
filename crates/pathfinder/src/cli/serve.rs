//! `pathfinder serve`: the OpenAI-compatible chat-completions server the agents call.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use llmserve::{ChatBackend, Listen, ModelBackend, ScriptStore, ScriptedBackend, ServerConfig};

/// Which backend answers the requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendKind {
    /// Replays agents/tasks/scripts/NAME/TASK_ID.json with seeded surface variation.
    Scripted,
    /// A local model (not yet available: needs crates/model to generate).
    Model,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Listen on this Unix socket path.
    #[arg(long, value_name = "PATH", conflicts_with = "port")]
    unix: Option<PathBuf>,
    /// Listen on 127.0.0.1:N (0 picks a free port; default 8765 when --unix is not given).
    #[arg(long, value_name = "N")]
    port: Option<u16>,
    /// The backend.
    #[arg(long, value_enum, default_value_t = BackendKind::Scripted)]
    backend: BackendKind,
    /// The scripts directory of the scripted backend.
    #[arg(long, value_name = "DIR", default_value = "agents/tasks/scripts")]
    scripts: PathBuf,
    /// Model weights for the model backend.
    #[arg(long, value_name = "PATH")]
    weights: Option<PathBuf>,
    /// The largest request body accepted, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = llmserve::server::DEFAULT_BODY_LIMIT)]
    body_limit: usize,
}

pub fn run(args: ServeArgs) -> Result<()> {
    let backend: Arc<dyn ChatBackend> = match args.backend {
        BackendKind::Scripted => {
            if !args.scripts.is_dir() {
                bail!(
                    "{}: the scripts directory does not exist (pass --scripts DIR)",
                    args.scripts.display()
                );
            }
            Arc::new(ScriptedBackend::new(ScriptStore::new(&args.scripts)))
        }
        BackendKind::Model => Arc::new(ModelBackend::new(args.weights.clone())?),
    };
    let listen = match (&args.unix, args.port) {
        (Some(path), _) => Listen::Unix(path.clone()),
        (None, port) => Listen::loopback(port.unwrap_or(8765)),
    };
    let mut config = ServerConfig::new(listen);
    config.body_limit = args.body_limit;
    llmserve::server::run_blocking(config, backend, |url| {
        // A reader that went away (a closed pipe) must not take the server down with it.
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "listening on {url}");
        let _ = writeln!(out, "export PATHFINDER_LLM_URL={url}");
        let _ = out.flush();
    })
    .context("the LLM server failed")
}
