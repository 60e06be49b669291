//! Harmless probes of the containment: the uid really is dropped, the process limit stops a
//! burst of sleepers, and nothing of the run is left afterwards.

#[path = "fixtures/sandbox/common.rs"]
mod common;

use common::*;
use sorft::sandbox::isolation::HostSupport;
use sorft::sandbox::process::ExitKind;

#[test]
fn runs_as_dedicated_unprivileged_uid() {
    let base = scratch();
    let repo = tiny_repo(base.path());
    let ws = workspace(base.path(), &repo);
    let out = sh(&ws, "id -u; id -g; cat hello.txt", &tight());
    eprintln!("{:?}", HostSupport::get());
    eprintln!("{out:?}");
    assert_eq!(out.exit, ExitKind::Exited(0), "{}", out.output.tail);
    let mut lines = out.output.tail.lines();
    let uid: u32 = lines.next().unwrap().parse().unwrap();
    let gid: u32 = lines.next().unwrap().parse().unwrap();
    assert_eq!(lines.next(), Some("hello"));
    match ws.ids() {
        Some((u, g)) => {
            assert_eq!((uid, gid), (u, g));
            assert_ne!(uid, 0);
            assert_eq!(out.layers.uid, Some(u));
        }
        None => {
            report_missing("runs_as_dedicated_unprivileged_uid");
        }
    }
}

#[test]
fn process_limit_stops_a_burst_of_sleepers_and_nothing_is_left() {
    let base = scratch();
    let repo = tiny_repo(base.path());
    let ws = workspace(base.path(), &repo);
    let Some((uid, _)) = ws.ids() else {
        report_missing("process_limit_stops_a_burst_of_sleepers");
        eprintln!("skipped: no uid drop on this host");
        return;
    };
    let mut limits = tight();
    limits.nproc = 16;
    limits.wall = std::time::Duration::from_secs(3);
    // A few background sleepers fit under the limit...
    let few = sh(
        &ws,
        "for i in 1 2 3 4 5; do sleep 30 & done; echo started; exit 0",
        &limits,
    );
    assert_eq!(few.exit, ExitKind::Exited(0), "{}", few.output.tail);
    assert!(few.output.tail.contains("started"));
    assert!(
        live_processes_of(uid).is_empty(),
        "sleepers survived the run"
    );
    // ...two hundred do not.
    let script = "ok=0; fail=0; i=0; while [ $i -lt 200 ]; do \
                  if sleep 30 2>/dev/null & then ok=$((ok+1)); else fail=$((fail+1)); fi; \
                  i=$((i+1)); done; echo started=$ok; exit 0";
    let t = std::time::Instant::now();
    let out = sh(&ws, script, &limits);
    eprintln!("{out:?}");
    assert!(t.elapsed().as_secs_f64() < 4.5, "took {:?}", t.elapsed());
    assert!(
        out.output.tail.contains("fork") || out.output.tail.contains("Resource temporarily"),
        "the process limit never refused a fork: {}",
        out.output.tail
    );
    assert!(
        live_processes_of(uid).is_empty(),
        "leftovers: {:?}",
        live_processes_of(uid)
    );
}
