//! `sluice bundle keygen|sign|verify|inspect`: signed policy bundles.

use std::path::PathBuf;

use clap::Subcommand;

use super::BadInput;
use crate::bundle;

#[derive(Debug, Subcommand)]
pub(crate) enum BundleCommand {
    /// Create an Ed25519 signing key and add its public key to a trust file.
    Keygen {
        /// Where to write the private key (mode 0600; never overwritten).
        #[arg(long, value_name = "FILE")]
        key: PathBuf,
        /// The trust file to add the public key to (created if missing).
        #[arg(long, value_name = "FILE")]
        trust: PathBuf,
        /// The key id bundles will name.
        #[arg(long, value_name = "NAME", default_value = "default")]
        id: String,
    },
    /// Validate a policy and sign it into a bundle (a directory, or OUT.tar.gz).
    Sign {
        #[arg(long, value_name = "FILE")]
        key: PathBuf,
        #[arg(long, value_name = "FILE")]
        policy: PathBuf,
        /// The bundle's revision; must grow with every release.
        #[arg(long, value_name = "N")]
        revision: u64,
        /// Expiry as an RFC 3339 UTC time (2027-01-01T00:00:00Z).
        #[arg(long, value_name = "RFC3339", conflicts_with = "ttl")]
        expires: Option<String>,
        /// Expiry as a duration from now (30d, 12h).
        #[arg(long, value_name = "DURATION", default_value = "30d")]
        ttl: String,
        #[arg(long, value_name = "DIR|FILE.tar.gz")]
        out: PathBuf,
    },
    /// Verify a bundle against a trust file; exit 0 if valid, else exit 2 with one line on stderr saying why.
    Verify {
        #[arg(long, value_name = "FILE")]
        trust: PathBuf,
        path: PathBuf,
    },
    /// Show a bundle's manifest and rules (no verification).
    Inspect { path: PathBuf },
}

pub(crate) fn execute(cmd: BundleCommand) -> anyhow::Result<i32> {
    match cmd {
        BundleCommand::Keygen { key, trust, id } => {
            bundle::keygen(&key, &trust, &id)?;
            println!(
                "wrote private key {} (keep it secret) and added key `{id}` to {}",
                key.display(),
                trust.display()
            );
            Ok(0)
        }
        BundleCommand::Sign {
            key,
            policy,
            revision,
            expires,
            ttl,
            out,
        } => {
            let expires = match expires {
                Some(at) => bundle::parse_time(&at).map_err(|e| {
                    BadInput(anyhow::anyhow!("--expires {at}: {e}; write an RFC 3339 UTC time such as 2027-01-01T00:00:00Z"))
                })?,
                None => {
                    let d = humantime::parse_duration(&ttl).map_err(|e| {
                        BadInput(anyhow::anyhow!(
                            "--ttl {ttl}: {e}; write a duration such as 30d or 12h"
                        ))
                    })?;
                    time::OffsetDateTime::now_utc() + d
                }
            };
            bundle::sign(&key, &policy, revision, expires, &out)?;
            println!(
                "signed {} revision {revision} into {}",
                policy.display(),
                out.display()
            );
            Ok(0)
        }
        BundleCommand::Verify { trust, path } => {
            let result = bundle::TrustStore::load(&trust).and_then(|trust| {
                bundle::Bundle::load(&path, &trust, time::OffsetDateTime::now_utc())
            });
            match result {
                Ok(verified) => {
                    println!("{}: valid bundle {}", path.display(), verified.label());
                    Ok(0)
                }
                // The error names the bundle (and the key or file at fault).
                Err(err) => Err(BadInput(anyhow::Error::new(err).context("bundle refused")).into()),
            }
        }
        BundleCommand::Inspect { path } => {
            print!("{}", bundle::inspect(&path)?);
            Ok(0)
        }
    }
}
