//! The `nearest` detector: the second non-LM reference. It reads a trace's probe digests as the
//! `classifier` does (the same battery, the same TF-IDF vocabulary of the train split) and
//! answers what its k most similar train traces were labelled, each neighbour's vote weighted
//! by its cosine similarity. Nothing is fitted beyond the vocabulary, so it shows what plain
//! resemblance to labelled traces carries: a reader that learns weights should beat it.

use std::collections::BTreeMap;
use std::sync::Arc;

use detect::probes::{self, BatteryPolicy, ProbeResult};
use linear::Vocabulary;

use crate::error::{Error, Result};
use crate::store_eval::Labelled;

/// Terms that occur in fewer training traces are left out (as the classifier's vocabulary).
const MIN_DF: usize = 2;

/// Neighbours consulted when none is named (`nearest` = `nearest:k=5`).
pub const DEFAULT_K: usize = 5;

/// The train traces as TF-IDF vectors beside their labels.
#[derive(Debug, Clone)]
pub struct Nearest {
    k: usize,
    vocabulary: Vocabulary,
    /// Each train trace's L2-normalised TF-IDF vector (a dot product is its cosine).
    vectors: Vec<Vec<f32>>,
    /// Each train trace's type id (`none` for a healthy one) and component.
    labels: Vec<(String, String)>,
}

/// What [`Nearest::decide`] answers.
#[derive(Debug, Clone, PartialEq)]
pub struct Vote {
    pub type_id: String,
    pub component: String,
    /// The winning type's share of the neighbours' summed similarity.
    pub share: f32,
    /// The similarity of the closest neighbour.
    pub closest: f32,
}

impl Nearest {
    /// Keeps the train traces of a split (with their digests in `train_batteries`) as the
    /// neighbours of every later trace.
    pub fn fit(
        train: &[Labelled],
        train_batteries: &[Vec<ProbeResult>],
        k: usize,
    ) -> Result<Nearest> {
        if k == 0 {
            return Err(Error::Detector(
                "the nearest-neighbour reader needs k of at least 1".into(),
            ));
        }
        if train.is_empty() || train.len() != train_batteries.len() {
            return Err(Error::Detector(format!(
                "the nearest-neighbour reader needs labelled train traces with their digests ({} traces, {} batteries)",
                train.len(),
                train_batteries.len()
            )));
        }
        let docs: Vec<Vec<String>> = train_batteries
            .iter()
            .map(|b| linear::terms(&probes::battery_lines(b)))
            .collect();
        let vocabulary = Vocabulary::fit(&docs, MIN_DF);
        let vectors = docs.iter().map(|d| vocabulary.vector(d)).collect();
        let labels = train
            .iter()
            .map(|t| {
                let component = t.truth.component.as_deref().unwrap_or(taxonomy::NONE);
                (t.truth.id().to_string(), component.to_string())
            })
            .collect();
        Ok(Nearest {
            k,
            vocabulary,
            vectors,
            labels,
        })
    }

    /// The type the `k` most similar train traces hold the most similarity for (ties: the
    /// one whose best neighbour is closer), and the component most of that type's neighbours
    /// name. A trace that shares no term with any train trace is answered by the k first.
    pub fn decide(&self, battery: &[ProbeResult]) -> Vote {
        let x = self
            .vocabulary
            .vector(&linear::terms(&probes::battery_lines(battery)));
        let mut scored: Vec<(f32, usize)> = self
            .vectors
            .iter()
            .enumerate()
            .map(|(i, v)| (v.iter().zip(&x).map(|(a, b)| a * b).sum::<f32>(), i))
            .collect();
        // Most similar first; among equals, the earlier train trace (a stable order).
        scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let neighbours = &scored[..self.k.min(scored.len())];
        // A neighbour at similarity 0 still votes, with a floor, so that an empty overlap
        // does not leave every type at zero.
        let weight = |s: f32| s.max(1e-6);
        let mut by_type: BTreeMap<&str, (f32, f32)> = BTreeMap::new();
        for &(s, i) in neighbours {
            let e = by_type.entry(&self.labels[i].0).or_insert((0.0, f32::MIN));
            e.0 += weight(s);
            e.1 = e.1.max(s);
        }
        let total: f32 = by_type.values().map(|v| v.0).sum();
        let (type_id, (mass, _)) = by_type
            .iter()
            .max_by(|a, b| {
                (a.1 .0)
                    .total_cmp(&b.1 .0)
                    .then((a.1 .1).total_cmp(&b.1 .1))
            })
            .map(|(t, v)| (t.to_string(), *v))
            .expect("k >= 1 and at least one train trace");
        let mut by_component: BTreeMap<&str, f32> = BTreeMap::new();
        for &(s, i) in neighbours {
            if self.labels[i].0 == type_id {
                *by_component.entry(&self.labels[i].1).or_default() += weight(s);
            }
        }
        let component = by_component
            .iter()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map(|(c, _)| c.to_string())
            .unwrap_or_else(|| taxonomy::NONE.to_string());
        Vote {
            type_id,
            component,
            share: mass / total,
            closest: neighbours.first().map_or(0.0, |n| n.0),
        }
    }

