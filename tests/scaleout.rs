//! Scale-out through the binary: `sorft export` layouts (read back with pyarrow), the veRL reward
//! function's parity with sorft's rewards, and `sorft serve-reward` under a bounded loopback load,
//! hostile clients, back-pressure, execution rewards and graceful shutdown.
//!
//! Needs python3 and git. The pyarrow check needs a python with pyarrow (`SORFT_TEST_PYARROW_PYTHON`,
//! else `/opt/sorft-pytest/bin/python`); without one it is skipped, unless `SORFT_REQUIRE_PYARROW=1`
//! (set by CI), where it fails.
#![cfg(feature = "serve")]

use sorft::pipeline::export::{build_records, RewardLabel};
use sorft::swe::edit::{render_blocks, EditBlock};
use sorft::swe::instance::{read_jsonl, Instance};
use sorft::swe::subtask::{EditReward, Subtask, SubtaskRecord};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

struct Data {
    _dir: tempfile::TempDir,
    instances: PathBuf,
    repos: PathBuf,
    list: Vec<Instance>,
    records: Vec<SubtaskRecord>,
}

fn sorft(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_sorft"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// Six validated synthetic instances and their subtask records, made once.
fn data() -> &'static Data {
    static D: OnceLock<Data> = OnceLock::new();
    D.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().to_str().unwrap().to_string();
        let (rc, _, err) = sorft(&["data", "synth", "--n", "6", "--seed", "11", "--out", &d]);
        assert_eq!(rc, 0, "{err}");
        let instances = dir.path().join("instances.jsonl");
        let repos = dir.path().join("repos");
        let list = read_jsonl(&instances).unwrap();
        let (records, skipped) = build_records(&list, &repos, &Default::default());
        assert!(skipped.is_empty(), "{skipped:?}");
        Data {
            _dir: dir,
            instances,
            repos,
            list,
            records,
        }
    })
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

// ---------- export ----------

fn pyarrow_python() -> Option<PathBuf> {
    let cands: Vec<PathBuf> = std::env::var_os("SORFT_TEST_PYARROW_PYTHON")
        .map(PathBuf::from)
        .into_iter()
        .chain([PathBuf::from("/opt/sorft-pytest/bin/python")])
        .collect();
    for c in cands {
        let ok = Command::new(&c)
            .args(["-c", "import pyarrow.parquet, pyarrow.json"])
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return Some(c);
        }
    }
    if std::env::var("SORFT_REQUIRE_PYARROW").is_ok_and(|v| v == "1") {
        panic!(
            "SORFT_REQUIRE_PYARROW=1 but no python with pyarrow (set SORFT_TEST_PYARROW_PYTHON)"
        );
    }
    eprintln!("SKIPPED: no python with pyarrow (set SORFT_TEST_PYARROW_PYTHON)");
    None
}

