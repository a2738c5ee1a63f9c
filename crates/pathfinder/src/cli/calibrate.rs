//! `pathfinder calibrate`: sets a checkpoint's operating point on a user's own healthy runs
//! (a conformal threshold on the decision head's deficiency score, `policy::calibration`),
//! and saves it beside the checkpoint, where `detect` and `eval` find it.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};

use super::eval_models;

#[derive(Debug, Args)]
pub struct CalibrateArgs {
    /// The trace store holding the healthy runs.
    #[arg(long)]
    pub db: PathBuf,
    /// The healthy runs: a file (JSON Lines with `trace_id`, or one id a line) or a
    /// comma-separated list of trace ids. 19 or more bound the false-positive rate at 5%.
    #[arg(long, value_name = "IDS|FILE", required_unless_present = "unlabelled")]
    pub healthy: Option<String>,
    /// Runs of your framework whose health you do not know (`all`: every trace in the store),
    /// most of them healthy: a framed checkpoint then reads traces relative to their median.
    /// Alone it sets no threshold and false positives are not bounded; with --healthy the
    /// healthy runs, read through that frame, set the threshold.
    #[arg(long, value_name = "IDS|FILE|all")]
    pub unlabelled: Option<String>,
    /// A training checkpoint with a decision head (checkpoints/RUN/step-N).
    #[arg(long, value_name = "DIR")]
    pub checkpoint: PathBuf,
    /// The false-positive rate to hold on runs like the healthy ones (with --healthy).
    #[arg(long, default_value_t = 0.05, requires = "healthy")]
    pub alpha: f64,
    /// What the healthy runs are (your framework or deployment), shown wherever the
    /// calibration is used [default: the store's file name].
    #[arg(long)]
    pub name: Option<String>,
    /// Set only the threshold: do not move the head's input so that the healthy runs' mean
    /// sits where the training split's healthy traces did (`policy::calibration::recentre_shift`).
    #[arg(long, requires = "healthy")]
    pub no_recentre: bool,
    /// Write the calibration here instead of DIR/calibration.json.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}

pub fn run(args: CalibrateArgs) -> Result<()> {
    let healthy = match &args.healthy {
        Some(h) => run_ids(h, "--healthy")?,
        None => Vec::new(),
    };
    let unlabelled = match args.unlabelled.as_deref() {
        Some("all") => all_ids(&args.db)?,
        Some(runs) => run_ids(runs, "--unlabelled")?,
        None => Vec::new(),
    };
    if healthy.is_empty() && unlabelled.is_empty() {
        bail!("give the runs to calibrate on: --healthy IDS|FILE and/or --unlabelled IDS|FILE|all");
    }
    check_ids(&args.db, &healthy)?;
    check_ids(&args.db, &unlabelled)?;
    let name = args.name.clone().unwrap_or_else(|| {
        args.db
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "healthy runs".into())
    });
    eval_models::check_checkpoint(&args.checkpoint)?;
    let trained = eval_models::load_checkpoint(&args.checkpoint)?
        .calibrated(&eval_models::CalibrationChoice::Off)?;
    // Runs of unknown health only set a frame: refuse a head without frames before the model
    // reads every run.
    if !unlabelled.is_empty() {
        if let Some((head, _)) = rl::head::load(&trained.dir, trained.adapter)? {
            head.check_framed()
                .with_context(|| format!("{}", args.checkpoint.display()))?;
        }
    }
    // Both sets in one reading: the runs of unknown health, then the healthy ones.
    let ids: Vec<String> = unlabelled.iter().chain(&healthy).cloned().collect();
    let bar = ProgressBar::new(ids.len() as u64);
    bar.set_style(
        ProgressStyle::with_template("scoring {bar:30} {pos}/{len} runs").expect("valid template"),
    );
    let (head, mut inputs) = trained.head_inputs(&args.db, &ids, |i| bar.set_position(i as u64))?;
    bar.finish_and_clear();
    let inputs_healthy = inputs.split_off(unlabelled.len());
    let unlabelled_rows: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
    if healthy.is_empty() {
        let calibration = head
            .frame_on(&name, &unlabelled_rows)
            .with_context(|| format!("{}", args.checkpoint.display()))?;
        let written = save(&calibration, &args)?;
        let flagged = calibration
            .healthy_scores
            .iter()
            .filter(|s| **s > 0.5)
            .count();
        println!("{}", calibration.describe());
        println!(
            "{flagged} of {} runs score above 0.5 through their own frame (none of them is known to be healthy or deficient)",
            unlabelled_rows.len()
        );
        println!("wrote {}", written.display());
        return Ok(());
    }
    let inputs = inputs_healthy;
    // Before calibration: as `detect` reads them without one (a framed head through its best
    // guess of a frame).
    let uncalibrated_frame = head.frame_for(None);
    let flagged_before = inputs
        .iter()
        .filter(|x| {
            let x = match &uncalibrated_frame {
                Some(f) => f.apply(x),
                None => x.to_vec(),
            };
            policy::calibration::deficiency_score(&head.types, &head.type_model.log_probs(&x)) > 0.5
        })
        .count();
    let recentre = !args.no_recentre && !head.healthy_mean.is_empty();
    if !args.no_recentre && !recentre {
        tracing::warn!(
            "{}: the head recorded no healthy mean (fitted without healthy traces, or before heads kept one); setting the threshold only",
            args.checkpoint.display()
        );
    }
    let rows: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
    let calibration = if unlabelled_rows.is_empty() {
        head.calibration_on(&name, &rows, args.alpha, recentre)?
    } else {
        head.calibration_framed_by(&name, &unlabelled_rows, &rows, args.alpha, recentre)
            .with_context(|| format!("{}", args.checkpoint.display()))?
    };
    let written = save(&calibration, &args)?;
    println!("{}", calibration.describe());
    println!(
        "healthy scores{}: min {:.3}, median {:.3}, max {:.3}; {} of {} scored above 0.5 before calibration",
        if calibration.recentre.is_empty() { "" } else { " (recentred)" },
        calibration.healthy_scores[0],
        calibration.healthy_scores[calibration.healthy_scores.len() / 2],
        calibration.healthy_scores[calibration.healthy_scores.len() - 1],
        flagged_before,
        inputs.len()
    );
    if let Some(frame) = calibration
        .frame
        .as_ref()
        .filter(|_| !unlabelled_rows.is_empty())
    {
        println!(
            "frame: the median of {} ({} traces), the threshold on the {} healthy runs read through it",
            frame.name,
            frame.traces,
            rows.len()
        );
    }
    println!("wrote {}", written.display());
    Ok(())
}

