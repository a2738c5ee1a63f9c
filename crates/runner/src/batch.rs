//! Many episodes at once: a bounded number run concurrently, each with its own deadline, so a
//! failed or hung episode never holds up the others; a progress bar; and an interruption path
//! (ctrl-C, SIGTERM) after which nothing of the batch is left running or stored in the engine.

use std::sync::Arc;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use tokio::sync::Semaphore;

use crate::backend::Backend;
use crate::cancel::Cancel;
use crate::episode::run_episode;
use crate::spec::{EpisodeError, EpisodeOutcome, EpisodeSpec};

/// The batch's results, in the order of the specs.
#[derive(Debug)]
pub struct BatchReport {
    pub outcomes: Vec<Result<EpisodeOutcome, EpisodeError>>,
    /// A signal (or the caller) cancelled the batch.
    pub interrupted: bool,
    /// Sandboxes the final sweep still found and removed (0 when episodes cleaned up after
    /// themselves, which is the expected case).
    pub swept: usize,
}

/// A progress bar over `n` episodes (drawn on stderr only when it is a terminal).
pub fn progress_bar(n: usize) -> ProgressBar {
    let pb = ProgressBar::new(n as u64);
    pb.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} episodes {msg}",
        )
        .expect("a valid template"),
    );
    pb.enable_steady_tick(Duration::from_millis(200));
    pb
}

/// A line above the bar, or on stderr when the bar is not drawn (not a terminal).
fn say(progress: &ProgressBar, line: &str) {
    if progress.is_hidden() {
        eprintln!("{line}");
    } else {
        progress.println(line);
    }
}

/// Runs `specs` with at most `concurrency` at once until all finish or `cancel` fires.
/// Every episode removes its own sandbox; a final sweep removes anything left.
pub async fn run_batch(
    backend: Arc<Backend>,
    specs: Vec<EpisodeSpec>,
    concurrency: usize,
    cancel: Cancel,
    progress: ProgressBar,
) -> BatchReport {
    let semaphore = Arc::new(Semaphore::new(concurrency.max(1)));
    let mut set = tokio::task::JoinSet::new();
    for (index, spec) in specs.iter().cloned().enumerate() {
        let backend = backend.clone();
        let semaphore = semaphore.clone();
        let cancel = cancel.clone();
        let progress = progress.clone();
        set.spawn(async move {
            let id = spec.id().to_owned();
            let permit = tokio::select! {
                p = semaphore.acquire_owned() => p.expect("the semaphore is never closed"),
                _ = cancel.cancelled() => return (index, Err(EpisodeError::Cancelled { id })),
            };
            let result = run_episode(&backend, &spec, &cancel).await;
            drop(permit);
            match &result {
                Ok(o) => say(&progress, &o.summary()),
                Err(EpisodeError::Cancelled { .. }) => {}
                Err(e) => say(&progress, &format!("{id}: error: {e}")),
            }
            progress.inc(1);
            (index, result)
        });
    }
    let mut outcomes: Vec<Option<Result<EpisodeOutcome, EpisodeError>>> =
        specs.iter().map(|_| None).collect();
    while let Some(joined) = set.join_next().await {
        match joined {
            Ok((index, result)) => outcomes[index] = Some(result),
            Err(e) => tracing::error!("an episode task failed: {e}"),
        }
    }
    let swept = backend.sweep().await;
    progress.finish_and_clear();
    BatchReport {
        outcomes: outcomes
            .into_iter()
            .zip(&specs)
            .map(|(o, spec)| {
                o.unwrap_or_else(|| {
                    Err(EpisodeError::Sandbox {
                        id: spec.id().to_owned(),
                        reason: "the episode's task panicked".into(),
                    })
                })
            })
            .collect(),
        interrupted: cancel.is_cancelled(),
        swept,
    }
}

/// [`run_batch`] that cancels itself on ctrl-C or SIGTERM, waits for every episode to remove
/// its sandbox, and sweeps. Further signals are absorbed until that is done, so that an
/// impatient second ctrl-C cannot leave containers behind.
pub async fn run_batch_interruptible(
    backend: Arc<Backend>,
    specs: Vec<EpisodeSpec>,
    concurrency: usize,
    progress: ProgressBar,
) -> BatchReport {
    let cancel = Cancel::new();
    let watcher = {
        let cancel = cancel.clone();
        let progress = progress.clone();
        tokio::spawn(async move {
            let mut signals = 0;
            loop {
                crate::cancel::interruption().await;
                signals += 1;
                cancel.cancel();
                say(
                    &progress,
                    if signals == 1 {
                        "interrupted: stopping every episode and removing its sandbox"
                    } else {
                        "interrupted again: still removing sandboxes"
                    },
                );
            }
        })
    };
    let batch = run_batch(
        backend.clone(),
        specs,
        concurrency,
        cancel.clone(),
        progress,
    );
    let report = batch.await;
    watcher.abort();
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_bar_has_a_valid_template() {
        let pb = progress_bar(3);
        pb.inc(1);
        assert_eq!(pb.position(), 1);
        pb.finish_and_clear();
    }
}