#[test]
fn exports_have_the_engines_layouts_and_load_with_pyarrow() {
    let d = data();
    let out = tempfile::tempdir().unwrap();
    let o = s(out.path());
    let (rc, msg, err) = sorft(&[
        "export",
        "--format",
        "verl",
        "--instances",
        s(&d.instances),
        "--repos",
        s(&d.repos),
        "--out",
        o,
    ]);
    assert_eq!(rc, 0, "{err}");
    let n = d.records.len();
    assert!(msg.contains(&format!("wrote {n} rows")), "{msg}");
    let (rc, _, err) = sorft(&[
        "export",
        "--format",
        "openrlhf",
        "--instances",
        s(&d.instances),
        "--repos",
        s(&d.repos),
        "--out",
        o,
        "--input-key",
        "context",
        "--label-key",
        "answer",
    ]);
    assert_eq!(rc, 0, "{err}");
    // JSONL: the keys OpenRLHF is told, labels that score like the records.
    let text = std::fs::read_to_string(out.path().join("train.jsonl")).unwrap();
    let rows: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), n);
    for (row, rec) in rows.iter().zip(&d.records) {
        assert_eq!(row["context"].as_str(), Some(rec.prompt.as_str()));
        let label = RewardLabel::parse(row["answer"].as_str().unwrap()).unwrap();
        assert_eq!(label.subtask, rec.subtask);
        assert_eq!(label.truth, rec.truth);
    }
    // Bad options are one-line errors.
    let (rc, _, err) = sorft(&[
        "export",
        "--format",
        "openrlhf",
        "--instances",
        s(&d.instances),
        "--repos",
        "/nonexistent",
        "--out",
        o,
    ]);
    assert_eq!(rc, 1);
    assert!(err.contains("--repos /nonexistent: not a folder"), "{err}");
    let Some(py) = pyarrow_python() else { return };
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/scaleout/check_export.py"
    );
    let pq = out.path().join("train.parquet");
    let jl = out.path().join("train.jsonl");
    let r = Command::new(&py)
        .args([script, s(&pq), s(&jl), "context", "answer"])
        .output()
        .unwrap();
    let so = String::from_utf8_lossy(&r.stdout);
    assert!(
        r.status.success(),
        "{so}{}",
        String::from_utf8_lossy(&r.stderr)
    );
    assert!(so.contains(&format!("{n} rows")), "{so}");
    assert!(so.contains("'edit', 'file', 'function', 'line'"), "{so}");
}

// ---------- the service ----------

struct Server {
    child: Child,
    addr: String,
}

