//! Reading one secret's value from its source: a file, sluice's environment
//! or a command run with no shell. Every error says where the value was to
//! come from and what to do; none carries the value or the command's output.

use super::SecretSource;
use std::io::{self, Read};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

/// The largest value sluice reads: a secret is a token or a key, not a file
/// to ship.
pub(crate) const VALUE_LIMIT: usize = 64 * 1024;

/// How long a secret's command may run before it is killed.
pub(crate) const COMMAND_DEADLINE: Duration = Duration::from_secs(10);

/// How much of a failing command's standard error its error quotes.
const STDERR_QUOTE: usize = 200;

/// Why a source gave no value.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SourceError {
    #[error(
        "cannot read {path}: {source}; check the path in the policy and that sluice can read it"
    )]
    File { path: PathBuf, source: io::Error },
    #[error("{origin} is larger than {VALUE_LIMIT} bytes; a secret is a token or a key, keep only it in its source")]
    TooLarge { origin: String },
    #[error("{origin} is not UTF-8 text; a secret is sent in an HTTP header and must be text")]
    NotText { origin: String },
    #[error("{origin} is empty; put the value there or remove the secret from the policy")]
    Empty { origin: String },
    #[error("{origin} holds a line break, NUL or other control character inside the value; an HTTP header cannot carry it, store the value alone")]
    Control { origin: String },
    #[error("the environment variable {var} is not set for sluice; export it where sluice starts (sudo drops it unless --preserve-env={var})")]
    EnvUnset { var: String },
    #[error("the command is empty; give the program and its arguments as a list")]
    NoProgram,
    #[error("cannot run {program}: {source}; check that it is installed and on sluice's PATH")]
    Spawn { program: String, source: io::Error },
    #[error("{program} exited with {status}{stderr}; run it by hand as the user sluice runs as to see why")]
    Failed {
        program: String,
        status: ExitStatus,
        /// Empty, or ": " and the last line of its standard error.
        stderr: String,
    },
    #[error("{program} did not finish within {} s and was killed; it must print the value without waiting for input", COMMAND_DEADLINE.as_secs())]
    TimedOut { program: String },
    #[error("cannot read the output of {program}: {source}")]
    Output { program: String, source: io::Error },
}

/// The value `source` holds now.
pub(crate) fn read(source: &SecretSource) -> Result<String, SourceError> {
    match source {
        SecretSource::File(path) => read_file(path),
        SecretSource::Env(var) => read_env(var),
        SecretSource::Command { argv, .. } => run(argv, COMMAND_DEADLINE),
    }
}

fn read_file(path: &Path) -> Result<String, SourceError> {
    let origin = || path.display().to_string();
    let file = std::fs::File::open(path).map_err(|source| SourceError::File {
        path: path.to_path_buf(),
        source,
    })?;
    let mut bytes = Vec::new();
    file.take(VALUE_LIMIT as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| SourceError::File {
            path: path.to_path_buf(),
            source,
        })?;
    if bytes.len() > VALUE_LIMIT {
        return Err(SourceError::TooLarge { origin: origin() });
    }
    let text = String::from_utf8(bytes).map_err(|_| SourceError::NotText { origin: origin() })?;
    checked(text.trim_end_matches(['\n', '\r']), origin)
}

fn read_env(var: &str) -> Result<String, SourceError> {
    let origin = || format!("the environment variable {var}");
    match std::env::var_os(var) {
        None => Err(SourceError::EnvUnset {
            var: var.to_string(),
        }),
        Some(value) => {
            let text = value
                .into_string()
                .map_err(|_| SourceError::NotText { origin: origin() })?;
            if text.len() > VALUE_LIMIT {
                return Err(SourceError::TooLarge { origin: origin() });
            }
            checked(&text, origin)
        }
    }
}

