//! DAPO-style dynamic sampling for stage 2. A group whose rewards all tie has zero advantage and
//! teaches nothing, so a step samples up to `max_refill` extra prompts beyond
//! `prompts_per_step` and trains on the first `prompts_per_step` groups that do not tie: the extra
//! groups refill the places of tied ones, and the cap bounds the extra rollouts. Subtasks whose
//! groups were all-1 for `saturate_after` steps in a row are saturated: their prompts are redrawn
//! once when chosen, so they get fewer rollouts.

use std::collections::{BTreeMap, BTreeSet};

/// Prompts to roll out this step: `prompts_per_step`, plus the refill cap when dynamic sampling
/// is on.
pub fn prompts_to_sample(prompts_per_step: usize, dynamic: bool, max_refill: usize) -> usize {
    if dynamic {
        prompts_per_step + max_refill
    } else {
        prompts_per_step
    }
}

/// Whether a group's rewards all tie (zero standard deviation; an empty group ties).
pub fn ties(scores: &[f32]) -> bool {
    scores.windows(2).all(|w| w[0] == w[1])
}

/// Which groups a step trains on, and how many refill groups replaced tied ones.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selection {
    /// Per group: kept for the update.
    pub keep: Vec<bool>,
    /// Kept groups from beyond the first `want` (refills).
    pub refilled: usize,
}

/// Keeps the first `want` groups whose rewards do not tie, in sampling order; when fewer do not
/// tie, the first `want` groups are kept (their ties are handled as without dynamic sampling).
/// `groups[g]` are group `g`'s rewards; without dynamic sampling pass `want = groups.len()`.
pub fn select_groups(groups: &[Vec<f32>], want: usize) -> Selection {
    let mut keep = vec![false; groups.len()];
    let mut kept = 0;
    for (g, s) in groups.iter().enumerate() {
        if kept < want && !ties(s) {
            keep[g] = true;
            kept += 1;
        }
    }
    // Fill from the base groups (ties included) in order, up to `want`.
    for k in keep.iter_mut().take(want) {
        if kept >= want {
            break;
        }
        if !*k {
            *k = true;
            kept += 1;
        }
    }
    let refilled = keep.iter().skip(want).filter(|&&k| k).count();
    Selection { keep, refilled }
}

/// Streaks of all-1 steps per subtask.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Saturation {
    streak: BTreeMap<String, usize>,
}

impl Saturation {
    /// Records a step: `groups` are (subtask, rewards) of its groups. A subtask whose groups all
    /// scored 1 extends its streak; any other score resets it; an absent subtask keeps it.
    pub fn update(&mut self, groups: &[(String, Vec<f32>)]) {
        let mut seen: BTreeMap<&str, bool> = BTreeMap::new();
        for (sub, s) in groups {
            let all_one = !s.is_empty() && s.iter().all(|&x| x >= 1.0);
            let e = seen.entry(sub.as_str()).or_insert(true);
            *e = *e && all_one;
        }
        for (sub, all_one) in seen {
            let e = self.streak.entry(sub.to_string()).or_default();
            *e = if all_one { *e + 1 } else { 0 };
        }
    }

    /// Subtasks saturated for at least `after` steps (0: none ever).
    pub fn saturated(&self, after: usize) -> BTreeSet<String> {
        if after == 0 {
            return BTreeSet::new();
        }
        self.streak
            .iter()
            .filter(|(_, &n)| n >= after)
            .map(|(s, _)| s.clone())
            .collect()
    }
}

/// Redraws (once, with `draw`) each chosen prompt whose subtask is saturated, so saturated
/// subtasks get about half the prompts they would.
pub fn thin_saturated(
    chosen: &mut [usize],
    subtask_of: impl Fn(usize) -> String,
    saturated: &BTreeSet<String>,
    mut draw: impl FnMut() -> usize,
) {
    if saturated.is_empty() {
        return;
    }
    for c in chosen.iter_mut() {
        if saturated.contains(&subtask_of(*c)) {
            *c = draw();
        }
    }
}

/// The effective number of prompts (`1 / sum p^2`, rounded) when `thinned` of `pool` prompts
/// belong to saturated subtasks and [`thin_saturated`] redraws them once: a prompt is drawn with
/// chance `(1[not thinned] + f) / pool`, `f = thinned / pool`.
pub fn effective_pool(pool: usize, thinned: usize) -> usize {
    if pool == 0 || thinned == 0 {
        return pool;
    }
    let (m, t) = (pool as f64, thinned.min(pool) as f64);
    let f = t / m;
    let sum_sq = ((m - t) * (1.0 + f).powi(2) + t * f * f) / (m * m);
    ((1.0 / sum_sq).round() as usize).clamp(1, pool)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thinning_shrinks_the_effective_pool() {
        assert_eq!(effective_pool(16, 0), 16);
        // Every prompt thinned: the redraw is uniform again.
        assert_eq!(effective_pool(16, 16), 16);
        // Half thinned: p = 1.5/16 for 8 prompts, 0.5/16 for 8: 1 / sum p^2 = 12.8.
        assert_eq!(effective_pool(16, 8), 13);
        assert_eq!(effective_pool(0, 3), 0);
    }

    #[test]
    fn tied_groups_are_refilled_up_to_the_cap() {
        // 3 wanted, 2 extra; group 1 ties (all 0), group 2 ties (all 1).
        let g = vec![
            vec![0.0, 1.0],
            vec![0.0, 0.0],
            vec![1.0, 1.0],
            vec![0.2, 0.4],
            vec![0.5, 0.1],
        ];
        let s = select_groups(&g, 3);
        assert_eq!(s.keep, vec![true, false, false, true, true]);
        assert_eq!(s.refilled, 2);
        // More ties than the cap can refill: the batch keeps `want` groups, refills are capped.
        let g = vec![
            vec![1.0, 1.0],
            vec![0.0, 0.0],
            vec![0.0, 0.0],
            vec![0.3, 0.9],
        ];
        let s = select_groups(&g, 3);
        assert_eq!(s.keep.iter().filter(|&&k| k).count(), 3);
        assert_eq!(s.refilled, 1);
        assert!(s.keep[3]);
        // Without dynamic sampling (want = all), everything is kept.
        let s = select_groups(&g, g.len());
        assert!(s.keep.iter().all(|&k| k) && s.refilled == 0);
    }

    #[test]
    fn saturated_subtasks_are_thinned() {
        let mut sat = Saturation::default();
        for _ in 0..2 {
            sat.update(&[
                ("file".into(), vec![1.0, 1.0]),
                ("edit".into(), vec![0.0, 1.0]),
            ]);
        }
        assert!(sat.saturated(3).is_empty());
        sat.update(&[("file".into(), vec![1.0, 1.0])]);
        let s = sat.saturated(3);
        assert_eq!(s.into_iter().collect::<Vec<_>>(), vec!["file".to_string()]);
        // One non-1 score resets the streak.
        sat.update(&[("file".into(), vec![1.0, 0.5])]);
        assert!(sat.saturated(1).is_empty());
        // Thinning redraws only the saturated subtask's prompts.
        let saturated: BTreeSet<String> = ["file".to_string()].into();
        let mut chosen = vec![0, 1, 2, 3];
        let sub = |p: usize| if p % 2 == 0 { "file" } else { "edit" }.to_string();
        thin_saturated(&mut chosen, sub, &saturated, || 7);
        assert_eq!(chosen, vec![7, 1, 7, 3]);
    }
}
