//! SCORE_TOPK selection (sinks, window, exclusion, top-p with a `k_max` cap) and the softmax mass
//! each list leaves out: one streaming implementation that both the device and the host fallback
//! run over the same scores in the same block order, so their answers are identical.
//!
//! For one list (one query, or the group's maximum), over the *stored* tokens `S` of the command's
//! blocks: the forced set is `F = ({t < sinks} ∪ window) ∩ S \ exclude`, the candidates are
//! `C = S \ exclude`. Mass is `w_t = exp(scale·s_t − M)` normalised over `C` (f64). The list is
//! `F` plus the best-scored tokens of `C \ F`: up to `k` in total, or, with `top_p`, the fewest in
//! descending score whose mass together with `F`'s reaches `p` (at most `k`). It is returned best
//! first by score (ties by lower token), with the mass of `C` it does not contain.

use crate::ndp::abi::*;
use crate::ndp::layout::DeviceStatus;
use cxlkv_kernels::{Hit, TopKSelector};

/// SCORE_TOPK selection options; the default is plain top-k (no forced tokens, no exclusion).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Select {
    /// Tokens `0..sinks` are always included (0: none).
    pub sinks: u64,
    /// Token range `[start, end)` always included.
    pub window: Option<(u64, u64)>,
    /// Token range `[start, end)` never returned nor counted in the mass (the host holds it).
    pub exclude: Option<(u64, u64)>,
    /// `p` in (0, 1]: the smallest set reaching mass `p`; `k` is then its cap `k_max`.
    pub top_p: Option<f32>,
}

impl Select {
    /// Whether this is more than plain top-k (the command then carries the selection section).
    pub fn is_active(&self) -> bool {
        *self != Select::default()
    }

    /// Checks the options that do not depend on the blocks: `p` in (0, 1], ranges not reversed.
    /// The one statement of these rules: the client's request check reports a [`BadSelect`] as a
    /// bad request, the device and [`Select::from_abi`] as its status (`CXLKV_NDP_ERR_ARGS` with
    /// detail [`SEL_BAD_P`], [`SEL_BAD_WINDOW`] or [`SEL_BAD_EXCLUDE`]).
    pub fn check(&self) -> Result<(), BadSelect> {
        if let Some(p) = self.top_p {
            if !(p > 0.0 && p <= 1.0) {
                return Err(BadSelect {
                    detail: SEL_BAD_P,
                    message: format!("top_p = {p} is outside (0, 1]"),
                });
            }
        }
        for (name, r, detail) in [
            ("window", self.window, SEL_BAD_WINDOW),
            ("exclude", self.exclude, SEL_BAD_EXCLUDE),
        ] {
            if let Some((a, b)) = r {
                if a > b {
                    return Err(BadSelect {
                        detail,
                        message: format!("{name} [{a}, {b}) is reversed"),
                    });
                }
            }
        }
        Ok(())
    }

    /// Whether token `t` is in the exclusion range.
    pub(crate) fn excluded(&self, t: u64) -> bool {
        self.exclude.is_some_and(|(a, b)| t >= a && t < b)
    }

    /// Whether token `t` is always included (a sink or in the window, and not excluded).
    pub(crate) fn forced(&self, t: u64) -> bool {
        !self.excluded(t) && (t < self.sinks || self.window.is_some_and(|(a, b)| t >= a && t < b))
    }
}

/// What [`Select::check`] refuses: the device's error detail and a sentence for a host caller.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct BadSelect {
    /// The `CXLKV_NDP_DETAIL_*` of the device status (`SEL_BAD_*`).
    pub detail: usize,
    /// What is wrong, with the offending values.
    pub message: String,
}

impl From<BadSelect> for DeviceStatus {
    fn from(e: BadSelect) -> DeviceStatus {
        DeviceStatus::at(CXLKV_NDP_ERR_ARGS, e.detail)
    }
}

