//! Generation: greedy decoding agrees with the full forward pass, batching and multi-turn cache
//! reuse do not change results, and constraints, stop tokens, stop sequences and seeds behave.

mod common;

use candle_core::{DType, Device, Tensor};
use common::*;
use model::{Arch, ChatMessage, FinishReason, KvCache, LoraConfig, Model, SamplingParams};

fn tiny_model() -> Model {
    Model::random(tiny_config(Arch::Llama, true), DType::F32, &Device::Cpu, 31).unwrap()
}

fn greedy(n: usize) -> SamplingParams {
    SamplingParams {
        max_new_tokens: n,
        stop_token_ids: Some(vec![]),
        ..Default::default()
    }
}

/// Reference greedy decoding with no cache: re-run the whole sequence each step.
fn naive_greedy(m: &Model, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut seq = prompt.to_vec();
    for _ in 0..n {
        let ids = ids(&[&seq]);
        let mask = Tensor::ones(ids.dims(), DType::U32, &Device::Cpu).unwrap();
        let (logits, _) = m.forward_train(&ids, &mask).unwrap();
        let last = logits.get(0).unwrap().get(seq.len() - 1).unwrap();
        seq.push(last.argmax(0).unwrap().to_scalar::<u32>().unwrap());
    }
    seq[prompt.len()..].to_vec()
}

#[test]
fn cached_greedy_generation_matches_naive_decoding_and_batching() {
    let m = tiny_model();
    let tok = tiny_tokenizer();
    let p1 = vec![1, 50, 60, 70, 80, 90];
    let p2 = vec![1, 100, 101];
    let out = m
        .generate(&tok, &[p1.clone(), p2.clone()], &greedy(6), None)
        .unwrap();
    assert_eq!(out[0].tokens, naive_greedy(&m, &p1, 6));
    assert_eq!(out[1].tokens, naive_greedy(&m, &p2, 6));
    assert_eq!(out[0].finish, FinishReason::Length);
}

#[test]
fn multi_turn_cache_prefills_only_the_new_suffix() {
    let mut m = tiny_model();
    m.add_adapter("a", LoraConfig::default(), 1).unwrap();
    m.set_active_adapter(Some("a")).unwrap();
    let tok = tiny_tokenizer();
    let turn1 = tok
        .encode(
            &tok.apply_chat_template(&[ChatMessage::new("user", "list files")], true)
                .unwrap(),
            true,
        )
        .unwrap();
    let mut cache = KvCache::new(&m, 1);
    let g1 = m
        .generate_with_cache(
            &mut cache,
            &tok,
            std::slice::from_ref(&turn1),
            &greedy(5),
            None,
        )
        .unwrap();
    assert_eq!(cache.columns(), turn1.len() + 5 - 1);
    let mut turn2 = turn1.clone();
    turn2.extend(&g1[0].tokens);
    turn2.extend(
        tok.encode(
            "<|im_end|>\n<|im_start|>user\nnext<|im_end|>\n<|im_start|>assistant\n",
            false,
        )
        .unwrap(),
    );
    let g2 = m
        .generate_with_cache(&mut cache, &tok, &[turn2.clone()], &greedy(5), None)
        .unwrap();
    // Only the new part was added: no re-prefill of turn 1.
    assert_eq!(cache.columns(), turn2.len() + 5 - 1);
    assert_eq!(cache.tokens(0).len(), turn2.len() + 4);
    let fresh = m
        .generate(&tok, &[turn2.clone()], &greedy(5), None)
        .unwrap();
    assert_eq!(g2[0].tokens, fresh[0].tokens);

    // A prompt that rewrites history rewinds the row to the common prefix and still matches.
    let mut edited = turn1[..turn1.len() - 2].to_vec();
    edited.extend([120, 121]);
    let g3 = m
        .generate_with_cache(&mut cache, &tok, &[edited.clone()], &greedy(4), None)
        .unwrap();
    let fresh = m.generate(&tok, &[edited], &greedy(4), None).unwrap();
    assert_eq!(g3[0].tokens, fresh[0].tokens);

    // The cache belongs to the adapter it was filled with.
    m.set_active_adapter(None).unwrap();
    let err = m
        .generate_with_cache(&mut cache, &tok, &[turn2], &greedy(2), None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("adapter"), "{err}");
}

