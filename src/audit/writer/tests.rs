use super::*;

/// Takes `accept` bytes per write, and fails the first `failures`
/// writes after taking part of them (as a filling disk does).
struct FillingDisk {
    written: Vec<u8>,
    failures: usize,
    accept: usize,
}

impl Write for FillingDisk {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.failures > 0 {
            self.failures -= 1;
            return Err(std::io::Error::from_raw_os_error(libc::ENOSPC));
        }
        let n = buf.len().min(self.accept);
        self.written.extend_from_slice(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn open_channel() -> (mpsc::Sender<AuditEvent>, mpsc::Receiver<AuditEvent>) {
    mpsc::channel(1)
}

#[tokio::test(start_paused = true)]
async fn a_failed_write_is_retried_until_every_byte_is_written_once() {
    let (_tx, rx) = open_channel();
    let records = b"{\"seq\":0}\n{\"seq\":1}\n".to_vec();
    let disk = FillingDisk {
        written: Vec::new(),
        failures: 3,
        accept: 5,
    };
    let (disk, rest) = write_out(
        disk,
        records.clone(),
        Path::new("audit.jsonl"),
        &rx,
        &Watch::never(),
    )
    .await
    .unwrap();
    assert!(rest.is_empty());
    assert_eq!(disk.written, records);
}

#[tokio::test(start_paused = true)]
async fn at_shutdown_a_write_that_keeps_failing_gives_up_and_says_how_much_was_lost() {
    let (tx, rx) = open_channel();
    drop(tx);
    let disk = FillingDisk {
        written: Vec::new(),
        failures: usize::MAX,
        accept: 5,
    };
    let err = write_out(
        disk,
        vec![b'x'; 42],
        Path::new("audit.jsonl"),
        &rx,
        &Watch::never(),
    )
    .await
    .err()
    .unwrap();
    assert!(
        matches!(err, AuditError::Write { lost_bytes: 42, .. }),
        "{err}"
    );
}

#[tokio::test(start_paused = true)]
async fn at_the_drain_deadline_a_failing_write_gives_up_though_producers_remain() {
    let (_producer, rx) = open_channel();
    let (trigger, drain) = crate::drain::trigger();
    trigger.overdue();
    let disk = FillingDisk {
        written: Vec::new(),
        failures: usize::MAX,
        accept: 5,
    };
    let err = write_out(disk, vec![b'x'; 42], Path::new("audit.jsonl"), &rx, &drain)
        .await
        .err()
        .unwrap();
    assert!(
        matches!(err, AuditError::Write { lost_bytes: 42, .. }),
        "{err}"
    );
}

#[tokio::test]
async fn at_the_drain_deadline_the_writer_says_how_many_records_it_did_not_write() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.jsonl");
    let (log, writer) = AuditWriter::new(Some(&path));
    let (trigger, drain) = crate::drain::trigger();
    // The drain is overdue before the writer ever runs, and a producer
    // is still alive: the queued records are reported, not waited for.
    trigger.overdue();
    for _ in 0..3 {
        log.record(AuditEvent {
            sandbox: "sb".into(),
            path: crate::workload::WorkloadPath::Host,
            verdict: "deny",
            rule: None,
            reason: "no-rule",
            proto: super::super::record::Proto::Tcp,
            src: None,
            dst: None,
            host: None,
            bundle: "b@1".into(),
            request: None,
        })
        .await;
    }
    let err = writer.run_until(drain).await.unwrap_err();
    assert!(
        matches!(err, AuditError::Unwritten { records: 3, .. }),
        "{err}"
    );
    drop(log);
}

#[test]
fn an_unwritable_path_is_refused_before_anything_runs() {
    let err = check_writable(Path::new("/nonexistent-dir/audit.jsonl")).unwrap_err();
    assert!(
        err.to_string().contains("check that its directory exists"),
        "{err}"
    );
}