/// Error detail of a bad `top_p` (with `CXLKV_NDP_ERR_ARGS`).
pub const SEL_BAD_P: usize = CXLKV_NDP_DETAIL_BAD_P as usize;
/// Error detail of a reversed window or one past the sequence's stored tokens.
pub const SEL_BAD_WINDOW: usize = CXLKV_NDP_DETAIL_BAD_WINDOW as usize;
/// Error detail of a reversed exclusion range.
pub const SEL_BAD_EXCLUDE: usize = CXLKV_NDP_DETAIL_BAD_EXCLUDE as usize;
/// Error detail of more forced tokens than `k`.
pub const SEL_TOO_MANY_FORCED: usize = CXLKV_NDP_DETAIL_TOO_MANY_FORCED as usize;

impl Select {
    /// The wire form, with `scale`.
    pub fn to_abi(&self, scale: f32) -> cxlkv_ndp_select {
        let mut options = 0;
        let (ws, we) = self.window.unwrap_or((0, 0));
        let (es, ee) = self.exclude.unwrap_or((0, 0));
        if self.window.is_some() {
            options |= CXLKV_NDP_SEL_WINDOW;
        }
        if self.exclude.is_some() {
            options |= CXLKV_NDP_SEL_EXCLUDE;
        }
        if self.top_p.is_some() {
            options |= CXLKV_NDP_SEL_TOP_P;
        }
        cxlkv_ndp_select {
            scale,
            top_p: self.top_p.unwrap_or(0.0),
            options,
            candidates: 0,
            sinks: self.sinks,
            window_start: ws,
            window_end: we,
            exclude_start: es,
            exclude_end: ee,
            reserved1: 0,
        }
    }

    /// The selection and scale of a wire form read from a peer: unknown options, nonzero reserved
    /// fields or a non-finite scale are refused (`CXLKV_NDP_ERR_ARGS` with its detail), as is
    /// everything [`Select::check`] refuses.
    pub fn from_abi(w: &cxlkv_ndp_select) -> Result<(Select, f32), DeviceStatus> {
        if w.options & !CXLKV_NDP_SEL_ALL != 0 || w.candidates != 0 || w.reserved1 != 0 {
            return Err(DeviceStatus::at(
                CXLKV_NDP_ERR_ARGS,
                CXLKV_NDP_DETAIL_BAD_OPTIONS as usize,
            ));
        }
        if !w.scale.is_finite() {
            return Err(DeviceStatus::at(
                CXLKV_NDP_ERR_ARGS,
                CXLKV_NDP_DETAIL_BAD_SCALE as usize,
            ));
        }
        let on = |bit: u32| w.options & bit != 0;
        let sel = Select {
            sinks: w.sinks,
            window: on(CXLKV_NDP_SEL_WINDOW).then_some((w.window_start, w.window_end)),
            exclude: on(CXLKV_NDP_SEL_EXCLUDE).then_some((w.exclude_start, w.exclude_end)),
            top_p: on(CXLKV_NDP_SEL_TOP_P).then_some(w.top_p),
        };
        sel.check()?;
        Ok((sel, w.scale))
    }
}

/// One list's selection being built over the scan (blocks fed in command order).
#[derive(Clone, Debug)]
struct ListState {
    forced: Vec<Hit>,
    best: TopKSelector,
    /// Running log-sum-exp of the candidates' scaled scores: max and sum of `exp(s - max)`.
    max: f64,
    sum: f64,
}

/// A selection over the scan of a command's blocks: [`Selection::feed`] each block's scores, then
/// [`Selection::finish`].
#[derive(Clone, Debug)]
pub struct Selection {
    sel: Select,
    k: usize,
    scale: f64,
    lists: Vec<ListState>,
}

/// The answer of a [`Selection`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Selected {
    /// Hits per list, best first (scores unscaled).
    pub lists: Vec<Vec<Hit>>,
    /// Mass each list leaves out.
    pub left_out: Vec<f32>,
    /// Per list, the log-sum-exp of the scaled scores of every token fed (outside exclude): the
    /// maximum and the sum of `exp(x - max)`, in f64 (empty from engines that do not report it).
    pub log_sum_exp: Vec<(f64, f64)>,
}

