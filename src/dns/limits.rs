//! The per-minute halves of `dns.limits`, per sandbox: a budget of queries
//! forwarded (a bucket that refills evenly, a full minute's worth at most)
//! and of distinct names forwarded within any 60 seconds. Both the
//! responder's forwarded queries and the proxy's own hostname lookups spend
//! from it. Its memory is bounded by `names_per_minute` (at most 10,000
//! names, validation's ceiling). It never blocks: a query over a budget is
//! refused at once, and the caller decides what that means.
//!
//! Hand-written rather than taken from a rate-limiting crate (governor):
//! the query bucket is a few lines, the distinct-name window is not a rate
//! any such crate offers, and one lock over both keeps them consistent
//! (a query refused for one budget spends nothing from the other).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::message::Limit;
use crate::policy::DnsLimits;

/// The window distinct names are counted over.
pub(crate) const NAME_WINDOW: Duration = Duration::from_secs(60);

/// What one sandbox has forwarded lately.
#[derive(Default)]
pub struct Budget {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Queries left; `None` until the first query (a full bucket).
    tokens: Option<f64>,
    refilled: Option<Instant>,
    /// Names forwarded in the window, with when each was first seen.
    names: HashMap<String, Instant>,
    /// The same names in the order they were first seen, for expiry.
    order: VecDeque<(Instant, String)>,
}

impl Budget {
    /// Spend one query for `name` (as the policy sees it) at `now` under
    /// `limits`, or say which budget is spent. A refused query spends
    /// nothing.
    pub(crate) fn spend(&self, name: &str, now: Instant, limits: &DnsLimits) -> Result<(), Limit> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let state = &mut *state;

        let capacity = f64::from(limits.queries_per_minute);
        let elapsed = state
            .refilled
            .map_or(Duration::ZERO, |then| now.saturating_duration_since(then));
        let refill = elapsed.as_secs_f64() * capacity / 60.0;
        let tokens = state
            .tokens
            .map_or(capacity, |t| (t + refill).min(capacity));
        state.tokens = Some(tokens);
        state.refilled = Some(now);

        while let Some((first_seen, _)) = state.order.front() {
            if now.saturating_duration_since(*first_seen) < NAME_WINDOW {
                break;
            }
            if let Some((first_seen, old)) = state.order.pop_front() {
                if state.names.get(&old) == Some(&first_seen) {
                    state.names.remove(&old);
                }
            }
        }
        let known = state.names.contains_key(name);
        if !known && state.names.len() >= limits.names_per_minute as usize {
            return Err(Limit::Names);
        }
        if tokens < 1.0 {
            return Err(Limit::Queries);
        }
        state.tokens = Some(tokens - 1.0);
        if !known {
            state.names.insert(name.to_string(), now);
            state.order.push_back((now, name.to_string()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(queries: u32, names: u32) -> DnsLimits {
        DnsLimits {
            queries_per_minute: queries,
            names_per_minute: names,
            ..DnsLimits::default()
        }
    }

    #[test]
    fn a_full_minute_of_queries_may_come_at_once_then_they_refill_evenly() {
        let budget = Budget::default();
        let l = limits(60, 100);
        let t0 = Instant::now();
        for _ in 0..60 {
            assert_eq!(budget.spend("a.test", t0, &l), Ok(()));
        }
        assert_eq!(budget.spend("a.test", t0, &l), Err(Limit::Queries));
        // One query a second comes back.
        let t1 = t0 + Duration::from_millis(1_000);
        assert_eq!(budget.spend("a.test", t1, &l), Ok(()));
        assert_eq!(budget.spend("a.test", t1, &l), Err(Limit::Queries));
        // Never more than a minute's worth.
        let later = t1 + Duration::from_secs(3600);
        for _ in 0..60 {
            assert_eq!(budget.spend("a.test", later, &l), Ok(()));
        }
        assert_eq!(budget.spend("a.test", later, &l), Err(Limit::Queries));
    }

    #[test]
    fn distinct_names_are_counted_over_a_sliding_minute() {
        let budget = Budget::default();
        let l = limits(1000, 2);
        let t0 = Instant::now();
        assert_eq!(budget.spend("a.test", t0, &l), Ok(()));
        assert_eq!(
            budget.spend("b.test", t0 + Duration::from_secs(30), &l),
            Ok(())
        );
        // Known names still go; a third does not.
        assert_eq!(
            budget.spend("a.test", t0 + Duration::from_secs(40), &l),
            Ok(())
        );
        assert_eq!(
            budget.spend("c.test", t0 + Duration::from_secs(40), &l),
            Err(Limit::Names)
        );
        // a.test leaves the window 60 s after it was first seen.
        assert_eq!(
            budget.spend("c.test", t0 + Duration::from_secs(60), &l),
            Ok(())
        );
        assert_eq!(
            budget.spend("d.test", t0 + Duration::from_secs(61), &l),
            Err(Limit::Names)
        );
    }

    #[test]
    fn a_refused_query_spends_nothing() {
        let budget = Budget::default();
        let l = limits(2, 1);
        let t0 = Instant::now();
        assert_eq!(budget.spend("a.test", t0, &l), Ok(()));
        for _ in 0..10 {
            assert_eq!(budget.spend("other.test", t0, &l), Err(Limit::Names));
        }
        assert_eq!(budget.spend("a.test", t0, &l), Ok(()));
    }

    #[test]
    fn the_window_never_holds_more_names_than_the_limit() {
        let budget = Budget::default();
        let l = limits(1_000_000, 50);
        let t0 = Instant::now();
        for i in 0..10_000u64 {
            let _ = budget.spend(&format!("n{i}.test"), t0 + Duration::from_millis(i), &l);
        }
        let state = budget.state.lock().unwrap();
        assert!(state.names.len() <= 50, "{}", state.names.len());
        assert!(state.order.len() <= 50, "{}", state.order.len());
    }
}
