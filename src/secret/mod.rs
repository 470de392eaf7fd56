//! Brokered credentials: the values of the policy's `secrets`, read on the
//! host side, and the random placeholder per secret that a workload may
//! carry instead of the value (DESIGN.md, "Requests: L7 rules and brokered
//! credentials"). This module owns reading each source (a file, sluice's
//! environment, a command re-run when its ttl has passed) and minting the
//! placeholders. It knows nothing of sockets or HTTP; the intercept layer
//! decides where a value goes.
//!
//! It must never let a value out by any other way than [`SecretStore::value`]:
//! no value is logged, none is in an error, and the `Debug` output of a
//! [`SecretStore`] names the secrets only.

mod read;

#[cfg(test)]
mod tests;

pub(crate) use crate::policy::{SecretRef, SecretSource};
pub(crate) use read::SourceError;
#[cfg(test)]
pub(crate) use read::VALUE_LIMIT;

use std::fmt;
#[cfg(test)]
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// After a command failed, how long [`SecretStore::value`] answers None
/// before running it again (so a broken helper is not run per request).
pub(crate) const RETRY_AFTER: Duration = Duration::from_secs(30);

/// Why the secrets could not be loaded.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SecretError {
    #[error("secret `{name}`: {source}")]
    Source {
        name: String,
        #[source]
        source: SourceError,
    },
    #[error("secret `{name}` is declared twice; give each secret its own name")]
    Duplicate { name: String },
    #[error("secret name {name:?} is not 1 to 64 of a-z, 0-9, '_' and '-'; rename it")]
    BadName { name: String },
    #[error(
        "secrets `{first}` and `{second}` would both set {var} in the workload; rename one of them"
    )]
    EnvClash {
        first: String,
        second: String,
        var: String,
    },
}

/// The secrets of one sandbox: their values and placeholders. Send + Sync;
/// share it as an `Arc`.
pub(crate) struct SecretStore {
    secrets: Vec<Secret>,
}

struct Secret {
    name: String,
    placeholder: String,
    env: String,
    value: Value,
}

enum Value {
    /// Read once at load: a file or an environment variable.
    Fixed {
        value: String,
        /// The file it was read from ([`SecretStore::files`]).
        #[cfg(test)]
        file: Option<PathBuf>,
    },
    /// A command's output, re-read once `ttl` has passed.
    Command {
        source: SecretSource,
        ttl: Duration,
        state: Mutex<CommandState>,
    },
}

struct CommandState {
    /// None after the last run failed.
    value: Option<String>,
    /// When the last run finished.
    at: Instant,
}

impl SecretStore {
    /// Reads every secret once now (file: whole file, trailing newline
    /// trimmed; env: sluice's own environment; command: argv run with no
    /// shell, stdout trimmed, non-zero exit = error, killed after
    /// [`COMMAND_DEADLINE`], re-run when its ttl has passed) and mints a
    /// fresh placeholder for each. A value must be non-empty text of at most
    /// [`VALUE_LIMIT`] bytes with no control character but tab (it goes into
    /// an HTTP header). The first error names its secret and what to do.
    pub(crate) fn load(refs: &[SecretRef]) -> Result<SecretStore, SecretError> {
        let mut secrets: Vec<Secret> = Vec::with_capacity(refs.len());
        for secret in refs {
            let name = &secret.name;
            if !valid_name(name) {
                return Err(SecretError::BadName { name: name.clone() });
            }
            if secrets.iter().any(|s| &s.name == name) {
                return Err(SecretError::Duplicate { name: name.clone() });
            }
            let env = env_name(name);
            if let Some(other) = secrets.iter().find(|s| s.env == env) {
                return Err(SecretError::EnvClash {
                    first: other.name.clone(),
                    second: name.clone(),
                    var: env,
                });
            }
            let value = read::read(&secret.source).map_err(|source| SecretError::Source {
                name: name.clone(),
                source,
            })?;
            let value = match &secret.source {
                SecretSource::File(_path) => Value::Fixed {
                    value,
                    #[cfg(test)]
                    file: Some(_path.clone()),
                },
                SecretSource::Env(_) => Value::Fixed {
                    value,
                    #[cfg(test)]
                    file: None,
                },
                SecretSource::Command { ttl, .. } => Value::Command {
                    source: secret.source.clone(),
                    ttl: *ttl,
                    state: Mutex::new(CommandState {
                        value: Some(value),
                        at: Instant::now(),
                    }),
                },
            };
            secrets.push(Secret {
                placeholder: mint_placeholder(name),
                name: name.clone(),
                env,
                value,
            });
        }
        Ok(SecretStore { secrets })
    }