impl Selection {
    /// A selection of `lists` lists of at most `k` hits over blocks covering token ranges
    /// `ranges` (`[base, base + tokens)` each). Fails when the window reaches past the last stored
    /// token or more tokens are forced than `k`.
    pub fn new(
        sel: Select,
        k: usize,
        scale: f32,
        lists: usize,
        ranges: &[(u64, u64)],
    ) -> Result<Selection, DeviceStatus> {
        sel.check()?;
        let end = ranges.iter().map(|r| r.1).max().unwrap_or(0);
        if sel.window.is_some_and(|(_, b)| b > end) {
            return Err(DeviceStatus::at(CXLKV_NDP_ERR_ARGS, SEL_BAD_WINDOW));
        }
        let forced: u64 = ranges.iter().map(|&(a, b)| count_forced(&sel, a, b)).sum();
        if forced > k as u64 {
            return Err(DeviceStatus::at(CXLKV_NDP_ERR_ARGS, SEL_TOO_MANY_FORCED));
        }
        let rest = k - forced as usize;
        Ok(Selection {
            sel,
            k,
            scale: f64::from(scale),
            lists: (0..lists)
                .map(|_| ListState {
                    forced: Vec::new(),
                    best: TopKSelector::new(rest),
                    max: f64::NEG_INFINITY,
                    sum: 0.0,
                })
                .collect(),
        })
    }

    /// Feeds the scores of one block: tokens `base..base + n`, key-major `scores[i * g + j]` for
    /// `g` queries; `group_max` ranks one list by each token's maximum over the queries.
    pub fn feed(&mut self, base: u32, scores: &[f32], g: usize, group_max: bool) {
        let n = scores.len() / g.max(1);
        for i in 0..n {
            let t = base + i as u32;
            if self.sel.excluded(u64::from(t)) {
                continue;
            }
            let forced = self.sel.forced(u64::from(t));
            let row = &scores[i * g..(i + 1) * g];
            if group_max {
                let s = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                Self::offer(&mut self.lists[0], t, s, forced, self.scale);
            } else {
                for (l, &s) in self.lists.iter_mut().zip(row) {
                    Self::offer(l, t, s, forced, self.scale);
                }
            }
        }
    }

    /// Feeds the scores of tokens `tokens` (any order, each once, none fed before),
    /// key-major `scores[i * g + j]` for `g` queries, one list per query.
    pub fn feed_tokens(&mut self, tokens: &[u32], scores: &[f32], g: usize) {
        for (i, &t) in tokens.iter().enumerate() {
            if self.sel.excluded(u64::from(t)) {
                continue;
            }
            let forced = self.sel.forced(u64::from(t));
            for (l, &s) in self.lists.iter_mut().zip(&scores[i * g..(i + 1) * g]) {
                Self::offer(l, t, s, forced, self.scale);
            }
        }
    }

    /// Adds the scores of one block (tokens `base..`, key-major for `g` queries, one list per
    /// query) to each list's mass only, leaving out the tokens in `skip` (sorted) and the excluded
    /// ones: the estimated terms of tokens that can no longer be selected. The block's terms are
    /// summed in f32 in token order with [`cxlkv_kernels::attend::exp_neg`] against the block's
    /// own maximum, then folded into the list's f64 log-sum-exp with one rescaling: an estimate's
    /// precision (about 1e-6 relative) at a fraction of the cost of an f64 `exp` per token.
    pub fn feed_mass(&mut self, base: u32, scores: &[f32], g: usize, skip: &[u32]) {
        let n = scores.len() / g.max(1);
        let mut kept = Vec::with_capacity(n);
        let mut s = skip.partition_point(|&t| t < base);
        for i in 0..n {
            let t = base + i as u32;
            while s < skip.len() && skip[s] < t {
                s += 1;
            }
            if (s < skip.len() && skip[s] == t) || self.sel.excluded(u64::from(t)) {
                continue;
            }
            kept.push(i);
        }
        if kept.is_empty() {
            return;
        }
        for (j, l) in self.lists.iter_mut().enumerate() {
            let x = |i: usize| self.scale * f64::from(scores[i * g + j]);
            let m = kept.iter().map(|&i| x(i)).fold(f64::NEG_INFINITY, f64::max);
            let sum: f32 = kept
                .iter()
                .map(|&i| cxlkv_kernels::attend::exp_neg((x(i) - m) as f32))
                .sum();
            let sum = f64::from(sum);
            if m > l.max {
                l.sum = l.sum * (l.max - m).exp() + sum;
                l.max = m;
            } else {
                l.sum += sum * (m - l.max).exp();
            }
        }
    }

