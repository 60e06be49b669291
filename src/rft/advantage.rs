//! Advantage estimation: GAE for PPO, group-normalised advantages for GRPO, leave-one-out
//! baselines for RLOO, and whitening.

/// Generalised advantage estimation over one response.
///
/// `rewards[t]` and `values[t]` are per token; the value after the last token is 0 (the episode
/// ends). Returns `(advantages, returns)` with `returns = advantages + values`.
pub fn gae(rewards: &[f32], values: &[f32], gamma: f32, lambda: f32) -> (Vec<f32>, Vec<f32>) {
    let n = rewards.len().min(values.len());
    let mut adv = vec![0.0f32; n];
    let mut last = 0.0f32;
    for t in (0..n).rev() {
        let next_v = if t + 1 < n { values[t + 1] } else { 0.0 };
        let delta = rewards[t] + gamma * next_v - values[t];
        last = delta + gamma * lambda * last;
        adv[t] = last;
    }
    let ret = adv.iter().zip(values).map(|(a, v)| a + v).collect();
    (adv, ret)
}

/// Per-token rewards of a response: `-kl_coef * kl[t]` on every token plus the scalar `score`
/// on the last token (the usual RLHF shaping with a token-level KL penalty).
pub fn shaped_rewards(score: f32, kl: &[f32], kl_coef: f32) -> Vec<f32> {
    let mut r: Vec<f32> = kl.iter().map(|k| -kl_coef * k).collect();
    if let Some(last) = r.last_mut() {
        *last += score;
    }
    r
}

/// Whitens values in place over all (masked) entries: zero mean, unit variance.
pub fn whiten(x: &mut [f32], shift_mean: bool) {
    let n = x.len();
    if n < 2 {
        return;
    }
    let mean = x.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
    let var = x.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    let inv = 1.0 / (var.sqrt() + 1e-8);
    for v in x.iter_mut() {
        let c = *v as f64 - mean;
        *v = if shift_mean {
            (c * inv) as f32
        } else {
            ((c * inv) + mean) as f32
        };
    }
}

/// GRPO: each reward minus its group's mean, divided by the group's standard deviation.
/// `groups` holds the group id of every reward (responses to the same prompt share one).
pub fn group_normalised(rewards: &[f32], groups: &[usize], scale_by_std: bool) -> Vec<f32> {
    let mut out = vec![0.0f32; rewards.len()];
    for (i, &g) in groups.iter().enumerate() {
        let members: Vec<f32> = groups
            .iter()
            .zip(rewards)
            .filter(|(h, _)| **h == g)
            .map(|(_, &r)| r)
            .collect();
        let n = members.len() as f64;
        let mean = members.iter().map(|&r| r as f64).sum::<f64>() / n;
        let std = if members.len() > 1 {
            (members
                .iter()
                .map(|&r| (r as f64 - mean).powi(2))
                .sum::<f64>()
                / (n - 1.0))
                .sqrt()
        } else {
            0.0
        };
        let c = rewards[i] as f64 - mean;
        out[i] = if scale_by_std {
            (c / (std + 1e-6)) as f32
        } else {
            c as f32
        };
    }
    out
}

/// RLOO: each reward minus the mean of the other rewards of its group (0 for a lone response).
pub fn leave_one_out(rewards: &[f32], groups: &[usize]) -> Vec<f32> {
    rewards
        .iter()
        .zip(groups)
        .enumerate()
        .map(|(i, (&r, &g))| {
            let others: Vec<f32> = groups
                .iter()
                .zip(rewards)
                .enumerate()
                .filter(|(j, (h, _))| *j != i && **h == g)
                .map(|(_, (_, &x))| x)
                .collect();
            if others.is_empty() {
                0.0
            } else {
                r - others.iter().sum::<f32>() / others.len() as f32
            }
        })
        .collect()
}

