//! `sluice demo`: the first thing a new user runs. It builds a throwaway
//! topology (a namespace standing in for the host, with an origin server),
//! runs a sandboxed client under the embedded policies/demo.yaml, and shows
//! an allowed request, a denied one with its audit record, bypass attempts
//! failing (also as root) and the nft drop counter, read through /metrics;
//! then a few seconds of `sluice bench`'s direct-vs-sluice comparison; then
//! removes everything it made. It must never touch the root namespace's
//! ruleset, links or routes, nor send traffic beyond this machine.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::atomic::Ordering;

use anyhow::{Context, Result};

use crate::testbed::OuterNetns;

/// The policy the demo enforces, embedded so the demo works from any
/// directory.
pub(crate) const DEMO_POLICY: &str = include_str!("../../policies/demo.yaml");

const ORIGIN: &str = "198.18.0.1";
/// sluice's metrics endpoint, in the demo's outer namespace.
const METRICS: &str = "127.0.0.1:9464";

pub(crate) fn run() -> Result<i32> {
    crate::confine::require_root("sluice demo")?;
    require_tools()?;
    let exe = std::env::current_exe().context("cannot find the sluice binary")?;
    let dir = tempdir()?;
    let policy_path = dir.join("demo.yaml");
    let audit_path = dir.join("audit.jsonl");
    let (attempted, shown) = (dir.join("attempted"), dir.join("shown"));
    std::fs::write(&policy_path, DEMO_POLICY)?;

    let origin: IpAddr = ORIGIN.parse().expect("literal");
    let outer = OuterNetns::create("sluice-demo", &[origin])?;
    let http_hits = outer.http_origin(SocketAddr::new(origin, 8080))?;
    let admin_hits = outer.http_origin(SocketAddr::new(origin, 9090))?;
    let udp_hits = outer.udp_sink(SocketAddr::new(origin, 5353))?;

    print_intro();
    let script = client_script(&exe, &attempted, &shown);
    let mut child = outer
        .command(&exe)
        .arg("run")
        .arg("--policy")
        .arg(&policy_path)
        .arg("--audit")
        .arg(&audit_path)
        // The audit key goes with the demo's files, not into /var/lib.
        .arg("--state-dir")
        .arg(dir.join("state"))
        .args(["--metrics", METRICS])
        .args(["--", "sh", "-c", &script])
        .spawn()
        .context("cannot start `sluice run` in the demo namespace")?;
    if wait_for(&attempted, &mut child) {
        show_drops(&outer);
        std::fs::write(&shown, b"")?;
    }
    let status = child.wait().context("waiting for `sluice run`")?;

    show_audit(&audit_path);
    println!(
        "\nWhat the origin saw: {} request(s) on :8080, {} on :9090, {} UDP datagram(s) on :5353.",
        http_hits.load(Ordering::Relaxed),
        admin_hits.load(Ordering::Relaxed),
        udp_hits.load(Ordering::Relaxed)
    );
    drop(outer);
    let _ = std::fs::remove_dir_all(&dir);
    if !status.success() {
        anyhow::bail!("the sandboxed run failed ({status}); rerun with -v for details");
    }
    compare_costs()?;
    println!("\nCleaned up: the demo's namespaces, the sandboxes and their rules are gone.");
    println!("\nNext: sluice run --policy policies/dev.yaml -- <your command>   (see README.md)");
    Ok(0)
}

/// The tools the demo's topology is built with are installed.
fn require_tools() -> Result<()> {
    for (tool, package) in [("ip", "iproute2"), ("nft", "nftables")] {
        if crate::program::on_path(tool).is_none() {
            anyhow::bail!("`{tool}` is not installed: apt-get install -y {package}");
        }
    }
    Ok(())
}

