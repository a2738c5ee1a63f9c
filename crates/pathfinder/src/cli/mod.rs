//! One module per subcommand.

pub mod agents;
pub mod calibrate;
pub mod collect;
pub mod corpus;
pub mod detect;
pub mod eval;
pub mod eval_models;
pub mod inject;
pub mod model;
pub mod report;
pub mod run;
pub mod serve;
pub mod taxonomy;
pub mod traces;
pub mod train;

use std::path::Path;

use anyhow::{Context, Result};

/// Writes `bytes` to a process-private temporary name beside `path`, then renames it: a
/// reader sees the old file or the new one, never half of one.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path)
        .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))
}