/// Group-relative sequence advantages of the members `live` that enter the update.
///
/// The group statistics use every member of a group (`scores` and `groups` cover all rollouts,
/// including those left out of the update, e.g. empty responses), so a group's baseline does not
/// depend on which members happened to be trainable. GRPO: normalised by the group's mean and
/// std. RLOO (`leave_one_out`): each member's KL penalty (`kl_coef * kl_sums[k]`, `kl_sums`
/// per live member; 0 for members left out) is folded into its score *before* the leave-one-out
/// baseline, so the penalty is baselined like the reward.
pub fn group_advantages(
    scores: &[f32],
    groups: &[usize],
    live: &[usize],
    leave_one_out_baseline: bool,
    kl_sums: &[f32],
    kl_coef: f32,
) -> Vec<f32> {
    let all = if leave_one_out_baseline {
        let mut shaped = scores.to_vec();
        for (&i, &k) in live.iter().zip(kl_sums) {
            if let Some(s) = shaped.get_mut(i) {
                *s -= kl_coef * k;
            }
        }
        leave_one_out(&shaped, groups)
    } else {
        group_normalised(scores, groups, true)
    };
    live.iter()
        .map(|&i| all.get(i).copied().unwrap_or(0.0))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_statistics_keep_members_left_out_of_the_update() {
        // Group 0: two answers scored 1, one empty answer (left out) scored 0.
        let scores = [1.0, 1.0, 0.0];
        let groups = [0, 0, 0];
        let live = [0, 1];
        let g = group_advantages(&scores, &groups, &live, false, &[0.0, 0.0], 0.0);
        assert_eq!(g.len(), 2);
        assert!(g.iter().all(|&a| a > 0.5), "{g:?}");
        let r = group_advantages(&scores, &groups, &live, true, &[0.0, 0.0], 0.0);
        assert!(r.iter().all(|&a| (a - 0.5).abs() < 1e-6), "{r:?}");
    }

    #[test]
    fn the_rloo_kl_penalty_is_baselined() {
        // Same score, different KL: the penalty only moves the members relative to each other.
        let scores = [1.0, 1.0];
        let groups = [0, 0];
        let r = group_advantages(&scores, &groups, &[0, 1], true, &[2.0, 0.0], 0.1);
        assert!(
            (r[0] + 0.2).abs() < 1e-6 && (r[1] - 0.2).abs() < 1e-6,
            "{r:?}"
        );
        assert!((r.iter().sum::<f32>()).abs() < 1e-6);
    }

    #[test]
    fn gae_matches_hand_computation() {
        // gamma = 0.9, lambda = 0.8, three tokens.
        let r = [0.0, 0.0, 1.0];
        let v = [0.5, 0.4, 0.2];
        let (a, ret) = gae(&r, &v, 0.9, 0.8);
        let d2 = 1.0 - 0.2; // 0.8
        let d1 = 0.0 + 0.9 * 0.2 - 0.4; // -0.22
        let d0 = 0.0 + 0.9 * 0.4 - 0.5; // -0.14
        let a2 = d2;
        let a1 = d1 + 0.72 * a2;
        let a0 = d0 + 0.72 * a1;
        for (x, y) in a.iter().zip([a0, a1, a2]) {
            assert!((x - y).abs() < 1e-6, "{a:?}");
        }
        assert!((ret[0] - (a0 + 0.5)).abs() < 1e-6);
    }

    #[test]
    fn gae_with_lambda_one_and_gamma_one_is_return_minus_value() {
        let r = [0.1, -0.2, 2.0];
        let v = [0.3, 0.1, 0.7];
        let (a, ret) = gae(&r, &v, 1.0, 1.0);
        assert!(
            (ret[0] - 1.9).abs() < 1e-6
                && (ret[1] - 1.8).abs() < 1e-6
                && (ret[2] - 2.0).abs() < 1e-6
        );
        assert!((a[0] - 1.6).abs() < 1e-6);
    }

    #[test]
    fn shaped_rewards_put_the_score_on_the_last_token() {
        let r = shaped_rewards(1.0, &[0.5, 0.0, 0.25], 0.1);
        assert_eq!(r, vec![-0.05, 0.0, 1.0 - 0.025]);
    }

    #[test]
    fn whitening_gives_zero_mean_unit_variance() {
        let mut x = vec![1.0, 2.0, 3.0, 4.0];
        whiten(&mut x, true);
        let m: f32 = x.iter().sum::<f32>() / 4.0;
        let var: f32 = x.iter().map(|v| (v - m).powi(2)).sum::<f32>() / 3.0;
        assert!(m.abs() < 1e-6 && (var - 1.0).abs() < 1e-4);
    }

    #[test]
    fn grpo_and_rloo_against_hand_values() {
        let r = [1.0, 0.0, 0.5, 2.0];
        let g = [0, 0, 0, 1];
        let a = group_normalised(&r, &g, true);
        // group 0: mean 0.5, sample std 0.5
        assert!((a[0] - 1.0).abs() < 1e-4 && (a[1] + 1.0).abs() < 1e-4 && a[2].abs() < 1e-6);
        assert_eq!(a[3], 0.0);
        let l = leave_one_out(&r, &g);
        assert!((l[0] - 0.75).abs() < 1e-6 && (l[1] + 0.75).abs() < 1e-6 && l[2].abs() < 1e-6);
        assert_eq!(l[3], 0.0);
    }
}
