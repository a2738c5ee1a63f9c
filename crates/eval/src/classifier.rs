//! The `classifier` detector: the non-LM reference of Table 5. It runs the probe library on a
//! trace (`detect::probes`, the same battery the learned Detector reads) and names the type and
//! the component with two multinomial logistic regressions over a TF-IDF bag of the digests'
//! tokens, fitted on a corpus's train split. It shows how much the observations carry: a
//! learned Detector that reads the same digests should end above it.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use detect::probes::{self, BatteryPolicy, ProbeResult};
use detect::sql::{SqlLimits, SqlTool};
use linear::{FitLog, FitOptions, Softmax, Vocabulary};

use crate::error::{Error, Result};
use crate::store_eval::Labelled;

/// Terms that occur in fewer training traces are left out of the vocabulary.
const MIN_DF: usize = 2;

/// The fitted reference: a vocabulary and one model per decision.
#[derive(Debug, Clone)]
pub struct Classifier {
    vocabulary: Vocabulary,
    types: Vec<String>,
    type_model: Softmax,
    components: Vec<String>,
    component_model: Softmax,
    /// The type model's fit, as it went.
    pub log: Vec<FitLog>,
}

/// The probe battery's digests of every trace in `traces`, read from `db` through the
/// Detector's guarded SQL tool.
pub fn battery(db: &Path, traces: &[Labelled]) -> Result<Vec<Vec<ProbeResult>>> {
    let sql = SqlTool::open(db, SqlLimits::default())
        .map_err(|e| Error::Detector(format!("{}: {e}", db.display())))?;
    Ok(traces
        .iter()
        .map(|t| probes::run_battery(&sql, &t.trace_id))
        .collect())
}

/// The labels of a train split as classes: the types (and `none`) and the components in the
/// order the split first names them, and each trace's class of both. A label without a
/// component (a healthy trace) gets the component `none`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Classes {
    pub types: Vec<String>,
    pub y: Vec<usize>,
    pub components: Vec<String>,
    pub yc: Vec<usize>,
}

impl Classes {
    pub fn of(train: &[Labelled]) -> Classes {
        let (mut types, mut components) = (Vec::new(), Vec::new());
        let y = train
            .iter()
            .map(|t| linear::class_index(&mut types, t.truth.id()))
            .collect();
        let yc = train
            .iter()
            .map(|t| {
                let c = t.truth.component.as_deref().unwrap_or(taxonomy::NONE);
                linear::class_index(&mut components, c)
            })
            .collect();
        Classes {
            types,
            y,
            components,
            yc,
        }
    }
}

impl Classifier {
    /// Fits on the train traces of `db` (with their digests in `train_batteries`, as
    /// [`battery`] returns them), validating on `val` when given.
    pub fn fit(
        train: &[Labelled],
        train_batteries: &[Vec<ProbeResult>],
        val: Option<(&[Labelled], &[Vec<ProbeResult>])>,
        log: impl FnMut(&FitLog),
    ) -> Result<Classifier> {
        Classifier::fit_on_terms(train, train_batteries, val, None, log)
    }

    /// [`Classifier::fit`] with a vocabulary drawn from `keep` alone when given (e.g. the
    /// terms several frameworks print, [`linear::shared_terms`]).
    pub fn fit_on_terms(
        train: &[Labelled],
        train_batteries: &[Vec<ProbeResult>],
        val: Option<(&[Labelled], &[Vec<ProbeResult>])>,
        keep: Option<&BTreeSet<String>>,
        log: impl FnMut(&FitLog),
    ) -> Result<Classifier> {
        if train.is_empty() {
            return Err(Error::Detector(
                "the classifier needs labelled train traces".into(),
            ));
        }
        let docs: Vec<Vec<String>> = train_batteries
            .iter()
            .map(|b| {
                let mut d = linear::terms(&probes::battery_lines(b));
                if let Some(keep) = keep {
                    d.retain(|t| keep.contains(t));
                }
                d
            })
            .collect();
        let vocabulary = Vocabulary::fit(&docs, MIN_DF);
        let x: Vec<Vec<f32>> = docs.iter().map(|d| vocabulary.vector(d)).collect();
        let Classes {
            types,
            y,
            components,
            yc,
        } = Classes::of(train);
        let options = FitOptions {
            standardise: false,
            l2: 1e-4,
            lr: 0.1,
            max_epochs: 300,
            ..FitOptions::default()
        };
        let val_xy = val.map(|(v, b)| {
            let vx: Vec<Vec<f32>> = b
                .iter()
                .map(|b| vocabulary.vector(&linear::terms(&probes::battery_lines(b))))
                .collect();
            // A validation type never seen in training cannot be named; it scores as a miss.
            let vy: Vec<usize> = v
                .iter()
                .map(|t| {
                    types
                        .iter()
                        .position(|c| c == t.truth.id())
                        .unwrap_or(usize::MAX)
                })
                .collect();
            (vx, vy)
        });
        let val_known = val_xy.as_ref().map(|(vx, vy)| {
            let keep: Vec<usize> = (0..vy.len()).filter(|&i| vy[i] != usize::MAX).collect();
            (
                keep.iter().map(|&i| vx[i].clone()).collect::<Vec<_>>(),
                keep.iter().map(|&i| vy[i]).collect::<Vec<_>>(),
            )
        });
        let mut fit_log = Vec::new();
        let mut log = log;
        let type_model = Softmax::fit(
            &x,
            &y,
            types.len(),
            &options,
            val_known
                .as_ref()
                .map(|(a, b)| (a.as_slice(), b.as_slice())),
            |l| {
                fit_log.push(*l);
                log(l)
            },
        )
        .map_err(|e| Error::Detector(format!("fitting the type model: {e}")))?;
        let component_model = Softmax::fit(&x, &yc, components.len(), &options, None, |_| {})
            .map_err(|e| Error::Detector(format!("fitting the component model: {e}")))?;
        Ok(Classifier {
            vocabulary,
            types,
            type_model,
            components,
            component_model,
            log: fit_log,
        })
    }

