//! The decision head's fit on inputs shaped like the learned Detector's: `Softmax::fit`, which
//! sums each epoch's gradient over the inputs' non-zeros, against the same full-batch Adam
//! steps summed over every input (how the fit was written before), on the same data. Two
//! shapes: the pooled states (1,152 dense values) beside 2,048 hashed term buckets, and an
//! exact TF-IDF vocabulary read alone (12,000 terms). About 150 terms are non-zero per trace,
//! as in the six-framework corpus's digests.
//!
//! Run: `cargo bench -p linear --bench fit` (`-- --epochs N`, default 40). Without cargo
//! bench's `--bench` flag (e.g. under `cargo test --all-targets`) it does nothing.

use std::time::Instant;

use linear::{dense_fit, FitOptions, Softmax};

/// A small linear congruential stream, so that both sides read the same data on any machine.
struct Stream(u32);

impl Stream {
    fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        (self.0 >> 8) as f32 / (1u32 << 24) as f32
    }
}

/// `n` inputs of `dense` dense values and `terms` term values of which `filled` are non-zero
/// (L2-normalised), and their classes among `classes`.
fn data(
    n: usize,
    dense: usize,
    terms: usize,
    filled: usize,
    classes: usize,
) -> (Vec<Vec<f32>>, Vec<usize>) {
    let mut s = Stream(7);
    let mut x = Vec::with_capacity(n);
    let mut y = Vec::with_capacity(n);
    for i in 0..n {
        let class = i % classes;
        let mut v: Vec<f32> = (0..dense).map(|_| s.next() * 2.0 - 1.0).collect();
        let mut t = vec![0f32; terms];
        for k in 0..filled {
            // A third of a trace's terms say its class; the rest are anywhere.
            let j = if k % 3 == 0 {
                (class * 97 + k * 13) % terms
            } else {
                (s.next() * terms as f32) as usize % terms
            };
            t[j] += 1.0 + s.next();
        }
        let norm = t.iter().map(|a| a * a).sum::<f32>().sqrt();
        t.iter_mut().for_each(|a| *a /= norm);
        v.extend(t);
        x.push(v);
        y.push(class);
    }
    (x, y)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if !args.iter().any(|a| a == "--bench") {
        return;
    }
    let epochs = args
        .iter()
        .position(|a| a == "--epochs")
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    let options = FitOptions {
        l2: 0.04,
        lr: 0.02,
        max_epochs: epochs,
        patience: usize::MAX,
        log_every: usize::MAX,
        standardise: true,
        raw_tail: None,
    };
    println!("fit: {epochs} full-batch epochs, 650 traces, 45 classes (median of 3 runs each)");
    for (name, dense, terms) in [
        ("pooled states + 2,048 hashed terms", 1152, 2048),
        ("12,000-term vocabulary alone", 0, 12_000),
    ] {
        let (x, y) = data(650, dense, terms, 150, 45);
        let mut ours = Vec::new();
        let mut theirs = Vec::new();
        for _ in 0..3 {
            let t = Instant::now();
            let fitted = Softmax::fit(&x, &y, 45, &options, None, |_| {}).expect("fits");
            ours.push(t.elapsed().as_secs_f64());
            let t = Instant::now();
            std::hint::black_box(dense_fit(&x, &y, 45, &options, &fitted));
            theirs.push(t.elapsed().as_secs_f64());
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (a, b) = (median(&mut ours), median(&mut theirs));
        println!(
            "{name}: over non-zeros {a:.2} s, over every input {b:.2} s, ratio {:.1}x",
            b / a
        );
    }
}