impl Server {
    fn start(extra: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_sorft"))
            .args(["serve-reward", "--port", "0"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .split("http://")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .unwrap_or_else(|| panic!("no address in {line:?}"))
            .to_string();
        Server { child, addr }
    }

    /// SIGTERM, then the exit status and what was printed.
    fn stop(mut self) -> (i32, String) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let mut rest = String::new();
        if let Some(mut o) = self.child.stdout.take() {
            o.read_to_string(&mut rest).unwrap();
        }
        let st = self.child.wait().unwrap();
        (st.code().unwrap_or(-1), rest)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP/1.1 exchange on a fresh connection: (status, body).
fn http(addr: &str, method: &str, path: &str, body: &[u8]) -> (u16, String) {
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    c.write_all(head.as_bytes()).unwrap();
    let _ = c.write_all(body);
    read_answer(&mut c)
}

fn read_answer(c: &mut TcpStream) -> (u16, String) {
    let mut buf = Vec::new();
    let _ = c.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf).to_string();
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|x| x.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|x| x.1.to_string())
        .unwrap_or_default();
    (code, body)
}

fn request(answers: &[String], labels: &[String], prompts: &[String]) -> Vec<u8> {
    serde_json::json!({"query": answers, "prompts": prompts, "labels": labels})
        .to_string()
        .into_bytes()
}

fn rewards_of(body: &str) -> Vec<f64> {
    let v: serde_json::Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
    v["rewards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

// ---------- hand-varied answers ----------

fn gold(rec: &SubtaskRecord) -> String {
    let t = &rec.truth;
    match rec.subtask {
        Subtask::File => t.files.join("\n"),
        Subtask::Function => t
            .functions
            .iter()
            .map(|f| format!("{}\n{}: {}\n", f.path, f.kind.word(), f.name))
            .collect(),
        Subtask::Line => t
            .lines
            .iter()
            .map(|l| format!("{}\nline: {}\n", l.path, l.line))
            .collect(),
        Subtask::Edit => render_blocks(&t.edits),
    }
}

/// A shown target that is not in the truth, in the subtask's answer format.
fn wrong(rec: &SubtaskRecord) -> String {
    let sh = &rec.shown;
    match rec.subtask {
        Subtask::File => sh
            .files
            .iter()
            .find(|f| !rec.truth.files.contains(f))
            .cloned()
            .unwrap_or_default(),
        Subtask::Function => sh
            .functions
            .iter()
            .find(|f| !rec.truth.functions.contains(f))
            .map(|f| format!("{}\n{}: {}\n", f.path, f.kind.word(), f.name))
            .unwrap_or_default(),
        Subtask::Line | Subtask::Edit => sh
            .windows
            .first()
            .map(|w| format!("{}\nline: {}\n", w.path, w.start_line))
            .unwrap_or_default(),
    }
}

/// Deterministic small PRNG (SplitMix64).
struct Mix(u64);
impl Mix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// A character-level mutation of `text` (drop, duplicate, change case, insert a digit).
fn mutate(text: &str, m: &mut Mix) -> String {
    let mut c: Vec<char> = text.chars().collect();
    if c.is_empty() {
        return "x".into();
    }
    let i = m.below(c.len());
    match m.below(4) {
        0 => {
            c.remove(i);
        }
        1 => c.insert(i, c[i]),
        2 => {
            c[i] = if c[i].is_lowercase() {
                c[i].to_ascii_uppercase()
            } else {
                c[i].to_ascii_lowercase()
            }
        }
        _ => c.insert(i, char::from(b'0' + m.below(10) as u8)),
    }
    c.into_iter().collect()
}

/// About fifty answers per record: right, fenced, reasoned, duplicated, partial, superset, wrong,
/// empty, invented, malformed, other subtasks' formats, broken edits, and random mutations.
fn varied_answers(
    rec: &SubtaskRecord,
    others: &[String],
    seed: u64,
) -> Vec<(&'static str, String)> {
    let g = gold(rec);
    let w = wrong(rec);
    let mut v: Vec<(&'static str, String)> = vec![
        ("right", g.clone()),
        ("right_fenced", format!("```\n{g}\n```")),
        (
            "right_reasoned",
            format!("<think>the bug is here</think>\n{g}"),
        ),
        ("right_twice", format!("{g}\n{g}")),
        ("right_crlf", g.replace('\n', "\r\n")),
        (
            "partial",
            g.lines()
                .take(g.lines().count() / 2 + 1)
                .collect::<Vec<_>>()
                .join("\n"),
        ),
        ("superset", format!("{g}\n{w}")),
        ("wrong", w.clone()),
        ("empty", String::new()),
        ("blank", " \n\t\n".into()),
        (
            "invented",
            "no/such/file.py\nfunction: nowhere\nline: 99999\n".into(),
        ),
        ("invented_mixed", format!("{g}\nghost/module.py\n")),
        ("malformed_text", "I could not find anything, sorry.".into()),
        ("malformed_json", "{\"files\": [\"a.py\"".into()),
        ("malformed_unicode", "ünïcödé 🚀 \u{0}\u{1b}[31m".into()),
        ("malformed_fence", "```\n```\n```".into()),
        ("malformed_edit", "<<<<<<< SEARCH\nx = 1\n=======\n".into()),
        ("malformed_long", "a/".repeat(3000)),
    ];
    for (i, o) in others.iter().enumerate() {
        v.push(("other_format", o.clone()));
        if i >= 3 {
            break;
        }
    }
    if rec.subtask == Subtask::Edit {
        let broken: Vec<EditBlock> = rec
            .truth
            .edits
            .iter()
            .map(|b| EditBlock {
                search: format!("{}# not there\n", b.search),
                ..b.clone()
            })
            .collect();
        v.push(("edit_search_not_found", render_blocks(&broken)));
        let noop: Vec<EditBlock> = rec
            .truth
            .edits
            .iter()
            .map(|b| EditBlock {
                replace: b.search.clone(),
                ..b.clone()
            })
            .collect();
        v.push(("edit_no_change", render_blocks(&noop)));
        let elsewhere: Vec<EditBlock> = rec
            .truth
            .edits
            .iter()
            .map(|b| EditBlock {
                path: "other/place.py".into(),
                ..b.clone()
            })
            .collect();
        v.push(("edit_unknown_file", render_blocks(&elsewhere)));
    }
    let mut m = Mix(seed);
    for _ in 0..28 {
        let base = if m.below(3) == 0 { &w } else { &g };
        let mut t = base.clone();
        for _ in 0..=m.below(3) {
            t = mutate(&t, &mut m);
        }
        v.push(("mutated", t));
    }
    v
}

struct Case {
    kind: &'static str,
    label: String,
    answer: String,
    expected: f64,
}

fn cases() -> Vec<Case> {
    let d = data();
    let golds: Vec<String> = d.records.iter().map(gold).collect();
    let mut out = Vec::new();
    for (i, rec) in d.records.iter().enumerate() {
        let label = RewardLabel::from_record(rec).to_json();
        let others: Vec<String> = golds
            .iter()
            .enumerate()
            .filter(|(j, _)| d.records[*j].subtask != rec.subtask)
            .map(|x| x.1.clone())
            .collect();
        for (kind, answer) in varied_answers(rec, &others, i as u64) {
            let expected = rec.reward(&answer, EditReward::LineFbeta).reward;
            out.push(Case {
                kind,
                label: label.clone(),
                answer,
                expected,
            });
        }
    }
    out
}

#[test]
fn the_verl_reward_function_gives_sorfts_rewards() {
    let cases = cases();
    assert!(cases.len() >= 1000, "{} cases", cases.len());
    // The set is varied: right answers score 1, and zero and partial scores are common.
    let ones = cases
        .iter()
        .filter(|c| c.kind == "right" && c.expected > 0.999)
        .count();
    let rights = cases.iter().filter(|c| c.kind == "right").count();
    assert_eq!(ones, rights, "every gold answer scores 1");
    let zeros = cases.iter().filter(|c| c.expected == 0.0).count();
    let partial = cases
        .iter()
        .filter(|c| c.expected > 0.0 && c.expected < 0.999)
        .count();
    assert!(
        zeros > 300 && partial > 20,
        "zeros {zeros}, partial {partial}"
    );
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, tamper: bool| {
        let p = dir.path().join(name);
        let mut f = std::fs::File::create(&p).unwrap();
        for (i, c) in cases.iter().enumerate() {
            let expected = if tamper && i == 7 {
                c.expected + 0.25
            } else {
                c.expected
            };
            let line = serde_json::json!({"kind": c.kind, "label": c.label, "answer": c.answer, "expected": expected});
            writeln!(f, "{line}").unwrap();
        }
        p
    };
    let good = write("cases.jsonl", false);
    let planted = write("planted.jsonl", true);
    let server = Server::start(&["--workers", "2"]);
    let module = concat!(env!("CARGO_MANIFEST_DIR"), "/python/sorft_reward.py");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/scaleout/parity.py");
    let run = |cases: &Path| {
        let r = Command::new("python3")
            .args([script, module, s(cases)])
            .env("SORFT_REWARD_URL", format!("http://{}", server.addr))
            .output()
            .unwrap();
        (
            r.status.code(),
            String::from_utf8_lossy(&r.stdout).to_string() + &String::from_utf8_lossy(&r.stderr),
        )
    };
    let (code, out) = run(&good);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains(&format!("{} cases, 0 mismatches", cases.len())),
        "{out}"
    );
    // The checker catches a planted difference.
    let (code, out) = run(&planted);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains(" 2 mismatches") && out.contains("case 7 ("),
        "{out}"
    );
    let (rc, out) = server.stop();
    assert_eq!(rc, 0, "{out}");
}

#[test]
fn openrlhf_queries_lose_prompt_and_end_markers() {
    let d = data();
    let server = Server::start(&["--workers", "1"]);
    let recs: Vec<&SubtaskRecord> = d.records.iter().take(8).collect();
    let prompts: Vec<String> = recs
        .iter()
        .map(|r| {
            format!(
                "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n",
                r.prompt
            )
        })
        .collect();
    let answers: Vec<String> = recs.iter().map(|r| gold(r)).collect();
    let queries: Vec<String> = prompts
        .iter()
        .zip(&answers)
        .map(|(p, a)| format!("{p}{a}<|im_end|>"))
        .collect();
    let labels: Vec<String> = recs
        .iter()
        .map(|r| RewardLabel::from_record(r).to_json())
        .collect();
    let (code, body) = http(
        &server.addr,
        "POST",
        "/",
        &request(&queries, &labels, &prompts),
    );
    assert_eq!(code, 200, "{body}");
    let want: Vec<f64> = recs
        .iter()
        .zip(&answers)
        .map(|(r, a)| r.reward(a, EditReward::LineFbeta).reward)
        .collect();
    let got = rewards_of(&body);
    assert_eq!(got.len(), want.len());
    assert!(
        got.iter().zip(&want).all(|(g, w)| (g - w).abs() < 1e-12),
        "{got:?} vs {want:?}"
    );
    assert!(want.iter().all(|&x| x > 0.999));
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    for k in ["precision", "recall", "format_error", "rule_reward"] {
        assert_eq!(
            v["extra_logs"][k].as_array().map(Vec::len),
            Some(recs.len()),
            "{k}"
        );
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

#[test]
fn the_service_under_load_loses_and_duplicates_nothing() {
    let cases = cases();
    let server = Server::start(&["--workers", "2", "--queue", "64"]);
    const CLIENTS: usize = 24;
    const PER_CLIENT: usize = 30;
    let addr = server.addr.clone();
    let cases = std::sync::Arc::new(cases);
    let t0 = Instant::now();
    let handles: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (addr, cases) = (addr.clone(), cases.clone());
            std::thread::spawn(move || {
                let mut lat = Vec::new();
                let mut n = 0;
                for r in 0..PER_CLIENT {
                    // 1-4 samples per request, each case used by exactly one request.
                    let k = 1 + (c + r) % 4;
                    let start = ((c * PER_CLIENT + r) * 4) % cases.len();
                    let pick: Vec<&Case> =
                        (0..k).map(|j| &cases[(start + j) % cases.len()]).collect();
                    let answers: Vec<String> = pick.iter().map(|c| c.answer.clone()).collect();
                    let labels: Vec<String> = pick.iter().map(|c| c.label.clone()).collect();
                    let t = Instant::now();
                    let (code, body) = http(
                        &addr,
                        "POST",
                        "/get_reward",
                        &request(&answers, &labels, &vec![String::new(); k]),
                    );
                    lat.push(t.elapsed().as_secs_f64());
                    assert_eq!(code, 200, "{body}");
                    let got = rewards_of(&body);
                    let want: Vec<f64> = pick.iter().map(|c| c.expected).collect();
                    // Exact up to JSON's float text (serde_json's parser may differ in the last bit).
                    assert_eq!(
                        got.len(),
                        want.len(),
                        "client {c} request {r}: lost or extra rewards"
                    );
                    for (g, w) in got.iter().zip(&want) {
                        assert!(
                            (g - w).abs() < 1e-12,
                            "client {c} request {r}: {got:?} vs {want:?}"
                        );
                    }
                    n += k;
                }
                (lat, n)
            })
        })
        .collect();
    let mut lat = Vec::new();
    let mut samples = 0;
    for h in handles {
        let (l, n) = h.join().unwrap();
        lat.extend(l);
        samples += n;
    }
    let wall = t0.elapsed().as_secs_f64();
    lat.sort_by(f64::total_cmp);
    eprintln!(
        "load: {} requests, {samples} rewards from {CLIENTS} clients in {wall:.2}s ({:.0} rewards/s); latency p50 {:.1} ms, p99 {:.1} ms",
        lat.len(),
        samples as f64 / wall,
        1e3 * percentile(&lat, 0.5),
        1e3 * percentile(&lat, 0.99)
    );
    let (code, metrics) = http(&server.addr, "GET", "/metrics", b"");
    assert_eq!(code, 200);
    assert!(
        metrics.contains(&format!("sorft_rewards_total {samples}\n")),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!(
            "sorft_reward_requests_total{{code=\"200\"}} {}\n",
            CLIENTS * PER_CLIENT
        )),
        "{metrics}"
    );
    let (rc, out) = server.stop();
    assert_eq!(rc, 0);
    assert!(out.contains(&format!("{samples} rewards")), "{out}");
}