    /// The type and component it names for a battery's digests, and the type's probability.
    pub fn decide(&self, battery: &[ProbeResult]) -> (String, String, f32) {
        let x = self
            .vocabulary
            .vector(&linear::terms(&probes::battery_lines(battery)));
        let p = self.type_model.probs(&x);
        let t = linear::argmax(&p);
        let c = self.component_model.predict(&x);
        (self.types[t].clone(), self.components[c].clone(), p[t])
    }

    /// A fresh policy for one investigation: the battery, then this classifier's answer.
    pub fn policy(self: &Arc<Self>) -> Box<dyn detect::Policy> {
        let me = Arc::clone(self);
        Box::new(BatteryPolicy::new(
            "classifier",
            Box::new(move |results| {
                let (t, c, p) = me.decide(results);
                Ok(detect::Verdict::deficiency(
                    t,
                    c,
                    format!(
                        "linear reader of {} probe digests, p = {p:.2}",
                        results.len()
                    ),
                ))
            }),
        ))
    }
}

/// A synthetic store split for the references' tests: two seeds of every scenario to fit on,
/// the third held out.
#[cfg(test)]
pub(crate) struct SyntheticSplit {
    _dir: tempfile::TempDir,
    pub db: std::path::PathBuf,
    pub train: Vec<Labelled>,
    pub test: Vec<Labelled>,
}

#[cfg(test)]
impl SyntheticSplit {
    pub(crate) fn new() -> SyntheticSplit {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("s.sqlite");
        detect::synthetic::build_store(&db, 3).unwrap();
        let all = crate::store_eval::labelled_traces(&db, None).unwrap();
        let (test, train): (Vec<_>, Vec<_>) =
            all.into_iter().enumerate().partition(|(i, _)| i % 3 == 2);
        SyntheticSplit {
            _dir: dir,
            db,
            train: train.into_iter().map(|(_, t)| t).collect(),
            test: test.into_iter().map(|(_, t)| t).collect(),
        }
    }

    /// Scores `policy` on the held-out third: at least 80% named, and every probe run as a
    /// real SQL call before the answer.
    pub(crate) fn assert_named(&self, policy: impl Fn() -> Box<dyn detect::Policy> + Sync) {
        let cases = crate::store_eval::run_policies(
            &self.db,
            &self.test,
            detect::Config::default(),
            |_| Ok(policy()),
            |_| {},
        )
        .unwrap();
        let right = cases.iter().filter(|c| crate::metrics::detected(c)).count();
        assert!(
            right * 10 >= cases.len() * 8,
            "{right}/{} held-out synthetic traces",
            cases.len()
        );
        assert!(cases.iter().all(|c| c.tool_calls == probes::LIBRARY.len()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_classifier_learns_planted_signatures_and_answers_through_the_battery() {
        let split = SyntheticSplit::new();
        let tb = battery(&split.db, &split.train).unwrap();
        let classifier = Arc::new(Classifier::fit(&split.train, &tb, None, |_| {}).unwrap());
        assert!(classifier.log.last().unwrap().train_top1 > 0.9);
        split.assert_named(|| classifier.policy());
    }
}
