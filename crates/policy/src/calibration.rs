//! The operating point set on a user's own healthy runs: a conformal threshold on the
//! decision head's deficiency score.
//!
//! A head fitted on our frameworks places its `none` boundary where our healthy runs fall. On
//! another framework healthy runs read differently, and a head that has only seen deficient
//! traces look like them calls them deficient. A user who has N healthy runs of their own
//! framework can fix that without retraining: score each, and flag a new trace only when it
//! scores above what the healthy runs scored.
//!
//! The score of a trace is s = 1 − p(none | trace), the head's probability that something is
//! wrong. For healthy scores s₁ ≤ … ≤ sₙ and a target false-positive rate α, the threshold is
//! the k-th smallest, k = ⌈(n + 1)(1 − α)⌉. When a new healthy run is exchangeable with the
//! N (same framework, same kind of task), the chance that it scores above s₍ₖ₎ is at most
//! 1 − k/(n + 1) ≤ α (split conformal prediction; Bates et al., arXiv 2104.08279). With
//! n < 1/α − 1 no k ≤ n exists: the threshold is the largest healthy score and the bound
//! 1/(n + 1) is weaker than α, which the calibration says.
//!
//! At or below the threshold the answer is `none`; above it, the head decides as it would
//! without a calibration (its most likely class, `none` included). A calibration only takes
//! back deficiencies the head would name, so it can lower the false-positive rate and never
//! raise it. (Forcing a deficiency above the threshold raised it: healthy runs that all score
//! near zero set a threshold near zero, and a healthy run the head called `none` at p = 0.8
//! was then named deficient; BENCHMARKS.md, "Frameworks it never trained on".)

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::frame::Frame;
use crate::{PolicyError, Result};
use taxonomy::NONE;

/// File of a checkpoint's calibration, in its `step-N` directory.
pub const CALIBRATION_FILE: &str = "calibration.json";

/// A conformal operating point.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    /// What the healthy runs were (a framework, a deployment), shown wherever it is used.
    pub name: String,
    /// The healthy runs' deficiency scores, ascending (under [`Runs::Unlabelled`], the scores
    /// of the runs of unknown health, kept to show; the name stays for older files).
    pub healthy_scores: Vec<f32>,
    /// The false-positive rate asked for.
    pub alpha: f64,
    /// A trace is answered `none` when its score is at most this.
    pub threshold: f32,
    /// The false-positive rate the threshold guarantees: `alpha`, or 1/(n + 1) when there
    /// were too few healthy runs for `alpha`.
    pub bound: f64,
    /// Added to the head's input before the head reads a trace (empty: nothing): the train
    /// split's healthy mean minus the mean of the user's healthy runs, so that their healthy
    /// runs sit where ours did ([`recentre_shift`]). The scores above are of recentred inputs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recentre: Vec<f32>,
    /// For a framed head ([`crate::frame`]): the healthy runs' typical input, the frame the
    /// head reads every trace through under this calibration (the scores above are of inputs
    /// read through it). Absent: the head's own choice of frame.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frame: Option<Frame>,
    /// What the runs were known to be: healthy (the threshold holds on runs like them), or
    /// unlabelled — a user's runs of unknown health, of which most are healthy — over which
    /// only a framed head's frame is taken and no threshold is set.
    #[serde(default, skip_serializing_if = "Runs::is_healthy")]
    pub runs: Runs,
}

/// What a calibration's runs are known to be.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Runs {
    /// Healthy runs: the conformal threshold over their scores bounds false positives.
    #[default]
    Healthy,
    /// Runs of unknown health: their median is a framed head's frame (robust while most are
    /// healthy, `crate::frame`), and the head's own operating point decides; nothing is bounded.
    Unlabelled,
}

impl Runs {
    fn is_healthy(&self) -> bool {
        *self == Runs::Healthy
    }
}

