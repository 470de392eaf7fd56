//! The policy currently in force, swappable under live traffic.
//!
//! Connections take a snapshot (`current()`) at accept and keep it, so a
//! swap applies to connections accepted after it; signed bundles (verify,
//! rollback, reload) build on this handle.

use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::policy::Policy;

/// Shared, atomically swappable reference to the active policy.
#[derive(Clone)]
pub struct PolicyHandle {
    inner: Arc<ArcSwap<Policy>>,
    label: Arc<ArcSwap<String>>,
}

impl PolicyHandle {
    /// `label` is what audit records carry as `bundle` (name@revision, or
    /// the policy name for a plain file).
    pub fn new(policy: Policy, label: String) -> PolicyHandle {
        PolicyHandle {
            inner: Arc::new(ArcSwap::from_pointee(policy)),
            label: Arc::new(ArcSwap::from_pointee(label)),
        }
    }

    pub fn current(&self) -> Arc<Policy> {
        self.inner.load_full()
    }

    pub fn label(&self) -> Arc<String> {
        self.label.load_full()
    }

    pub fn swap(&self, policy: Policy, label: String) {
        self.label.store(Arc::new(label));
        self.inner.store(Arc::new(policy));
    }
}
