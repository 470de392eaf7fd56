//! How an error reaches a person: one line, each cause said once. It only
//! formats; it never decides an exit status (that is `exit_class`).

/// One line for an error and its causes, each said once: most of sluice's
/// errors already name their cause in their own message, and printing the
/// chain with `{:#}` would repeat it ("...: No such file or directory: No
/// such file or directory").
pub fn error_line(err: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_line_says_each_cause_once() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        let err = anyhow::Error::new(crate::policy::PolicyError::Io {
            path: "p.yaml".into(),
            source: io,
        })
        .context("cannot load the policy");
        assert_eq!(
            error_line(&err),
            "cannot load the policy: p.yaml: cannot read the policy file: no such file; check the path and its permissions"
        );
    }

    #[test]
    fn error_line_keeps_causes_the_message_does_not_name() {
        let err = anyhow::anyhow!("disk full").context("cannot write the audit log");
        assert_eq!(error_line(&err), "cannot write the audit log: disk full");
    }
}
