//! `pathfinder train`: self-play training of the Injector and Detector adapters (a supervised
//! warm start on the expert's demonstrations, then PPO steps), resumable from the newest
//! checkpoint; prints held-out detection accuracy before and after.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use rl::trainer::{TrainOptions, Trainer};

#[derive(Debug, Args)]
pub struct TrainArgs {
    /// The run configuration (every field is documented in rl/default.toml).
    #[arg(long, value_name = "FILE")]
    config: PathBuf,
    /// The run's name: checkpoints, metrics and episodes go to RUNS_DIR/NAME.
    #[arg(long, value_name = "NAME")]
    run: String,
    #[arg(long, value_name = "DIR", default_value = "checkpoints")]
    runs_dir: PathBuf,
    /// Continue the run from its newest checkpoint.
    #[arg(long)]
    resume: bool,
    /// Only the supervised warm start (and its held-out evaluation).
    #[arg(long)]
    sft: bool,
    /// Stop after this many PPO steps in this invocation; the run stays resumable.
    #[arg(long, value_name = "N")]
    max_steps: Option<u64>,
    /// Overrides the configuration's `[run] seed` (the run records the configuration it ran).
    #[arg(long, value_name = "N")]
    seed: Option<u64>,
    /// Frameworks (comma-separated corpus agents) never trained on: left out of the warm start,
    /// the live episodes and the held-out split, and evaluated whole before and after PPO
    /// (`eval-left-out.jsonl`; the run records the configuration it ran).
    #[arg(long, value_name = "FRAMEWORK,...", value_delimiter = ',')]
    leave_out: Vec<String>,
    /// The repository root (with agents/ and deficiencies/); paths in the configuration are
    /// relative to it.
    #[arg(long, value_name = "DIR", default_value = ".")]
    root: PathBuf,
}

pub fn run(args: TrainArgs) -> Result<()> {
    let text = std::fs::read_to_string(&args.config)
        .with_context(|| format!("reading {}", args.config.display()))?;
    let text = match args.seed {
        Some(seed) => rl::RunConfig::text_with_seed(&text, &args.config, seed)?,
        None => text,
    };
    let text = if args.leave_out.is_empty() {
        text
    } else {
        rl::RunConfig::text_leaving_out(&text, &args.config, &args.leave_out)?
    };
    let run_dir = args.runs_dir.join(&args.run);
    // One process, or a rank of a job started by mpirun or srun (the `mpi` feature).
    let ranks: std::sync::Arc<dyn collective::Collective> = collective::from_launcher()?.into();
    let leader = ranks.is_leader();
    let options = TrainOptions {
        root: std::path::absolute(&args.root)?,
        run_dir: run_dir.clone(),
        resume: args.resume,
        sft_only: args.sft,
        max_steps: args.max_steps,
        progress: true,
        ranks: std::sync::Arc::clone(&ranks),
    };
    let outcome = Trainer::new(&text, &args.config, options).and_then(|mut t| t.run());
    let outcome = match outcome {
        Ok(o) => o,
        // One rank's error ends the job: the others would wait for it in the next collective.
        Err(e) if ranks.world() > 1 => {
            eprintln!("error: rank {}: {e}", ranks.rank());
            ranks.abort(1)
        }
        Err(e) => return Err(e.into()),
    };
    if !leader {
        return Ok(());
    }
    let show = |label: &str, acc: &Option<rl::evaluate::Accuracy>| {
        match acc {
        Some(a) => println!(
            "{label}: detection {:.1}%, localisation {:.1}%, {:.1} tool calls on {} held-out traces",
            100.0 * a.detection,
            100.0 * a.localisation,
            a.avg_tool_calls,
            a.n
        ),
        None => println!("{label}: not evaluated (no corpus configured, or the run is not finished)"),
    }
    };
    show("before PPO (warm start only)", &outcome.before);
    if !args.sft {
        show(&format!("after step {}", outcome.last_step), &outcome.after);
    }
    if outcome.left_out_before.is_some() {
        let show_left_out = |label: &str, acc: &Option<rl::evaluate::Accuracy>| {
            if let Some(a) = acc {
                println!(
                    "{label}, on the frameworks left out of training: detection {:.1}%, false positives {}, on {} traces",
                    100.0 * a.detection,
                    a.false_positive_rate
                        .map_or("n/a".into(), |r| format!("{:.1}%", 100.0 * r)),
                    a.n
                );
            }
        };
        show_left_out("before PPO (warm start only)", &outcome.left_out_before);
        if !args.sft {
            show_left_out(
                &format!("after step {}", outcome.last_step),
                &outcome.left_out_after,
            );
        }
    }
    let show_blame = |label: &str, which: &str, acc: &Option<rl::blame::BlameAccuracy>| {
        if let Some(a) = acc {
            println!(
                "blame {label}, {which}: agent {:.1}%, step exact {:.1}%, within one {:.1}%, on {} logs",
                100.0 * a.agent,
                100.0 * a.exact,
                100.0 * a.within_one,
                a.logs
            );
        }
    };
    show_blame(
        "after its warm start",
        "held-out logs",
        &outcome.blame_before,
    );
    show_blame(
        "after its warm start",
        "logs of the frameworks left out",
        &outcome.blame_left_out_before,
    );
    if !args.sft {
        let after = format!("after step {}", outcome.last_step);
        show_blame(&after, "held-out logs", &outcome.blame_after);
        show_blame(
            &after,
            "logs of the frameworks left out",
            &outcome.blame_left_out_after,
        );
    }
    println!("run: {}", run_dir.display());
    Ok(())
}
