use super::*;
use std::path::Path;

fn file(name: &str, path: &Path) -> SecretRef {
    SecretRef {
        name: name.into(),
        source: SecretSource::File(path.to_path_buf()),
    }
}

fn command(name: &str, script: &str, ttl: Duration) -> SecretRef {
    SecretRef {
        name: name.into(),
        source: SecretSource::Command {
            argv: vec!["sh".into(), "-c".into(), script.into()],
            ttl,
        },
    }
}

fn env(name: &str, var: &str) -> SecretRef {
    SecretRef {
        name: name.into(),
        source: SecretSource::Env(var.into()),
    }
}

const LONG: Duration = Duration::from_secs(600);

fn load_err(refs: &[SecretRef]) -> String {
    SecretStore::load(refs).unwrap_err().to_string()
}

#[test]
fn a_file_secret_is_the_whole_file_without_its_trailing_newline() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gh");
    std::fs::write(&path, "ghp_abc def\n").unwrap();
    let store = SecretStore::load(&[file("gh", &path)]).unwrap();
    assert_eq!(store.value("gh").as_deref(), Some("ghp_abc def"));
}

#[test]
fn a_file_secret_with_crlf_ending_loses_both() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gh");
    std::fs::write(&path, "tok\r\n").unwrap();
    let store = SecretStore::load(&[file("gh", &path)]).unwrap();
    assert_eq!(store.value("gh").as_deref(), Some("tok"));
}

#[test]
fn a_file_secret_is_read_once_at_load() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gh");
    std::fs::write(&path, "first").unwrap();
    let store = SecretStore::load(&[file("gh", &path)]).unwrap();
    std::fs::write(&path, "second").unwrap();
    assert_eq!(store.value("gh").as_deref(), Some("first"));
}

#[test]
fn a_missing_file_names_the_secret_and_the_path() {
    let err = load_err(&[file("gh", Path::new("/nonexistent/sluice/gh"))]);
    assert!(
        err.starts_with("secret `gh`: cannot read /nonexistent/sluice/gh:"),
        "{err}"
    );
    assert!(err.contains("check the path"), "{err}");
}

#[test]
fn an_empty_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gh");
    std::fs::write(&path, "\n").unwrap();
    assert!(load_err(&[file("gh", &path)]).contains("is empty"));
}

#[test]
fn a_value_with_a_line_break_inside_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gh");
    std::fs::write(&path, "tok\r\nX-Evil: 1\n").unwrap();
    let err = load_err(&[file("gh", &path)]);
    assert!(err.contains("line break"), "{err}");
    assert!(!err.contains("tok"), "{err}");
}

#[test]
fn a_file_larger_than_the_limit_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gh");
    std::fs::write(&path, vec![b'a'; VALUE_LIMIT + 1]).unwrap();
    assert!(load_err(&[file("gh", &path)]).contains("larger than"));
}

#[test]
fn a_file_that_is_not_text_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gh");
    std::fs::write(&path, [0xff, 0xfe, b'a']).unwrap();
    assert!(load_err(&[file("gh", &path)]).contains("not UTF-8"));
}

#[test]
fn an_env_secret_is_read_from_sluices_environment() {
    // PATH is set for every test process and never changed by one.
    let path = std::env::var("PATH").unwrap();
    let store = SecretStore::load(&[env("path", "PATH")]).unwrap();
    assert_eq!(store.value("path"), Some(path));
}

#[test]
fn an_unset_env_variable_names_the_secret_and_the_variable() {
    let err = load_err(&[env("gh", "SLUICE_TEST_SURELY_UNSET_VARIABLE")]);
    assert!(
        err.starts_with(
            "secret `gh`: the environment variable SLUICE_TEST_SURELY_UNSET_VARIABLE is not set"
        ),
        "{err}"
    );
}

#[test]
fn a_command_secret_is_its_trimmed_standard_output() {
    let store = SecretStore::load(&[command("gh", "echo '  tok-1  '", LONG)]).unwrap();
    assert_eq!(store.value("gh").as_deref(), Some("tok-1"));
}

