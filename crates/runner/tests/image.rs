//! The base image: built once, then found in the engine's cache under the hash of its inputs;
//! a recipe the apt configuration cannot serve fails with an error naming what was looked at.

mod common;

use std::path::Path;

use runner::image::{ensure_image, ImageSource};
use runner::ImageRecipe;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_is_cached_under_its_input_hash() {
    let Some(_backend) = common::docker_backend().await else {
        return;
    };
    let docker = runner::docker::connect().await.unwrap();
    let recipe = ImageRecipe::load(&common::repo_root().join("infra/base-image.toml")).unwrap();
    // The backend above built or found it; asking again must not build.
    let (image, source) = ensure_image(&docker, &recipe, Path::new("/etc/apt"), &|m| {
        panic!("rebuilt: {m}")
    })
    .await
    .unwrap();
    assert_eq!(source, ImageSource::Cached);
    assert_eq!(
        image,
        format!("pathfinder-agent-base:{}", recipe.input_hash())
    );
    let inspect = docker.inspect_image(&image).await.unwrap();
    let labels = inspect.config.and_then(|c| c.labels).unwrap_or_default();
    assert_eq!(
        labels.get("pathfinder.recipe-hash"),
        Some(&recipe.input_hash())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unserved_suite_is_reported_not_built() {
    let Ok(docker) = runner::docker::connect().await else {
        eprintln!("SKIPPED: no Docker engine on this machine");
        return;
    };
    if std::env::var_os("PATHFINDER_DEBIAN_MIRROR").is_some() {
        return;
    }
    let text = std::fs::read_to_string(common::repo_root().join("infra/base-image.toml"))
        .unwrap()
        .replace("suite = \"bookworm\"", "suite = \"nosuchsuite\"");
    let recipe = ImageRecipe::parse(Path::new("test-recipe.toml"), &text).unwrap();
    let apt = tempfile::tempdir().unwrap();
    std::fs::create_dir(apt.path().join("sources.list.d")).unwrap();
    std::fs::write(
        apt.path().join("sources.list.d/debian.sources"),
        "Types: deb\nURIs: http://archive.invalid/debian\nSuites: bookworm\n",
    )
    .unwrap();
    let err = ensure_image(&docker, &recipe, apt.path(), &|_| {})
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("nosuchsuite") && err.contains("debian.sources:1"),
        "{err}"
    );
}