    #[inline]
    fn add_mass(l: &mut ListState, x: f64) {
        if x > l.max {
            l.sum = l.sum * (l.max - x).exp() + 1.0;
            l.max = x;
        } else {
            l.sum += (x - l.max).exp();
        }
    }

    #[inline]
    fn offer(l: &mut ListState, t: u32, s: f32, forced: bool, scale: f64) {
        Self::add_mass(l, scale * f64::from(s));
        if forced {
            l.forced.push(Hit { index: t, score: s });
        } else {
            l.best.push(t, s);
        }
    }

    /// The lists and the mass each leaves out.
    pub fn finish(self) -> Selected {
        let mut out = Selected::default();
        for l in self.lists {
            let w = |h: &Hit| (self.scale * f64::from(h.score) - l.max).exp() / l.sum;
            let mut taken: f64 = l.forced.iter().map(w).sum();
            let mut hits = l.forced;
            let best = l.best.into_sorted();
            match self.sel.top_p {
                None => {
                    taken += best.iter().map(w).sum::<f64>();
                    hits.extend(best);
                }
                Some(p) => {
                    for h in best {
                        if taken >= f64::from(p) || hits.len() >= self.k {
                            break;
                        }
                        taken += w(&h);
                        hits.push(h);
                    }
                }
            }
            hits.sort_unstable_by(|a, b| a.rank_cmp(b));
            let left = if l.sum > 0.0 {
                (1.0 - taken).max(0.0)
            } else {
                0.0
            };
            out.lists.push(hits);
            out.left_out.push(left as f32);
            out.log_sum_exp.push((l.max, l.sum));
        }
        out
    }
}