#[test]
fn a_command_runs_with_no_shell() {
    let store = SecretStore::load(&[SecretRef {
        name: "gh".into(),
        source: SecretSource::Command {
            argv: vec!["echo".into(), "$HOME;".into(), "`id`".into()],
            ttl: LONG,
        },
    }])
    .unwrap();
    assert_eq!(store.value("gh").as_deref(), Some("$HOME; `id`"));
}

/// A script printing `tok-<n>` where n counts its runs (in `dir`), and
/// failing once `dir/stop` exists.
fn counting(dir: &Path) -> String {
    let d = dir.display();
    format!(
        "[ -e {d}/stop ] && exit 3; n=$(cat {d}/n 2>/dev/null || echo 0); n=$((n+1)); echo $n > {d}/n; echo tok-$n"
    )
}

#[test]
fn a_command_value_is_kept_until_its_ttl_passes() {
    let dir = tempfile::tempdir().unwrap();
    let store = SecretStore::load(&[command("gh", &counting(dir.path()), LONG)]).unwrap();
    assert_eq!(store.value("gh").as_deref(), Some("tok-1"));
    assert_eq!(store.value("gh").as_deref(), Some("tok-1"));
}

#[test]
fn a_command_is_run_again_once_its_ttl_passed() {
    let dir = tempfile::tempdir().unwrap();
    let store = SecretStore::load(&[command("gh", &counting(dir.path()), Duration::ZERO)]).unwrap();
    assert_eq!(store.value("gh").as_deref(), Some("tok-2"));
    assert_eq!(store.value("gh").as_deref(), Some("tok-3"));
}

#[test]
fn a_failing_refresh_gives_no_value_and_is_not_retried_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = SecretStore::load(&[command("gh", &counting(dir.path()), Duration::ZERO)]).unwrap();
    std::fs::write(dir.path().join("stop"), "").unwrap();
    assert_eq!(store.value("gh"), None);
    std::fs::remove_file(dir.path().join("stop")).unwrap();
    assert_eq!(store.value("gh"), None, "retried before RETRY_AFTER");
}

#[test]
fn a_failing_command_names_the_secret_the_status_and_its_last_error_line() {
    let err = load_err(&[command(
        "gh",
        "echo secret-looking-stdout; echo first >&2; echo 'not logged in' >&2; exit 4",
        LONG,
    )]);
    assert!(
        err.starts_with("secret `gh`: sh exited with exit status: 4: not logged in;"),
        "{err}"
    );
    assert!(!err.contains("secret-looking-stdout"), "{err}");
}

#[test]
fn a_command_that_cannot_start_says_so() {
    let err = load_err(&[SecretRef {
        name: "gh".into(),
        source: SecretSource::Command {
            argv: vec!["/nonexistent/sluice-helper".into()],
            ttl: LONG,
        },
    }]);
    assert!(
        err.starts_with("secret `gh`: cannot run /nonexistent/sluice-helper:"),
        "{err}"
    );
}

#[test]
fn an_empty_command_is_refused() {
    let err = load_err(&[SecretRef {
        name: "gh".into(),
        source: SecretSource::Command {
            argv: vec![],
            ttl: LONG,
        },
    }]);
    assert!(err.contains("the command is empty"), "{err}");
}

#[test]
fn a_command_that_prints_nothing_is_refused() {
    assert!(load_err(&[command("gh", "true", LONG)]).contains("is empty"));
}

#[test]
fn a_command_past_the_deadline_is_killed_with_its_children() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("survived");
    let script = format!("(sleep 1; touch {}) & sleep 30", marker.display());
    let argv = ["sh".to_string(), "-c".to_string(), script];
    let started = Instant::now();
    let err = read::run(&argv, Duration::from_millis(300)).unwrap_err();
    assert!(matches!(err, SourceError::TimedOut { .. }), "{err}");
    assert!(started.elapsed() < Duration::from_secs(2));
    std::thread::sleep(Duration::from_millis(1500));
    assert!(!marker.exists(), "a child of the command outlived the kill");
}