    /// A fresh policy for one investigation: the battery, then the neighbours' answer.
    pub fn policy(self: &Arc<Self>) -> Box<dyn detect::Policy> {
        let me = Arc::clone(self);
        Box::new(BatteryPolicy::new(
            "nearest",
            Box::new(move |results| {
                let v = me.decide(results);
                Ok(detect::Verdict::deficiency(
                    v.type_id,
                    v.component,
                    format!(
                        "{} nearest train traces by their probe digests: {:.0}% of their similarity, closest {:.2}",
                        me.k,
                        100.0 * v.share,
                        v.closest
                    ),
                ))
            }),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn battery(digest: &str) -> Vec<ProbeResult> {
        vec![ProbeResult {
            probe: "errors",
            digest: digest.into(),
        }]
    }

    fn labelled(ty: &str, component: Option<&str>) -> Labelled {
        let mut truth = crate::metrics::Truth::deficiency(ty);
        truth.component = component.map(str::to_string);
        Labelled {
            trace_id: String::new(),
            truth,
            agent: None,
        }
    }

    #[test]
    fn the_neighbours_vote_by_similarity_and_name_their_component() {
        let train = [
            labelled("P1", Some("llm_client.request")),
            labelled("P1", Some("llm_client.request")),
            labelled("C8", Some("tools.schema")),
            labelled("none", None),
            labelled("none", None),
        ];
        let batteries: Vec<_> = [
            "error timeout on call retry",
            "error timeout on call",
            "schema mismatch on tool argument",
            "no errors run complete",
            "no errors run complete fine",
        ]
        .map(battery)
        .to_vec();
        let n = Nearest::fit(&train, &batteries, 1).unwrap();
        let v = n.decide(&battery("error timeout on call retry again"));
        assert_eq!(
            (v.type_id.as_str(), v.component.as_str()),
            ("P1", "llm_client.request")
        );
        assert!(v.closest > 0.5 && v.share == 1.0, "{v:?}");
        assert_eq!(
            n.decide(&battery("schema mismatch on tool argument"))
                .type_id,
            "C8"
        );
        assert_eq!(n.decide(&battery("no errors run complete")).type_id, "none");
        // With every trace a neighbour, the two P1 traces and the two healthy ones outvote
        // C8 on a trace that resembles it least.
        let all = Nearest::fit(&train, &batteries, 5).unwrap();
        let v = all.decide(&battery("error timeout on call retry"));
        assert_eq!(v.type_id, "P1");
        assert!(v.share < 1.0, "{v:?}");
        // Bad input is refused with the reason.
        assert!(Nearest::fit(&train, &batteries, 0)
            .unwrap_err()
            .to_string()
            .contains("k of at least 1"));
        assert!(Nearest::fit(&train, &batteries[..2], 3)
            .unwrap_err()
            .to_string()
            .contains("2 batteries"));
    }

    #[test]
    fn the_nearest_reader_names_held_out_synthetic_traces_through_the_battery() {
        let split = crate::classifier::SyntheticSplit::new();
        let tb = crate::classifier::battery(&split.db, &split.train).unwrap();
        let nearest = Arc::new(Nearest::fit(&split.train, &tb, 1).unwrap());
        split.assert_named(|| nearest.policy());
    }
}
