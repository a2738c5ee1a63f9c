//! The embedder on a tiny random BERT: padding does not change an embedding, embeddings are
//! unit vectors, and top-k puts the chunk most similar to the query first.

use candle_core::Device;
use retrieve::{testing, top_k, Embedder};

fn tiny() -> (tempfile::TempDir, Embedder) {
    let dir = tempfile::tempdir().unwrap();
    testing::write_tiny_embedder(dir.path()).unwrap();
    let e = Embedder::load(dir.path(), &Device::Cpu).unwrap();
    (dir, e)
}

fn close(a: &[f32], b: &[f32]) -> bool {
    a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-5)
}

#[test]
fn padded_and_unpadded_encodings_pool_to_the_same_unit_vector() {
    let (_dir, e) = tiny();
    let ids = vec![2u32, 3, 4, 5, 6];
    let plain = e
        .embed_ids(std::slice::from_ref(&ids), &[vec![1; 5]])
        .unwrap();
    let mut padded = ids.clone();
    padded.resize(testing::TINY_LEN, 0);
    let mut mask = vec![1u32; 5];
    mask.resize(testing::TINY_LEN, 0);
    let pad = e.embed_ids(&[padded], &[mask]).unwrap();
    assert!(close(&plain[0], &pad[0]), "{:?} vs {:?}", plain[0], pad[0]);
    let norm: f32 = plain[0].iter().map(|x| x * x).sum::<f32>().sqrt();
    assert!((norm - 1.0).abs() < 1e-5, "{norm}");
    // Through the tokenizer (which pads to its fixed length), the same text alone or beside a
    // longer one gives the same vector.
    let alone = e.embed(&["tool call failed"]).unwrap();
    let batch = e
        .embed(&[
            "tool call failed",
            "the agent plan of the llm span timeout retry",
        ])
        .unwrap();
    assert!(close(&alone[0], &batch[0]));
}

#[test]
fn top_k_picks_the_chunk_most_similar_to_the_query() {
    let (_dir, e) = tiny();
    let chunks = [
        "llm span ok status ok",
        "memory plan answer",
        "tool call failed error timeout",
        "agent in out",
    ];
    let vectors = e.embed(&chunks).unwrap();
    let query = e.embed(&["tool call failed error timeout"]).unwrap();
    let ranked = top_k(&query[0], &vectors, 2);
    assert_eq!(ranked[0], 2, "{ranked:?}");
    assert_eq!(ranked.len(), 2);
}