#[test]
fn a_timed_out_command_tells_to_make_it_non_interactive() {
    let err = SourceError::TimedOut {
        program: "gh".into(),
    };
    assert_eq!(
        err.to_string(),
        "gh did not finish within 10 s and was killed; it must print the value without waiting for input"
    );
}

#[test]
fn placeholders_have_the_documented_form() {
    let store = SecretStore::load(&[command("gh-token", "echo t", LONG)]).unwrap();
    let placeholder = store.placeholder("gh-token").unwrap();
    let digits = placeholder
        .strip_prefix("sluice-placeholder-gh-token-")
        .unwrap();
    assert_eq!(digits.len(), 32);
    assert!(digits
        .bytes()
        .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
}

#[test]
fn placeholders_differ_between_secrets_and_between_loads() {
    let refs = [command("a", "echo t", LONG), command("b", "echo t", LONG)];
    let one = SecretStore::load(&refs).unwrap();
    let two = SecretStore::load(&refs).unwrap();
    let a = one.placeholder("a").unwrap();
    let b = one.placeholder("b").unwrap().replace("-b-", "-a-");
    assert_ne!(a, b);
    assert_ne!(a, two.placeholder("a").unwrap());
}

#[test]
fn placeholder_env_names_each_secret_uppercased_with_underscores() {
    let store = SecretStore::load(&[
        command("gh-token", "echo t", LONG),
        command("npm", "echo t", LONG),
    ])
    .unwrap();
    let env = store.placeholder_env();
    assert_eq!(env.len(), 2);
    assert_eq!(env[0].0, "SLUICE_SECRET_GH_TOKEN");
    assert_eq!(env[0].1, store.placeholder("gh-token").unwrap());
    assert_eq!(env[1].0, "SLUICE_SECRET_NPM");
}

#[test]
fn two_names_with_one_env_variable_are_refused() {
    let err = load_err(&[
        command("gh-token", "echo t", LONG),
        command("gh_token", "echo t", LONG),
    ]);
    assert!(
        err.contains("`gh-token` and `gh_token` would both set SLUICE_SECRET_GH_TOKEN"),
        "{err}"
    );
}

#[test]
fn a_duplicate_name_is_refused() {
    let err = load_err(&[command("gh", "echo t", LONG), command("gh", "echo t", LONG)]);
    assert!(err.contains("`gh` is declared twice"), "{err}");
}

#[test]
fn placeholders_lists_every_secret_in_order() {
    let store =
        SecretStore::load(&[command("b", "echo t", LONG), command("a", "echo t", LONG)]).unwrap();
    let names: Vec<&str> = store.placeholders().map(|(name, _)| name).collect();
    assert_eq!(names, ["b", "a"]);
}

#[test]
fn an_unknown_name_has_no_value_and_no_placeholder() {
    let store = SecretStore::load(&[command("gh", "echo t", LONG)]).unwrap();
    assert_eq!(store.value("other"), None);
    assert_eq!(store.placeholder("other"), None);
}

#[test]
fn files_lists_only_file_sources() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gh");
    std::fs::write(&path, "tok").unwrap();
    let store = SecretStore::load(&[file("gh", &path), command("npm", "echo t", LONG)]).unwrap();
    assert_eq!(store.files(), [path]);
}

#[test]
fn debug_output_names_the_secrets_and_hides_values_and_placeholders() {
    let store = SecretStore::load(&[command("gh", "echo hunter2-value", LONG)]).unwrap();
    let debug = format!("{store:?}");
    assert_eq!(debug, r#"SecretStore { secrets: ["gh"] }"#);
    assert!(!debug.contains(store.placeholder("gh").unwrap()));
}

#[test]
fn the_store_can_be_shared_between_threads() {
    fn shared<T: Send + Sync>() {}
    shared::<SecretStore>();
}