/// Writes `calibration` to `--out`, or beside the checkpoint.
fn save(calibration: &policy::calibration::Calibration, args: &CalibrateArgs) -> Result<PathBuf> {
    Ok(match &args.out {
        Some(path) => {
            let dir = path.parent().filter(|p| !p.as_os_str().is_empty());
            let tmp_dir = dir.unwrap_or(Path::new("."));
            let saved = calibration.save(tmp_dir)?;
            if saved != *path {
                std::fs::rename(&saved, path)
                    .with_context(|| format!("moving {} to {}", saved.display(), path.display()))?;
            }
            path.clone()
        }
        None => calibration.save(&args.checkpoint)?,
    })
}

/// Every trace of the store, in id order.
fn all_ids(db: &Path) -> Result<Vec<String>> {
    let store =
        traces::Store::open_read_only(db).with_context(|| format!("opening {}", db.display()))?;
    let mut stmt = store
        .connection()
        .prepare("SELECT trace_id FROM traces ORDER BY trace_id")?;
    let ids = stmt
        .query_map([], |r| r.get::<_, String>(0))?
        .collect::<std::result::Result<Vec<_>, _>>()?;
    if ids.is_empty() {
        bail!("--unlabelled all: {} holds no trace", db.display());
    }
    Ok(ids)
}

/// The ids `flag` names: a file's (JSON Lines with `trace_id`, or bare ids) or the list's.
fn run_ids(arg: &str, flag: &str) -> Result<Vec<String>> {
    let path = Path::new(arg);
    let ids: Vec<String> = if path.is_file() {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let mut ids = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            if line.starts_with('{') {
                let value: serde_json::Value = serde_json::from_str(line)
                    .with_context(|| format!("{} line {}: not JSON", path.display(), i + 1))?;
                match value.get("trace_id").and_then(serde_json::Value::as_str) {
                    Some(id) if !id.is_empty() => ids.push(id.to_owned()),
                    _ => bail!(
                        "{} line {}: missing `trace_id` (a non-empty string)",
                        path.display(),
                        i + 1
                    ),
                }
            } else {
                ids.push(line.to_owned());
            }
        }
        ids
    } else {
        arg.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    };
    if ids.is_empty() {
        bail!("{flag} {arg}: names no trace (a file of ids, or ids separated by commas)");
    }
    let mut seen = HashSet::new();
    if let Some(dup) = ids.iter().find(|id| !seen.insert(id.as_str())) {
        bail!("{flag}: trace {dup} is named twice");
    }
    Ok(ids)
}

/// Every id must be a trace of the store.
fn check_ids(db: &Path, ids: &[String]) -> Result<()> {
    let store =
        traces::Store::open_read_only(db).with_context(|| format!("opening {}", db.display()))?;
    let mut stmt = store
        .connection()
        .prepare("SELECT 1 FROM traces WHERE trace_id = ?1")?;
    for id in ids {
        if !stmt.exists([id])? {
            bail!("{} holds no trace {id}", db.display());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn healthy_runs_come_from_a_list_or_a_file() {
        assert_eq!(run_ids("a, b,c", "--healthy").unwrap(), vec!["a", "b", "c"]);
        assert!(run_ids(" , ", "--healthy").is_err());
        assert!(run_ids("a,a", "--healthy")
            .unwrap_err()
            .to_string()
            .contains("twice"));
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("healthy.jsonl");
        std::fs::write(&file, "{\"trace_id\": \"t1\"}\n\nt2\n").unwrap();
        assert_eq!(
            run_ids(file.to_str().unwrap(), "--healthy").unwrap(),
            vec!["t1", "t2"]
        );
        std::fs::write(&file, "{\"id\": \"t1\"}\n").unwrap();
        let err = run_ids(file.to_str().unwrap(), "--healthy")
            .unwrap_err()
            .to_string();
        assert!(err.contains("line 1"), "{err}");
    }
}