/// Tokens of `[a, b)` that `sel` forces.
fn count_forced(sel: &Select, a: u64, b: u64) -> u64 {
    let len = |r: (u64, u64)| r.1.saturating_sub(r.0);
    let inter = |r: (u64, u64), s: (u64, u64)| (r.0.max(s.0), r.1.min(s.1));
    let sinks = (0, sel.sinks);
    let window = sel.window.unwrap_or((0, 0));
    // |(sinks ∪ window) ∩ x|
    let union_in = |x: (u64, u64)| {
        len(inter(sinks, x)) + len(inter(window, x)) - len(inter(inter(sinks, window), x))
    };
    let all = (a, b);
    let ex = sel.exclude.map_or(0, |e| union_in(inter(all, e)));
    union_in(all) - ex
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Brute force: every stored token's list, sorted, cut by the rules.
    fn reference(sel: &Select, k: usize, scale: f64, scores: &[(u32, f32)]) -> (Vec<Hit>, f32) {
        let cand: Vec<Hit> = scores
            .iter()
            .filter(|(t, _)| !sel.excluded(u64::from(*t)))
            .map(|&(index, score)| Hit { index, score })
            .collect();
        let max = cand
            .iter()
            .map(|h| scale * f64::from(h.score))
            .fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = cand
            .iter()
            .map(|h| (scale * f64::from(h.score) - max).exp())
            .sum();
        let w = |h: &Hit| (scale * f64::from(h.score) - max).exp() / z;
        let mut forced: Vec<Hit> = cand
            .iter()
            .copied()
            .filter(|h| sel.forced(u64::from(h.index)))
            .collect();
        let mut others: Vec<Hit> = cand
            .iter()
            .copied()
            .filter(|h| !sel.forced(u64::from(h.index)))
            .collect();
        others.sort_by(|a, b| a.rank_cmp(b));
        let mut taken: f64 = forced.iter().map(w).sum();
        for h in others {
            let full = forced.len() >= k;
            let done = sel.top_p.is_some_and(|p| taken >= f64::from(p));
            if full || done {
                break;
            }
            taken += w(&h);
            forced.push(h);
        }
        forced.sort_by(|a, b| a.rank_cmp(b));
        (forced, (1.0 - taken).max(0.0) as f32)
    }

    #[test]
    fn selection_matches_brute_force() {
        let mut rng = cxlkv_kernels::rng::SplitMix64::new(11);
        let ranges = [(0u64, 40u64), (40, 100), (100, 130)];
        let scale = 0.3f32;
        let sels = [
            Select::default(),
            Select {
                sinks: 4,
                ..Default::default()
            },
            Select {
                sinks: 2,
                window: Some((110, 130)),
                ..Default::default()
            },
            Select {
                sinks: 3,
                window: Some((1, 10)),
                exclude: Some((5, 120)),
                ..Default::default()
            },
            Select {
                top_p: Some(0.5),
                ..Default::default()
            },
            Select {
                sinks: 1,
                window: Some((120, 130)),
                top_p: Some(0.9),
                exclude: Some((0, 0)),
            },
            Select {
                top_p: Some(1.0),
                ..Default::default()
            },
        ];
        for g in [1usize, 3] {
            let n = 130;
            let scores: Vec<f32> = (0..n * g).map(|_| 4.0 * rng.normal()).collect();
            for sel in &sels {
                for group_max in [false, true] {
                    for k in [30usize, 60, 130] {
                        let lists = if group_max { 1 } else { g };
                        let mut s = Selection::new(*sel, k, scale, lists, &ranges).unwrap();
                        for &(a, b) in &ranges {
                            s.feed(
                                a as u32,
                                &scores[a as usize * g..b as usize * g],
                                g,
                                group_max,
                            );
                        }
                        let got = s.finish();
                        for l in 0..lists {
                            let per: Vec<(u32, f32)> = (0..n)
                                .map(|i| {
                                    let row = &scores[i * g..(i + 1) * g];
                                    let s = if group_max {
                                        row.iter().copied().fold(f32::NEG_INFINITY, f32::max)
                                    } else {
                                        row[l]
                                    };
                                    (i as u32, s)
                                })
                                .collect();
                            let (want, left) = reference(sel, k, f64::from(scale), &per);
                            assert_eq!(got.lists[l], want, "{sel:?} k {k} list {l}");
                            assert!(
                                (got.left_out[l] - left).abs() < 1e-6,
                                "{sel:?}: {} vs {left}",
                                got.left_out[l]
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn bad_selections_are_refused() {
        let r = [(0u64, 10u64)];
        let bad = |s: Select, k: usize| Selection::new(s, k, 1.0, 1, &r).unwrap_err().detail;
        let p = |p: f32| Select {
            top_p: Some(p),
            ..Default::default()
        };
        assert_eq!(bad(p(0.0), 4), SEL_BAD_P as u32);
        assert_eq!(bad(p(1.5), 4), SEL_BAD_P as u32);
        assert_eq!(bad(p(f32::NAN), 4), SEL_BAD_P as u32);
        let w = |a, b| Select {
            window: Some((a, b)),
            ..Default::default()
        };
        assert_eq!(bad(w(5, 11), 8), SEL_BAD_WINDOW as u32);
        assert_eq!(bad(w(6, 5), 8), SEL_BAD_WINDOW as u32);
        assert_eq!(bad(w(0, 9), 8), SEL_TOO_MANY_FORCED as u32);
        let e = Select {
            exclude: Some((3, 2)),
            ..Default::default()
        };
        assert_eq!(bad(e, 8), SEL_BAD_EXCLUDE as u32);
        // Excluded tokens are not forced: 9 in the window, 2 of them excluded.
        let ok = Select {
            window: Some((0, 9)),
            exclude: Some((2, 4)),
            ..Default::default()
        };
        assert!(Selection::new(ok, 7, 1.0, 1, &r).is_ok());
        let sinks = Select {
            sinks: 100,
            ..Default::default()
        };
        assert_eq!(bad(sinks, 9), SEL_TOO_MANY_FORCED as u32);
    }
}