/// Runs `argv` (no shell, standard input empty, in a process group of its
/// own) and returns its trimmed standard output. A non-zero exit is an
/// error; past `deadline` the whole group is killed.
pub(super) fn run(argv: &[String], deadline: Duration) -> Result<String, SourceError> {
    let (program, args) = argv.split_first().ok_or(SourceError::NoProgram)?;
    let origin = || format!("the output of {program}");
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|source| SourceError::Spawn {
            program: program.clone(),
            source,
        })?;
    let start = Instant::now();
    let (tx, rx) = mpsc::channel();
    let mut streams = 0;
    if let Some(pipe) = child.stdout.take() {
        collect(pipe, Stream::Out, tx.clone());
        streams += 1;
    }
    if let Some(pipe) = child.stderr.take() {
        collect(pipe, Stream::Err, tx);
        streams += 1;
    }

    let Some(status) = wait_until(&mut child, start + deadline) else {
        kill_group(&mut child);
        return Err(SourceError::TimedOut {
            program: program.clone(),
        });
    };
    // The program has exited; a child it left behind may still hold the
    // pipes open. Wait for them only until the deadline.
    let mut stdout: io::Result<Vec<u8>> = Ok(Vec::new());
    let mut stderr: io::Result<Vec<u8>> = Ok(Vec::new());
    for _ in 0..streams {
        let left = (start + deadline).saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((Stream::Out, read)) => stdout = read,
            Ok((Stream::Err, read)) => stderr = read,
            Err(_) => {
                return Err(SourceError::TimedOut {
                    program: program.clone(),
                })
            }
        }
    }
    if !status.success() {
        return Err(SourceError::Failed {
            program: program.clone(),
            status,
            stderr: quote(&stderr.unwrap_or_default()),
        });
    }
    let stdout = stdout.map_err(|source| SourceError::Output {
        program: program.clone(),
        source,
    })?;
    if stdout.len() > VALUE_LIMIT {
        return Err(SourceError::TooLarge { origin: origin() });
    }
    let text = String::from_utf8(stdout).map_err(|_| SourceError::NotText { origin: origin() })?;
    checked(text.trim(), origin)
}

#[derive(Clone, Copy)]
enum Stream {
    Out,
    Err,
}

type Collected = (Stream, io::Result<Vec<u8>>);

/// Reads `pipe` to its end on a thread of its own, keeping at most one byte
/// past [`VALUE_LIMIT`] (the rest is drained so the program never blocks on
/// a full pipe), and sends what it kept.
fn collect(mut pipe: impl Read + Send + 'static, stream: Stream, tx: mpsc::Sender<Collected>) {
    thread::spawn(move || {
        let mut kept = Vec::new();
        let mut chunk = [0u8; 8192];
        let result = loop {
            match pipe.read(&mut chunk) {
                Ok(0) => break Ok(kept),
                Ok(n) => {
                    let room = (VALUE_LIMIT + 1).saturating_sub(kept.len());
                    kept.extend_from_slice(&chunk[..n.min(room)]);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => break Err(e),
            }
        };
        // The receiver is gone when the command timed out: nothing to tell.
        let _ = tx.send((stream, result));
    });
}

/// The child's exit status, or None if it is still running at `until`.
fn wait_until(child: &mut Child, until: Instant) -> Option<ExitStatus> {
    let mut pause = Duration::from_millis(1);
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) => {}
            // ECHILD and the like: nothing left to wait for.
            Err(_) => return None,
        }
        let now = Instant::now();
        if now >= until {
            return None;
        }
        thread::sleep(pause.min(until - now));
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// Kills the child's whole process group and reaps the child. The child has
/// not been reaped yet, so its pid (the group's id) cannot have been reused.
fn kill_group(child: &mut Child) {
    if let Ok(pid) = i32::try_from(child.id()) {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// ": " and the last non-empty line of `stderr`, shortened, control
/// characters replaced; empty if there is none.
fn quote(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let Some(line) = text.lines().map(str::trim).rfind(|l| !l.is_empty()) else {
        return String::new();
    };
    let mut quoted: String = line
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .take(STDERR_QUOTE)
        .collect();
    if line.chars().count() > STDERR_QUOTE {
        quoted.push('…');
    }
    format!(": {quoted}")
}

/// `value` if it can be sent in a header: not empty, no control character
/// but tab.
fn checked(value: &str, origin: impl Fn() -> String) -> Result<String, SourceError> {
    if value.is_empty() {
        return Err(SourceError::Empty { origin: origin() });
    }
    if value.chars().any(|c| c.is_control() && c != '\t') {
        return Err(SourceError::Control { origin: origin() });
    }
    Ok(value.to_string())
}
