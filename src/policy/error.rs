//! Errors a policy load can end in: an unreadable file, or a list of every
//! violation found in the text, each pinned to `FILE:LINE:COL`.

use std::fmt;

/// Why a policy could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The file could not be read.
    #[error("{path}: cannot read the policy file: {source}; check the path and its permissions")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The text was read but is not a valid policy. Display prints every
    /// violation, one per line, as `FILE:LINE:COL: what is wrong; what to do`.
    #[error("{}", Violations(.violations))]
    Invalid { violations: Vec<Violation> },
}

impl PolicyError {
    /// Every violation found (empty for [`PolicyError::Io`]).
    pub fn violations(&self) -> &[Violation] {
        match self {
            PolicyError::Io { .. } => &[],
            PolicyError::Invalid { violations } => violations,
        }
    }
}

/// One thing wrong with a policy file, with where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The file name as given to `from_yaml` (its `origin`).
    pub origin: String,
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
    /// What is wrong and what to do about it.
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}: {}",
            self.origin, self.line, self.column, self.message
        )
    }
}

struct Violations<'a>(&'a [Violation]);

impl fmt::Display for Violations<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, v) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{v}")?;
        }
        Ok(())
    }
}
