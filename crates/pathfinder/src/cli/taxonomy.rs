//! `pathfinder taxonomy`: list, show and validate the deficiency catalog.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use taxonomy::{Catalog, Category, Deficiency};

#[derive(Debug, Subcommand)]
pub enum Command {
    /// List the deficiency types, one per line (or as JSON).
    List {
        /// Print a JSON array of full entries instead of a table.
        #[arg(long)]
        json: bool,
        /// Only types in this category (e.g. "Tool Schema Conflicts"; case-insensitive).
        #[arg(long)]
        category: Option<String>,
        #[command(flatten)]
        source: Source,
    },
    /// Print one deficiency type in full.
    Show {
        /// The type id, e.g. P16 or C3.
        id: String,
        /// Print the entry as JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        source: Source,
    },
    /// Validate a catalog directory (default: ./deficiencies, else the built-in catalog).
    Validate {
        /// A directory holding components.toml and catalog/*.toml.
        dir: Option<PathBuf>,
    },
}

/// Where the catalog comes from.
#[derive(Debug, Args)]
pub struct Source {
    /// Read the catalog from this directory instead of the copy built into the binary.
    #[arg(long, value_name = "DIR")]
    catalog: Option<PathBuf>,
}

impl Source {
    fn load(&self) -> Result<Catalog> {
        match &self.catalog {
            Some(dir) => Ok(Catalog::load(dir)?),
            None => Ok(Catalog::embedded().context("the built-in catalog is invalid")?),
        }
    }
}

pub fn run(cmd: Command) -> Result<()> {
    match cmd {
        Command::List {
            json,
            category,
            source,
        } => {
            let catalog = source.load()?;
            let filter = match category.as_deref() {
                Some(text) => Some(Category::parse(text).with_context(|| {
                    let all: Vec<&str> = Category::ALL.iter().map(|c| c.as_str()).collect();
                    format!(
                        "unknown category `{text}`; expected one of: {}",
                        all.join("; ")
                    )
                })?),
                None => None,
            };
            let entries: Vec<&Deficiency> = catalog
                .deficiencies()
                .iter()
                .filter(|d| filter.is_none_or(|c| d.category == c))
                .collect();
            if json {
                println!("{}", serde_json::to_string_pretty(&entries)?);
            } else {
                print_table(&entries);
            }
        }
        Command::Show { id, json, source } => {
            let catalog = source.load()?;
            let Some(def) = catalog.get(&id) else {
                bail!("no deficiency type `{id}`; ids are P1–P27 and C1–C23");
            };
            if json {
                println!("{}", serde_json::to_string_pretty(def)?);
            } else {
                print_entry(&catalog, def);
            }
        }
        Command::Validate { dir } => {
            let (catalog, what) = match dir {
                Some(dir) => (Catalog::load(&dir)?, dir.display().to_string()),
                None if Path::new("deficiencies").is_dir() => (
                    Catalog::load(Path::new("deficiencies"))?,
                    "deficiencies".to_owned(),
                ),
                None => (Catalog::embedded()?, "the built-in catalog".to_owned()),
            };
            println!(
                "{what}: valid — {} deficiency types ({} production, {} conceptual), {} components",
                catalog.deficiencies().len(),
                catalog
                    .deficiencies()
                    .iter()
                    .filter(|d| d.id.starts_with('P'))
                    .count(),
                catalog
                    .deficiencies()
                    .iter()
                    .filter(|d| d.id.starts_with('C'))
                    .count(),
                catalog.components().len()
            );
        }
    }
    Ok(())
}

fn print_table(entries: &[&Deficiency]) {
    let name_width = entries
        .iter()
        .map(|d| d.name.chars().count())
        .max()
        .unwrap_or(0);
    for d in entries {
        println!(
            "{:<4} {:<name_width$}  {:<14}  {}",
            d.id,
            d.name,
            d.manifestation.as_str(),
            d.category
        );
    }
}

fn print_entry(catalog: &Catalog, d: &Deficiency) {
    println!("{} — {}", d.id, d.name);
    println!();
    println!("  category        {}", d.category);
    println!("  family          {}", d.family.as_str());
    if let Some(source) = d.source_framework {
        println!("  source          {source}");
    }
    println!("  manifestation   {}", d.manifestation);
    println!("  components");
    for id in &d.components {
        let description = catalog
            .component(id)
            .map(|c| c.description.as_str())
            .unwrap_or("");
        println!("    {id:<28} {description}");
    }
    println!();
    println!("Mechanism");
    print_wrapped(&d.mechanism);
    println!();
    println!("Trace signature");
    print_wrapped(&d.trace_signature);
}

/// Prints a paragraph wrapped at 90 columns, indented by two spaces.
fn print_wrapped(text: &str) {
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && line.len() + 1 + word.len() > 88 {
            println!("  {line}");
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        println!("  {line}");
    }
}