#[test]
fn hostile_requests_get_clear_errors_and_stall_no_one() {
    let d = data();
    let server = Server::start(&[
        "--workers",
        "2",
        "--max-body-mb",
        "1",
        "--read-timeout",
        "3",
    ]);
    let addr = server.addr.clone();
    let rec = &d.records[0];
    let label = RewardLabel::from_record(rec).to_json();
    let good = request(&[gold(rec)], &[label], &[String::new()]);
    // Slow clients first: a body that never completes and headers that never end.
    let mut slow_body = TcpStream::connect(&addr).unwrap();
    slow_body
        .write_all(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 500\r\n\r\n{\"query\": [")
        .unwrap();
    let mut slow_head = TcpStream::connect(&addr).unwrap();
    slow_head
        .write_all(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-le")
        .unwrap();
    // Meanwhile everyone else is served at once.
    for _ in 0..20 {
        let t = Instant::now();
        let (code, body) = http(&addr, "POST", "/", &good);
        assert_eq!(code, 200, "{body}");
        // A request held up by the slow clients would wait for their 3 s read timeout.
        assert!(
            t.elapsed() < Duration::from_millis(2500),
            "stalled: {:?}",
            t.elapsed()
        );
    }
    let cases: Vec<(&str, Vec<u8>, u16, &str)> = vec![
        (
            "malformed JSON",
            b"{\"query\": [".to_vec(),
            400,
            "not valid JSON",
        ),
        ("not an object", b"[1, 2]".to_vec(), 400, "JSON object"),
        (
            "wrong type",
            br#"{"query": "a", "labels": []}"#.to_vec(),
            400,
            "`query` must be a list of strings",
        ),
        (
            "wrong item type",
            br#"{"query": [1], "labels": ["x"]}"#.to_vec(),
            400,
            "`query` item 0 must be a string",
        ),
        (
            "length mismatch",
            br#"{"query": ["a", "b"], "labels": []}"#.to_vec(),
            400,
            "same length",
        ),
        (
            "bad label",
            br#"{"query": ["a"], "labels": ["{\"v\": 1}"]}"#.to_vec(),
            400,
            "`labels` item 0: not a sorft reward label",
        ),
        ("huge body", vec![b' '; 2 << 20], 413, "over the limit"),
    ];
    for (what, body, want, msg) in cases {
        let (code, text) = http(&addr, "POST", "/", &body);
        assert_eq!(code, want, "{what}: {text}");
        assert!(text.contains(msg), "{what}: {text}");
    }
    // A huge declared body is refused before it is sent; a chunked one once it passes the limit.
    let mut c = TcpStream::connect(&addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(
        b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 100000000000\r\nconnection: close\r\n\r\n",
    )
    .unwrap();
    let (code, text) = read_answer(&mut c);
    assert_eq!(code, 413, "{text}");
    let mut c = TcpStream::connect(&addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(
        b"POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n",
    )
    .unwrap();
    let chunk = vec![b' '; 256 << 10];
    for _ in 0..6 {
        if c.write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
            .is_err()
            || c.write_all(&chunk).is_err()
            || c.write_all(b"\r\n").is_err()
        {
            break;
        }
    }
    let (code, text) = read_answer(&mut c);
    assert_eq!(code, 413, "{text}");
    let (code, text) = http(&addr, "GET", "/nowhere", b"");
    assert_eq!(code, 404, "{text}");
    let (code, _) = http(&addr, "GET", "/", b"");
    assert_eq!(code, 405);
    let (code, text) = http(&addr, "GET", "/health", b"");
    assert_eq!(code, 200);
    assert!(text.contains("\"status\":\"ok\""), "{text}");
    // The slow body is answered 408 once its time is up; the slow header is dropped.
    slow_body
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let (code, text) = read_answer(&mut slow_body);
    assert_eq!(code, 408, "{text}");
    assert!(text.contains("--read-timeout"), "{text}");
    slow_head
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut rest = Vec::new();
    let _ = slow_head.read_to_end(&mut rest);
    // The server is still well.
    let (code, body) = http(&addr, "POST", "/", &good);
    assert_eq!(code, 200, "{body}");
    let (rc, out) = server.stop();
    assert_eq!(rc, 0);
    assert!(
        out.contains("400=6") && out.contains("408=1") && out.contains("413=3"),
        "{out}"
    );
}

/// Waits until `/health` shows `scoring` requests on workers and `queued` waiting.
fn wait_health(addr: &str, scoring: u64, queued: u64) {
    let t = Instant::now();
    loop {
        let (_, body) = http(addr, "GET", "/health", b"");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        if v["scoring"] == scoring && v["queued"] == queued {
            return;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "health never showed scoring={scoring} queued={queued}: {body}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn execution_rewards_back_pressure_and_graceful_shutdown() {
    let d = data();
    let server = Server::start(&[
        "--instances",
        s(&d.instances),
        "--repos",
        s(&d.repos),
        "--workers",
        "1",
        "--queue",
        "1",
    ]);
    let addr = server.addr.clone();
    let edits: Vec<&SubtaskRecord> = d
        .records
        .iter()
        .filter(|r| r.subtask == Subtask::Edit)
        .collect();
    assert!(edits.len() >= 3 && d.list.len() >= 3);
    let labels: Vec<String> = edits
        .iter()
        .map(|r| RewardLabel::from_record(r).to_json())
        .collect();
    let n = edits.len();
    // Gold edits resolve their instances; an empty edit never runs.
    let mut answers: Vec<String> = edits.iter().map(|r| gold(r)).collect();
    answers[n - 1] = String::new();
    let slow = request(&answers, &labels, &vec![String::new(); n]);
    let a1 = addr.clone();
    let first = std::thread::spawn(move || http(&a1, "POST", "/", &slow));
    wait_health(&addr, 1, 0);
    // The worker is busy with `first`: one request waits in the queue, the next is refused.
    let quick = request(&answers[..1], &labels[..1], &[String::new()]);
    let a2 = addr.clone();
    let q2 = quick.clone();
    let queued = std::thread::spawn(move || http(&a2, "POST", "/", &q2));
    wait_health(&addr, 1, 1);
    let (code, text) = http(&addr, "POST", "/", &quick);
    assert_eq!(code, 503, "{text}");
    assert!(text.contains("queue full"), "{text}");
    // Shut down while both accepted requests are in flight: they are still answered.
    // SAFETY: signalling our own child.
    unsafe { libc::kill(server.child.id() as i32, libc::SIGTERM) };
    let (code, body) = first.join().unwrap();
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let rewards = rewards_of(&body);
    assert_eq!(rewards[..n - 1], vec![1.0; n - 1][..], "{body}");
    assert_eq!(rewards[n - 1], 0.0);
    assert_eq!(
        v["details"][n - 1]["execution"]["status"],
        "no_patch",
        "{body}"
    );
    assert_eq!(v["extra_logs"]["resolved"][0], 1.0);
    let (code, body) = queued.join().unwrap();
    assert_eq!(code, 200, "{body}");
    // New connections are refused once it stopped; it exits 0 with its tally.
    let (rc, out) = server.stop();
    assert_eq!(rc, 0, "{out}");
    assert!(
        out.contains(&format!("{} rewards", n + 1)) && out.contains("503=1"),
        "{out}"
    );
    assert!(TcpStream::connect(&addr).is_err());
}