    /// The current value of `name`; None for an unknown name. A command's
    /// value whose ttl has passed is read again first, which blocks while
    /// the command runs (up to [`COMMAND_DEADLINE`]): async callers call
    /// this from `spawn_blocking`. When that run fails the failure is logged
    /// (never a value) and the answer is None, until a run succeeds; runs
    /// are at least [`RETRY_AFTER`] apart.
    pub(crate) fn value(&self, name: &str) -> Option<String> {
        let secret = self.secret(name)?;
        match &secret.value {
            Value::Fixed { value, .. } => Some(value.clone()),
            Value::Command { source, ttl, state } => {
                let mut state = lock(state);
                let fresh = match state.value {
                    Some(_) => state.at.elapsed() < *ttl,
                    None => state.at.elapsed() < RETRY_AFTER,
                };
                if !fresh {
                    let result = read::read(source);
                    state.at = Instant::now();
                    state.value = match result {
                        Ok(value) => Some(value),
                        Err(error) => {
                            tracing::warn!(
                                secret = %secret.name,
                                %error,
                                "cannot refresh a secret; requests that need it are not sent until it can be read"
                            );
                            None
                        }
                    };
                }
                state.value.clone()
            }
        }
    }

    /// The per-sandbox random placeholder for `name`:
    /// `sluice-placeholder-<name>-<32 hex digits>`.
    #[cfg(test)]
    pub(crate) fn placeholder(&self, name: &str) -> Option<&str> {
        self.secret(name).map(|s| s.placeholder.as_str())
    }

    /// (environment variable, placeholder) for every secret, in declaration
    /// order: `SLUICE_SECRET_<NAME>`, the name uppercased with `-` as `_`.
    pub(crate) fn placeholder_env(&self) -> Vec<(String, String)> {
        self.secrets
            .iter()
            .map(|s| (s.env.clone(), s.placeholder.clone()))
            .collect()
    }

    /// Every (secret name, placeholder), in declaration order, for scanning
    /// requests.
    pub(crate) fn placeholders(&self) -> impl Iterator<Item = (&str, &str)> {
        self.secrets
            .iter()
            .map(|s| (s.name.as_str(), s.placeholder.as_str()))
    }

    /// The files the workload must not read: every `file:` source.
    #[cfg(test)]
    pub(crate) fn files(&self) -> Vec<PathBuf> {
        self.secrets
            .iter()
            .filter_map(|s| match &s.value {
                Value::Fixed {
                    file: Some(path), ..
                } => Some(path.clone()),
                _ => None,
            })
            .collect()
    }

    fn secret(&self, name: &str) -> Option<&Secret> {
        self.secrets.iter().find(|s| s.name == name)
    }
}

/// Names only: never a value or a placeholder.
impl fmt::Debug for SecretStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretStore")
            .field(
                "secrets",
                &self.secrets.iter().map(|s| &s.name).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// The environment variable that carries `name`'s placeholder.
fn env_name(name: &str) -> String {
    format!(
        "SLUICE_SECRET_{}",
        name.to_ascii_uppercase().replace('-', "_")
    )
}

/// The policy's rule for secret names: `[a-z0-9_-]{1,64}`.
fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

fn mint_placeholder(name: &str) -> String {
    format!(
        "sluice-placeholder-{name}-{}",
        hex::encode(rand::random::<[u8; 16]>())
    )
}

/// A poisoned lock still holds a consistent state: every write to it is a
/// single assignment.
fn lock(state: &Mutex<CommandState>) -> MutexGuard<'_, CommandState> {
    state
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