impl Calibration {
    /// The threshold for `alpha` over the healthy runs' `scores`.
    pub fn conformal(name: &str, scores: &[f32], alpha: f64) -> Result<Calibration> {
        if scores.is_empty() {
            return Err(PolicyError::Calibration(
                "no healthy run to calibrate on: give at least one (19 or more bound the false-positive rate at 5%)".into(),
            ));
        }
        if !(alpha > 0.0 && alpha < 1.0) {
            return Err(PolicyError::Calibration(format!(
                "alpha {alpha} is not a rate in (0, 1)"
            )));
        }
        if let Some(bad) = scores.iter().find(|s| !s.is_finite()) {
            return Err(PolicyError::Calibration(format!(
                "a healthy run's score is {bad}, not a number in [0, 1]"
            )));
        }
        let mut sorted = scores.to_vec();
        sorted.sort_by(f32::total_cmp);
        let n = sorted.len();
        let k = ((n as f64 + 1.0) * (1.0 - alpha)).ceil() as usize;
        let (threshold, bound) = if k <= n {
            (sorted[k.max(1) - 1], alpha)
        } else {
            (sorted[n - 1], 1.0 / (n as f64 + 1.0))
        };
        Ok(Calibration {
            name: name.to_owned(),
            healthy_scores: sorted,
            alpha,
            threshold,
            bound,
            recentre: Vec::new(),
            frame: None,
            runs: Runs::Healthy,
        })
    }

    /// A frame-only calibration: `frame` taken over a user's runs of unknown health, whose
    /// deficiency scores through it were `scores`. It sets no threshold (every trace is decided
    /// by the head's own operating point) and bounds nothing; the scores are kept to show.
    pub fn unlabelled(name: &str, frame: Frame, scores: &[f32]) -> Result<Calibration> {
        if scores.is_empty() || scores.iter().any(|s| !s.is_finite()) {
            return Err(PolicyError::Calibration(
                "an unlabelled calibration needs the finite scores of at least one run".into(),
            ));
        }
        let mut sorted = scores.to_vec();
        sorted.sort_by(f32::total_cmp);
        Ok(Calibration {
            name: name.to_owned(),
            healthy_scores: sorted,
            alpha: 1.0,
            // Scores are probabilities in [0, 1]; `flags` does not read it for these runs.
            threshold: 0.0,
            bound: 1.0,
            recentre: Vec::new(),
            frame: Some(frame),
            runs: Runs::Unlabelled,
        })
    }

    /// This calibration with the head's input moved by `shift` ([`recentre_shift`]); its
    /// scores must have been taken on inputs moved the same way.
    pub fn with_recentre(mut self, shift: Vec<f32>) -> Calibration {
        self.recentre = shift;
        self
    }

    /// This calibration with the framed head reading through `frame`; its scores must have
    /// been taken through it.
    pub fn with_frame(mut self, frame: Option<Frame>) -> Calibration {
        self.frame = frame;
        self
    }

    /// Whether a trace of `score` is flagged as deficient.
    pub fn flags(&self, score: f32) -> bool {
        self.runs == Runs::Unlabelled || score > self.threshold
    }

    /// The conformal p-value of `score`: the share of the healthy runs and the trace itself
    /// that score at least as high. Small means unlike the healthy runs.
    pub fn p_value(&self, score: f32) -> f64 {
        let above = self.healthy_scores.iter().filter(|s| **s >= score).count();
        (above as f64 + 1.0) / (self.healthy_scores.len() as f64 + 1.0)
    }