/// What the demo sets up, and the policy it enforces (without comments).
fn print_intro() {
    println!("sluice demo");
    println!("  A throwaway namespace stands in for this host: origin servers on {ORIGIN}:8080 and :9090.");
    println!("  A client runs inside a sandbox under this policy (policies/demo.yaml):\n");
    for line in DEMO_POLICY
        .lines()
        .filter(|l| !l.trim_start().starts_with('#') && !l.trim().is_empty())
    {
        println!("      {line}");
    }
    println!();
}

/// Steps 1 to 8, the sandboxed client's shell script: it runs `exe`'s
/// probes, then creates `attempted` and waits (bounded) for `shown`, so
/// that the drop counter is read while the sandbox still exists.
fn client_script(exe: &Path, attempted: &Path, shown: &Path) -> String {
    let me = exe.display().to_string();
    format!(
        r#"
step() {{ printf '\n%s\n   $ %s\n   ' "$1" "$2"; }}
step "1. An allowed request (rule origin-http):" "curl http://origin.test:8080/"
{me} probe http http://origin.test:8080/
step "2. A denied request (port 9090 is not allowed; plain HTTP gets a 403 that says why):" "curl http://{ORIGIN}:9090/"
{me} probe http --body http://{ORIGIN}:9090/ | tail -n 1
step "3. A name no rule admits gets REFUSED by sluice's DNS:" "dig example.com"
{me} probe dns example.com
step "4. A bypass attempt: UDP straight to {ORIGIN}:5353 (only DNS may leave, and only via sluice):" "send UDP"
{me} probe udp {ORIGIN}:5353
step "5. A bypass attempt: ICMP echo over a raw socket:" "ping {ORIGIN}"
{me} probe icmp {ORIGIN}
step "6. A bypass attempt: TCP to an address no rule allows (nftables hands it to sluice, which resets it):" "connect 198.18.0.2:22"
{me} probe tcp 198.18.0.2:22
step "7. A bypass attempt as root: step into sluice's own namespace, or flush the sandbox's rules:" "nsenter --net=/proc/<sluice>/ns/net ...; nft flush ruleset"
nsenter --net=/proc/$PPID/ns/net true 2>&1
printf '   '; nft flush ruleset 2>&1 | head -n 1
step "8. The sandbox's drop counter (packets that tried to go around sluice), as sluice exports it:" "curl http://{METRICS}/metrics | grep dropped   (from outside the sandbox)"
touch {attempted}
i=0; while [ ! -e {shown} ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done
exit 0
"#,
        attempted = attempted.display(),
        shown = shown.display(),
    )
}

/// Step 8's answer: the drop counter's lines from /metrics.
fn show_drops(outer: &OuterNetns) {
    // The counter is read from outside: inside, even root may not look at
    // the rules.
    match outer.run_in(|| scrape_drops(METRICS)) {
        Ok(Ok(text)) => {
            // The step's heading already indented the first line.
            let lines: Vec<&str> = text
                .lines()
                .filter(|l| l.starts_with("sluice_dropped_packets_total"))
                .collect();
            println!("{}", lines.join("\n   "));
        }
        Ok(Err(err)) => println!("(cannot read {METRICS}/metrics: {err})"),
        Err(err) => println!("(cannot read {METRICS}/metrics: {err:#})"),
    }
}

/// Step 9: the audit log the run wrote, as `sluice audit tail` prints it,
/// and its first line as written.
fn show_audit(audit_path: &Path) {
    println!(
        "\n9. The audit log: one hash-chained JSON line per deny, and a signed checkpoint at the end, shown as `sluice audit tail` prints them:"
    );
    let audit = std::fs::read_to_string(audit_path).unwrap_or_default();
    for line in audit.lines() {
        match crate::audit::AuditLine::parse(line) {
            Ok(parsed) => println!("   {}", crate::audit::format_line(&parsed)),
            Err(_) => println!("   {line}"),
        }
    }
    if let Some(first) = audit.lines().next() {
        println!("   The first one as written:\n   {first}");
    }
}

/// Step 10: the same small requests directly and through `sluice run`,
/// side by side (a few seconds of `sluice bench`'s method).
#[cfg(feature = "bench")]
fn compare_costs() -> Result<()> {
    use crate::bench::{self, ConditionKind, Metric, Workload};
    let plan = bench::Plan {
        conditions: vec![ConditionKind::Native, ConditionKind::Host],
        workloads: vec![Workload::Small],
        batches: COMPARE_ROUNDS,
        warmups: 1,
        conns: 256,
        threads: 8,
        seed: 1,
        image: String::new(),
        build_missing: false,
    };
    println!(
        "\n10. What it costs here: 256 fresh connections, 8 at a time, 1 KiB each, directly and through `sluice run`,\n   \
         side by side in {COMPARE_ROUNDS} rounds after a warmup (per request, connect to last byte; the median over rounds of each round's median):"
    );
    let results = bench::run(&plan, &mut bench::progress::Progress::Silent)
        .context("the direct-vs-sluice comparison failed")?;
    let summary = bench::stats::summarise(&results);
    let small = |c| {
        summary
            .of(c)
            .and_then(|s| s.metrics.get(&Metric::Small))
            .cloned()
    };
    let (Some(direct), Some(sluice)) = (small(ConditionKind::Native), small(ConditionKind::Host))
    else {
        anyhow::bail!("the direct-vs-sluice comparison measured nothing");
    };
    let ms = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{:.3} ms", v / 1e3));
    let paired = sluice
        .diff
        .map(|d| {
            format!(
                ", {:+.3} ms [{:+.3}, {:+.3}] paired",
                d.median_diff_us / 1e3,
                d.ci_low_us / 1e3,
                d.ci_high_us / 1e3
            )
        })
        .unwrap_or_default();
    println!(
        "   direct {}, through sluice {}: {} native{paired}",
        ms(direct.p50),
        ms(sluice.p50),
        sluice.ratio.map_or("-".to_string(), |r| format!("{r:.2}x"))
    );
    let cpu = summary
        .of(ConditionKind::Host)
        .and_then(|h| h.cpu_small_us)
        .map_or(String::new(), |us| {
            format!("sluice spent {us:.0} µs of CPU per connection. ")
        });
    println!(
        "   {cpu}The whole method (containers, haproxy, bulk, streams): sluice bench --out DIR"
    );
    Ok(())
}

/// Step 10 in a build without the bench (the Debian package's): what to
/// run instead.
#[cfg(not(feature = "bench"))]
fn compare_costs() -> Result<()> {
    println!(
        "\n10. What it costs here: this sluice is built without `sluice bench` (the package leaves the bench out);\n   \
         build sluice from source (`cargo build --release`, the `bench` feature is on by default) to measure it"
    );
    Ok(())
}

/// Rounds of the demo's comparison.
#[cfg(feature = "bench")]
const COMPARE_ROUNDS: usize = 3;

/// Wait (bounded) until the workload created `marker`; false if it ended or
/// never did.
fn wait_for(marker: &std::path::Path, child: &mut std::process::Child) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::time::Instant::now() < deadline {
        if marker.exists() {
            return true;
        }
        if child.try_wait().ok().flatten().is_some() {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    false
}

/// The bypass attempts of the demo's script that the ruleset drops (the UDP
/// datagram and the ICMP echo; the TCP attempt is redirected, not dropped).
const DROPPED_ATTEMPTS: f64 = 2.0;

/// The text /metrics at `addr` serves, once the drop counter (read in the
/// background, every second or so) has caught up with the demo's dropped
/// attempts, or after a few seconds.
fn scrape_drops(addr: &str) -> std::result::Result<String, String> {
    let url = format!("http://{addr}/metrics");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let text = String::from_utf8_lossy(&crate::testbed::load::fetch(&url)?.body).into_owned();
        let dropped: f64 = text
            .lines()
            .filter(|l| l.starts_with("sluice_dropped_packets_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        if dropped >= DROPPED_ATTEMPTS || std::time::Instant::now() >= deadline {
            return Ok(text);
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

fn tempdir() -> Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("sluice-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    Ok(dir)
}
