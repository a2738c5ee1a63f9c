//! `pathfinder`: the command line over every Pathfinder crate. Each subcommand lives in its
//! own module under `cli/`; this file only parses arguments and dispatches.

mod cli;

use clap::{Parser, Subcommand};

/// Train and run agent-trace debuggers by adversarial self-play.
#[derive(Debug, Parser)]
#[command(name = "pathfinder", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Inspect and validate the deficiency catalog (P1–P27, C1–C23).
    #[command(subcommand)]
    Taxonomy(cli::taxonomy::Command),
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("PATHFINDER_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Taxonomy(cmd) => cli::taxonomy::run(cmd),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