    /// One line for logs and reports.
    pub fn describe(&self) -> String {
        if self.runs == Runs::Unlabelled {
            return format!(
                "calibration `{}`: {} runs of unknown health (traces read relative to their typical input), no threshold: false positives are not bounded (calibrate on 19 or more healthy runs for that)",
                self.name,
                self.healthy_scores.len()
            );
        }
        format!(
            "calibration `{}`: {} healthy runs{}{}, threshold {:.3}, false positives at most {:.1}%{}",
            self.name,
            self.healthy_scores.len(),
            if self.frame.is_some() {
                " (traces read relative to their typical input)"
            } else {
                ""
            },
            if self.recentre.is_empty() {
                ""
            } else {
                " (head input recentred on them)"
            },
            self.threshold,
            100.0 * self.bound,
            if self.bound > self.alpha {
                format!(
                    " (too few runs for {:.1}%: {} or more are needed)",
                    100.0 * self.alpha,
                    (1.0 / self.alpha).ceil() as usize - 1
                )
            } else {
                String::new()
            }
        )
    }

    /// Writes it as `dir/calibration.json` (a temporary name beside it, then a rename).
    pub fn save(&self, dir: &Path) -> Result<std::path::PathBuf> {
        let path = dir.join(CALIBRATION_FILE);
        let tmp = dir.join(format!(".{CALIBRATION_FILE}.tmp"));
        let text = serde_json::to_string_pretty(self).expect("a calibration serialises");
        std::fs::write(&tmp, text)
            .and_then(|_| std::fs::rename(&tmp, &path))
            .map_err(|e| PolicyError::Io(format!("{}: {e}", path.display())))?;
        Ok(path)
    }

    /// Reads a calibration file, checking it is one.
    pub fn load(path: &Path) -> Result<Calibration> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| PolicyError::Io(format!("{}: {e}", path.display())))?;
        let c: Calibration = serde_json::from_str(&text)
            .map_err(|e| PolicyError::Io(format!("{}: not a calibration: {e}", path.display())))?;
        let sorted = c.healthy_scores.windows(2).all(|w| w[0] <= w[1]);
        if c.recentre.iter().any(|v| !v.is_finite()) {
            return Err(PolicyError::Io(format!(
                "{}: `recentre` holds a value that is not a finite number",
                path.display()
            )));
        }
        if c.runs == Runs::Unlabelled && c.frame.is_none() {
            return Err(PolicyError::Io(format!(
                "{}: a calibration over unlabelled runs sets a frame, and this one holds none",
                path.display()
            )));
        }
        if c.healthy_scores.is_empty() || !sorted || !c.threshold.is_finite() {
            return Err(PolicyError::Io(format!(
                "{}: a calibration needs its healthy scores, ascending, and a finite threshold",
                path.display()
            )));
        }
        Ok(c)
    }

    /// `dir/calibration.json` when there is one.
    pub fn beside(dir: &Path) -> Result<Option<Calibration>> {
        let path = dir.join(CALIBRATION_FILE);
        if path.is_file() {
            Calibration::load(&path).map(Some)
        } else {
            Ok(None)
        }
    }
}

/// The shift that moves the mean of a framework's healthy head inputs onto `reference`, the
/// mean of the train split's healthy inputs ([`crate::decision::DecisionHead::healthy_mean`]).
///
/// Why: a framework's healthy runs differ from ours by what the framework prints in every run
/// (its turn structure, its wrappers, how it reports tokens), an offset that the head reads as
/// evidence of whichever deficiency lies in that direction. Subtracting the offset measured on
/// the user's healthy runs (first-moment alignment, as CORAL aligns the second) leaves what
/// differs from run to run. Each coordinate's offset is shrunk towards 0 by n/(n + `PRIOR_RUNS`)
/// so that a handful of runs moves the input only as far as their mean is trustworthy.
pub fn recentre_shift(reference: &[f32], healthy: &[&[f32]]) -> Result<Vec<f32>> {
    let n = healthy.len();
    if n == 0 || reference.is_empty() {
        return Err(PolicyError::Calibration(
            "recentring needs healthy runs and a head that recorded its healthy mean".into(),
        ));
    }
    if let Some(bad) = healthy.iter().find(|h| h.len() != reference.len()) {
        return Err(PolicyError::Calibration(format!(
            "a healthy run's head input has {} values, the head reads {}",
            bad.len(),
            reference.len()
        )));
    }
    let keep = n as f32 / (n as f32 + PRIOR_RUNS);
    Ok(reference
        .iter()
        .enumerate()
        .map(|(j, r)| {
            let mean = healthy.iter().map(|h| h[j]).sum::<f32>() / n as f32;
            keep * (r - mean)
        })
        .collect())
}