#[test]
fn constraint_stop_token_and_stop_sequence() {
    let m = tiny_model();
    let tok = tiny_tokenizer();
    let a = tok.token_to_id("a").unwrap();
    let b = tok.token_to_id("b").unwrap();
    let eos = 2;
    let mut calls = vec![];
    // Force "a b a" then eos.
    let mut forced = |row: usize, generated: &[u32]| {
        calls.push((row, generated.len()));
        Some(vec![[a, b, a, eos][generated.len().min(3)]])
    };
    let params = SamplingParams {
        max_new_tokens: 10,
        ..Default::default()
    };
    let out = m
        .generate(&tok, &[vec![1, 5]], &params, Some(&mut forced))
        .unwrap();
    assert_eq!(out[0].tokens, vec![a, b, a, eos]);
    assert_eq!(out[0].text, "aba");
    assert_eq!(out[0].finish, FinishReason::StopToken(eos));
    assert_eq!(calls, vec![(0, 0), (0, 1), (0, 2), (0, 3)]);

    let mut forced =
        |_: usize, generated: &[u32]| Some(vec![[a, b, a, eos][generated.len().min(3)]]);
    let params = SamplingParams {
        max_new_tokens: 10,
        stop_sequences: vec!["ba".into()],
        ..Default::default()
    };
    let out = m
        .generate(&tok, &[vec![1, 5]], &params, Some(&mut forced))
        .unwrap();
    assert_eq!(out[0].text, "a");
    assert_eq!(out[0].finish, FinishReason::StopSequence("ba".into()));

    // Sampling restricted to an allowed set stays inside it.
    let allowed = vec![10u32, 11, 12];
    let mut only = |_: usize, _: &[u32]| Some(allowed.clone());
    let params = SamplingParams {
        max_new_tokens: 8,
        temperature: 1.0,
        seed: 3,
        ..Default::default()
    };
    let out = m
        .generate(&tok, &[vec![1, 5], vec![1]], &params, Some(&mut only))
        .unwrap();
    assert!(out
        .iter()
        .all(|g| g.tokens.iter().all(|t| allowed.contains(t))));
}

#[test]
fn sampling_is_reproducible_by_seed() {
    let m = tiny_model();
    let tok = tiny_tokenizer();
    let run = |seed| {
        let p = SamplingParams {
            max_new_tokens: 12,
            temperature: 1.0,
            top_p: Some(0.95),
            top_k: Some(50),
            seed,
            stop_token_ids: Some(vec![]),
            ..Default::default()
        };
        m.generate(&tok, &[vec![1, 7, 8]], &p, None).unwrap()[0]
            .tokens
            .clone()
    };
    assert_eq!(run(1), run(1));
    assert_ne!(run(1), run(2));

    // With a seed per row, each row of a batch samples what it samples alone with that seed,
    // whatever the other rows are; with one seed the rows share a sampler.
    let sampled = |seed, row_seeds: Vec<u64>| SamplingParams {
        max_new_tokens: 12,
        temperature: 1.0,
        seed,
        row_seeds,
        stop_token_ids: Some(vec![]),
        ..Default::default()
    };
    let alone = |prompt: Vec<u32>, seed| {
        m.generate(&tok, &[prompt], &sampled(seed, vec![]), None)
            .unwrap()[0]
            .tokens
            .clone()
    };
    let (p1, p2) = (vec![1, 7, 8], vec![1, 30, 31, 32, 33]);
    let batch = m
        .generate(
            &tok,
            &[p1.clone(), p2.clone()],
            &sampled(0, vec![5, 6]),
            None,
        )
        .unwrap();
    assert_eq!(batch[0].tokens, alone(p1.clone(), 5));
    assert_eq!(batch[1].tokens, alone(p2.clone(), 6));
    let err = m
        .generate(&tok, &[p1, p2], &sampled(0, vec![5]), None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("1 row seeds for 2 prompts"), "{err}");
}

#[test]
fn bad_inputs_are_rejected_with_reasons() {
    let m = tiny_model();
    let tok = tiny_tokenizer();
    let err = m
        .generate(&tok, &[vec![]], &greedy(2), None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("prompt 0 is empty"), "{err}");
    let err = m
        .generate(&tok, &[vec![1, 9999]], &greedy(2), None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("9999"), "{err}");
    let ids = ids(&[&[1, 2, 3]]);
    let mask = model::Tensor::ones((1, 2), DType::U32, &Device::Cpu).unwrap();
    let err = m.forward_train(&ids, &mask).unwrap_err().to_string();
    assert!(err.contains("attention_mask"), "{err}");
}
