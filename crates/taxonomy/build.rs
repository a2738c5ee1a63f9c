//! Embeds the catalog in `deficiencies/` into the crate so that the `pathfinder` binary works
//! from any directory. The embedded copy is validated by the same code as a catalog on disk.

use std::fmt::Write as _;
use std::path::Path;
use std::{env, fs};

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deficiencies");
    let catalog = root.join("catalog");
    println!(
        "cargo:rerun-if-changed={}",
        root.join("components.toml").display()
    );
    println!("cargo:rerun-if-changed={}", catalog.display());

    let mut files: Vec<_> = fs::read_dir(&catalog)
        .map(|it| it.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    files.retain(|p| p.extension().is_some_and(|e| e == "toml"));
    files.sort();

    let mut out =
        String::from("/// Catalog files embedded at build time: (file name, contents).\n");
    out.push_str("pub(crate) const CATALOG_FILES: &[(&str, &str)] = &[\n");
    for path in &files {
        println!("cargo:rerun-if-changed={}", path.display());
        let name = path.file_name().unwrap().to_string_lossy();
        let abs = fs::canonicalize(path).unwrap();
        writeln!(
            out,
            "    ({name:?}, include_str!({:?})),",
            abs.display().to_string()
        )
        .unwrap();
    }
    out.push_str("];\n");
    let components = fs::canonicalize(root.join("components.toml")).unwrap();
    writeln!(
        out,
        "/// The component vocabulary embedded at build time.\npub(crate) const COMPONENTS_FILE: &str = include_str!({:?});",
        components.display().to_string()
    )
    .unwrap();
    fs::write(
        Path::new(&env::var("OUT_DIR").unwrap()).join("embedded.rs"),
        out,
    )
    .unwrap();
}
