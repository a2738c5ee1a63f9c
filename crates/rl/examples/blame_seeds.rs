//! The learned blamer's training, measured on a corpus without the rest of a run: the corpus's
//! multi-agent logs read and measured as `pathfinder train` reads them, the warm start fitted
//! with a configuration's `[blame]` settings, then `[run] steps` PPO steps of the blame head for
//! each seed, drawn exactly as the trainer draws them (`rl::blame::step` with the trainer's
//! `mix` streams). Prints the expert's rules, the warm start and each seed's head on the train,
//! held-out (`[eval] split`) and left-out logs, and on the labelled chat logs under the folder
//! `BLAME_LOGS` names, if any.
//!
//! `cargo run --release -p rl --example blame_seeds -- CONFIG [FRAMEWORK,...] [SEED,...]`

use std::path::Path;

use rl::blame::{self, BlameLog};
use rl::trainer::{mix, unit, Draw};

fn expert(logs: &[BlameLog]) -> (f64, f64) {
    let (mut agent, mut exact) = (0usize, 0usize);
    for l in logs {
        if let Some((a, s, _)) = detect::policies::blame::blame(&l.turns) {
            agent += usize::from(
                l.agent
                    .as_deref()
                    .is_some_and(|x| eval::metrics::same_agent(x, &a)),
            );
            exact += usize::from(l.step == Some(s));
        }
    }
    let n = logs.len().max(1) as f64;
    (agent as f64 / n, exact as f64 / n)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let Some(config_path) = args.get(1) else {
        return Err("usage: blame_seeds CONFIG [FRAMEWORK,...] [SEED,...]".into());
    };
    let config = rl::RunConfig::parse(
        &std::fs::read_to_string(config_path)?,
        Path::new(config_path),
    )?;
    let list = |i: usize| -> Vec<String> {
        args.get(i)
            .map(|s| {
                s.split(',')
                    .filter(|w| !w.is_empty())
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default()
    };
    let leave_out = list(2);
    let seeds: Vec<u64> = match list(3) {
        s if s.is_empty() => vec![0, 1],
        s => s.iter().map(|x| x.parse()).collect::<Result<_, _>>()?,
    };
    let blame::SplitLogs {
        train,
        held_out,
        left_out,
    } = blame::read_split_logs(
        Path::new(&config.eval.corpus),
        &config.eval.split,
        &leave_out,
    )?;
    // Labelled chat logs from elsewhere (Who&When's format), when `BLAME_LOGS` names a folder.
    let external = match std::env::var_os("BLAME_LOGS") {
        Some(dir) => blame::read_chatlogs(Path::new(&dir))?,
        None => Vec::new(),
    };
    let sets = [
        ("train", &train),
        ("held-out", &held_out),
        ("left-out", &left_out),
        ("external", &external),
    ];
    let show = |who: &str, head: Option<&policy::blame_head::BlameHead>| {
        let mut line = format!("{who:<24}");
        for (name, set) in sets {
            if set.is_empty() {
                continue;
            }
            let (agent, exact) = match head {
                Some(h) => {
                    let a = blame::accuracy(h, set);
                    (a.agent, a.exact)
                }
                None => expert(set),
            };
            line.push_str(&format!(
                " | {name} ({}) agent {:.1}% exact {:.1}%",
                set.len(),
                100.0 * agent,
                100.0 * exact
            ));
        }
        println!("{line}");
    };
    show("expert", None);
    let cfg = &config.blame;
    let (warm, curve) = blame::fit(
        &train,
        &blame::FitOptions {
            l2: cfg.l2,
            lr: cfg.lr,
            epochs: cfg.epochs,
        },
    );
    if let Some(last) = curve.last() {
        println!(
            "warm start: train nll {:.3}, exact {:.1}% after {} epochs",
            last.nll,
            100.0 * last.exact,
            last.epoch
        );
    }
    show("warm start", Some(&warm));
    let opts = blame::StepOptions {
        logs_per_step: cfg.logs_per_step,
        samples_per_log: cfg.samples_per_log,
        ppo: rl::head::HeadPpo {
            lr: cfg.ppo_lr,
            epochs: cfg.ppo_epochs,
            clip: cfg.clip,
            kl_coef: cfg.kl_coef,
        },
    };
    for seed in seeds {
        let mut head = warm.clone();
        let mut kl = 0.0;
        for step in 1..=config.run.steps {
            let (_, stats) = blame::step(
                &mut head,
                &warm,
                &train,
                &opts,
                |j| mix(seed, step, j, Draw::BlameLog),
                |i| unit(mix(seed, step, i, Draw::BlameTurn)),
            );
            kl = stats.kl;
        }
        show(
            &format!("seed {seed}, step {} (kl {kl:.3})", config.run.steps),
            Some(&head),
        );
    }
    Ok(())
}