/// Pseudo-runs of the shrinkage in [`recentre_shift`]: with 5 healthy runs the offset is
/// taken at 5/7 of its measured size, with 20 at 10/11.
pub const PRIOR_RUNS: f32 = 2.0;

/// A head's deficiency score from its type log-probabilities: 1 − p(none), or 1 for a head
/// without `none`.
pub fn deficiency_score(types: &[String], log_probs: &[f32]) -> f32 {
    match types.iter().position(|t| t == NONE) {
        Some(k) => (1.0 - log_probs[k].exp()).clamp(0.0, 1.0),
        None => 1.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_of_unknown_health_set_a_frame_and_no_threshold() {
        let frame = Frame {
            name: "3 runs of fw".into(),
            traces: 3,
            centre: vec![0.5, 0.0],
        };
        let c = Calibration::unlabelled("fw", frame, &[0.9, 0.1, 0.4]).unwrap();
        assert_eq!(c.healthy_scores, vec![0.1, 0.4, 0.9]);
        // Every score is left to the head's own operating point, the lowest included.
        assert!(c.flags(0.0) && c.flags(0.05));
        assert!(c.describe().contains("not bounded"), "{}", c.describe());
        let dir = tempfile::tempdir().unwrap();
        let path = c.save(dir.path()).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("\"runs\": \"unlabelled\""), "{text}");
        assert_eq!(Calibration::load(&path).unwrap(), c);
        // Without its frame such a calibration means nothing, and loading says so.
        let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
        v.as_object_mut().unwrap().remove("frame");
        std::fs::write(&path, v.to_string()).unwrap();
        let err = Calibration::load(&path).unwrap_err().to_string();
        assert!(err.contains("holds none"), "{err}");
        assert!(Calibration::unlabelled("fw", c.frame.clone().unwrap(), &[]).is_err());
        // A healthy calibration's file has no `runs` field, and older files still load.
        let healthy = Calibration::conformal("fw", &[0.1, 0.2], 0.05).unwrap();
        assert!(!serde_json::to_string(&healthy).unwrap().contains("runs"));
    }

    #[test]
    fn the_threshold_is_the_conformal_quantile_of_the_healthy_scores() {
        // 19 healthy runs: k = ⌈20 · 0.95⌉ = 19, the largest.
        let scores: Vec<f32> = (1..=19).map(|i| i as f32 / 20.0).collect();
        let c = Calibration::conformal("fw", &scores, 0.05).unwrap();
        assert_eq!(c.threshold, 0.95);
        assert_eq!(c.bound, 0.05);
        // 39 runs: k = ⌈40 · 0.95⌉ = 38, the second largest.
        let scores: Vec<f32> = (1..=39).map(|i| i as f32 / 40.0).collect();
        let c = Calibration::conformal("fw", &scores, 0.05).unwrap();
        assert_eq!(c.threshold, 38.0 / 40.0);
        assert!(c.flags(39.0 / 40.0) && !c.flags(38.0 / 40.0));
        // Five runs cannot bound at 5%: the largest, and a bound of 1/6.
        let c = Calibration::conformal("fw", &[0.3, 0.1, 0.5, 0.2, 0.4], 0.05).unwrap();
        assert_eq!(c.threshold, 0.5);
        assert!((c.bound - 1.0 / 6.0).abs() < 1e-12);
        assert!(c.describe().contains("19 or more"), "{}", c.describe());
        assert_eq!(c.healthy_scores, vec![0.1, 0.2, 0.3, 0.4, 0.5]);
    }

    #[test]
    fn the_bound_holds_on_exchangeable_healthy_scores() {
        // Healthy scores from one distribution: the share of new ones flagged stays at or
        // below alpha on average over calibration sets.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut uniform = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 11) as f32 / (1u64 << 53) as f32
        };
        let (mut flagged, mut total) = (0usize, 0usize);
        for _ in 0..400 {
            let cal: Vec<f32> = (0..20).map(|_| uniform()).collect();
            let c = Calibration::conformal("fw", &cal, 0.05).unwrap();
            for _ in 0..50 {
                flagged += usize::from(c.flags(uniform()));
                total += 1;
            }
        }
        let rate = flagged as f64 / total as f64;
        assert!(rate <= 0.05 + 0.01, "false-positive rate {rate}");
        assert!(
            rate >= 0.02,
            "the threshold is not needlessly strict: {rate}"
        );
    }

    #[test]
    fn bad_calibrations_are_refused_with_a_reason() {
        assert!(Calibration::conformal("fw", &[], 0.05).is_err());
        assert!(Calibration::conformal("fw", &[0.1], 0.0).is_err());
        assert!(Calibration::conformal("fw", &[f32::NAN], 0.05).is_err());
        let dir = tempfile::tempdir().unwrap();
        let c = Calibration::conformal("fw", &[0.2, 0.1], 0.5).unwrap();
        let path = c.save(dir.path()).unwrap();
        assert_eq!(Calibration::load(&path).unwrap(), c);
        assert_eq!(Calibration::beside(dir.path()).unwrap(), Some(c));
        std::fs::write(&path, "{\"name\": 1}").unwrap();
        let err = Calibration::load(&path).unwrap_err().to_string();
        assert!(err.contains("not a calibration"), "{err}");
    }

    #[test]
    fn recentring_moves_the_healthy_mean_onto_the_reference_shrunk_by_the_run_count() {
        let reference = [1.0f32, -2.0];
        // Two runs, mean (4, -2): an offset of (-3, 0), kept at 2 / (2 + PRIOR_RUNS).
        let runs = [[3.0f32, 0.0], [5.0, -4.0]];
        let rows: Vec<&[f32]> = runs.iter().map(|r| &r[..]).collect();
        let keep = 2.0 / (2.0 + PRIOR_RUNS);
        assert_eq!(
            recentre_shift(&reference, &rows).unwrap(),
            vec![-3.0 * keep, 0.0]
        );
        assert!(recentre_shift(&reference, &[]).is_err());
        assert!(recentre_shift(&[], &rows).is_err());
        let err = recentre_shift(&reference, &[&[1.0][..]])
            .unwrap_err()
            .to_string();
        assert!(err.contains("has 1 values, the head reads 2"), "{err}");
        // Saved and read back with its shift; a shift that is not a number is refused.
        let dir = tempfile::tempdir().unwrap();
        let c = Calibration::conformal("fw", &[0.2], 0.5)
            .unwrap()
            .with_recentre(vec![0.5, -0.25]);
        let path = c.save(dir.path()).unwrap();
        assert_eq!(Calibration::load(&path).unwrap(), c);
        assert!(c.describe().contains("recentred"), "{}", c.describe());
        let text = std::fs::read_to_string(&path)
            .unwrap()
            .replace("-0.25", "1e999");
        std::fs::write(&path, text).unwrap();
        assert!(Calibration::load(&path).is_err());
    }

    #[test]
    fn the_score_is_the_probability_of_a_deficiency() {
        let types = vec!["P1".to_string(), NONE.to_string()];
        let lp = [0.25f32.ln(), 0.75f32.ln()];
        assert!((deficiency_score(&types, &lp) - 0.25).abs() < 1e-6);
        assert_eq!(deficiency_score(&types[..1], &lp[..1]), 1.0);
    }
}
