//! The policy currently in force, swappable under live traffic.
//!
//! Connections take a snapshot (`current()`) at accept and keep it, so a
//! swap applies to connections accepted after it; signed bundles (verify,
//! rollback, reload) build on this handle. The policy and its label are
//! swapped together, so a snapshot never pairs one policy with another's
//! label.

use std::ops::Deref;
use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::policy::Policy;

/// A policy together with the label audit records carry for it.
pub struct ActivePolicy {
    policy: Policy,
    label: String,
}

impl ActivePolicy {
    /// name@revision for a bundle, the policy name for a plain file.
    pub fn label(&self) -> &str {
        &self.label
    }
}

impl Deref for ActivePolicy {
    type Target = Policy;
    fn deref(&self) -> &Policy {
        &self.policy
    }
}

/// Shared, atomically swappable reference to the active policy.
#[derive(Clone)]
pub struct PolicyHandle {
    inner: Arc<ArcSwap<ActivePolicy>>,
}

impl PolicyHandle {
    /// `label` is what audit records carry as `bundle` (name@revision, or
    /// the policy name for a plain file).
    pub fn new(policy: Policy, label: String) -> PolicyHandle {
        PolicyHandle {
            inner: Arc::new(ArcSwap::from_pointee(ActivePolicy { policy, label })),
        }
    }

    /// A snapshot: keep it for the whole connection.
    pub fn current(&self) -> Arc<ActivePolicy> {
        self.inner.load_full()
    }

    /// The label of the policy in force now.
    pub fn label(&self) -> String {
        self.inner.load().label.clone()
    }

    pub fn swap(&self, policy: Policy, label: String) {
        self.inner.store(Arc::new(ActivePolicy { policy, label }));
    }
}
