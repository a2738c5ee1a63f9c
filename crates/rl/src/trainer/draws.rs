//! Every random number of a run: `mix(seed, step, index, Draw)`, one named stream per purpose,
//! so two draws share a number only when they are the same draw. A checkpoint records the
//! scheme (`checkpoint::RNG_SCHEME`) and a resume under another is refused.

/// What a random number is drawn for. Each is its own stream of [`mix`], so two draws share a
/// number only when they are the same draw (step, index and purpose alike).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Draw {
    /// The Injector's choice among the offered templates for episode `i`.
    InjectorChoice = 1,
    /// The task a new episode `i` runs on.
    Task = 2,
    /// The `k`-th sampled investigation of live trace `i` (index `i · samples + k`): the token
    /// policy's decoding options, or the decision head's draw — a run uses one of the two.
    Investigation = 3,
    /// The higher-order review of failure `k`.
    Review = 4,
    /// The free-form diff written for episode `i`.
    FreeDiff = 5,
    /// Which train trace the `j`-th replay slot of a PPO step holds.
    ReplayPick = 6,
    /// The focus schedule's draw of episode `i`'s template.
    Focus = 7,
    /// The `k`-th sampled decision on replay slot `j` (index `j · samples + k`).
    ReplaySample = 8,
    /// The initial LoRA weights of adapter `i` (step 0).
    AdapterInit = 9,
    /// Which train log the `j`-th blame slot of a PPO step holds.
    BlameLog = 10,
    /// The `k`-th sampled turn of blame slot `j` (index `j · samples + k`).
    BlameTurn = 11,
}

/// A stable 64-bit mix of the run seed, a position and what it is drawn for (SplitMix64
/// finaliser), the only source of randomness in a run.
pub fn mix(seed: u64, step: u64, index: u64, draw: Draw) -> u64 {
    let mut z = seed
        ^ step.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ index.wrapping_mul(0xBF58_476D_1CE4_E5B9)
        ^ (draw as u64).wrapping_mul(0x94D0_49BB_1331_11EB);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A uniform number in [0, 1) from a mixed 64-bit value.
pub fn unit(x: u64) -> f64 {
    (x >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_draw_is_its_own_stream() {
        // The same seed, step and index give a different number for every purpose: the
        // focus draw of episode 3 no longer equals the replay's third sample.
        let draws = [
            Draw::InjectorChoice,
            Draw::Task,
            Draw::Investigation,
            Draw::Review,
            Draw::FreeDiff,
            Draw::ReplayPick,
            Draw::Focus,
            Draw::ReplaySample,
            Draw::AdapterInit,
            Draw::BlameLog,
            Draw::BlameTurn,
        ];
        for step in [0, 1, 7] {
            for index in [0, 3, 40] {
                let mut seen: Vec<u64> = draws.iter().map(|d| mix(11, step, index, *d)).collect();
                seen.sort_unstable();
                seen.dedup();
                assert_eq!(seen.len(), draws.len(), "step {step}, index {index}");
            }
        }
        assert_ne!(mix(0, 1, 3, Draw::Focus), mix(0, 1, 3, Draw::ReplaySample));
        // Pinned: a change to the streams must come with a new `checkpoint::RNG_SCHEME`, or a
        // resumed run would draw other numbers than the run it resumes.
        assert_eq!(mix(0, 1, 3, Draw::Focus), 0x722f_5cc0_278f_4ee2);
    }
}
