//! The OpenAI-compatible client against a local mock server: success, retries on 500, malformed
//! JSON, time-outs.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sorft::model::chat::Message;
use sorft::rft::openai::{ChatClient, ChatRequest, ClientConfig, ClientError};

/// Serves `replies` in order, one connection each: (status, body, delay before answering).
fn serve(
    replies: Vec<(u16, String, u64)>,
) -> (String, Arc<AtomicUsize>, Arc<std::sync::Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let count = Arc::new(AtomicUsize::new(0));
    let bodies = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (c, b) = (count.clone(), bodies.clone());
    std::thread::spawn(move || {
        for (status, body, delay) in replies {
            let Ok((mut s, _)) = listener.accept() else {
                return;
            };
            c.fetch_add(1, Ordering::SeqCst);
            let mut r = BufReader::new(s.try_clone().unwrap());
            let mut len = 0usize;
            loop {
                let mut line = String::new();
                if r.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    len = v.trim().parse().unwrap_or(0);
                }
            }
            let mut req = vec![0u8; len];
            let _ = r.read_exact(&mut req);
            b.lock()
                .unwrap()
                .push(String::from_utf8_lossy(&req).to_string());
            std::thread::sleep(Duration::from_millis(delay));
            let _ = write!(
                s,
                "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (format!("http://{addr}/v1"), count, bodies)
}

fn client(url: &str, timeout: f64, retries: usize) -> ChatClient {
    ChatClient::new(ClientConfig {
        base_url: url.to_string(),
        model: "teacher".into(),
        api_key: Some("k".into()),
        timeout_secs: timeout,
        retries,
    })
}

fn req() -> ChatRequest {
    ChatRequest {
        messages: vec![Message::new("user", "Which file?")],
        n: 2,
        temperature: 0.7,
        max_tokens: 64,
        seed: Some(3),
    }
}

const OK: &str = r#"{"choices":[{"message":{"role":"assistant","content":"a.py"}},{"message":{"role":"assistant","content":"b.py"}}]}"#;

#[test]
fn returns_every_choice_and_sends_the_request_fields() {
    let (url, _, bodies) = serve(vec![(200, OK.into(), 0)]);
    let out = client(&url, 5.0, 0).complete(&req()).unwrap();
    assert_eq!(out, vec!["a.py", "b.py"]);
    let sent: serde_json::Value = serde_json::from_str(&bodies.lock().unwrap()[0]).unwrap();
    assert_eq!(sent["model"], "teacher");
    assert_eq!(sent["n"], 2);
    assert_eq!(sent["seed"], 3);
    assert_eq!(sent["messages"][0]["content"], "Which file?");
}

#[test]
fn retries_a_server_error_then_succeeds() {
    let (url, count, _) = serve(vec![(500, "{}".into(), 0), (200, OK.into(), 0)]);
    let out = client(&url, 5.0, 2).complete(&req()).unwrap();
    assert_eq!(out.len(), 2);
    assert_eq!(count.load(Ordering::SeqCst), 2);
}

#[test]
fn a_500_after_the_last_retry_is_a_status_error() {
    let (url, _, _) = serve(vec![(500, "boom".into(), 0), (503, "busy".into(), 0)]);
    match client(&url, 5.0, 1).complete(&req()) {
        Err(ClientError::Status { status, body, .. }) => {
            assert_eq!(status, 503);
            assert_eq!(body, "busy");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn malformed_json_is_reported_and_not_retried() {
    let (url, count, _) = serve(vec![(200, "{not json".into(), 0), (200, OK.into(), 0)]);
    let e = client(&url, 5.0, 3).complete(&req()).unwrap_err();
    assert!(matches!(e, ClientError::Malformed { .. }), "{e}");
    assert_eq!(count.load(Ordering::SeqCst), 1);
    let (url, _, _) = serve(vec![(200, r#"{"choices":[{"message":{}}]}"#.into(), 0)]);
    let e = client(&url, 5.0, 0).complete(&req()).unwrap_err();
    assert!(e.to_string().contains("message.content"), "{e}");
}

#[test]
fn a_slow_server_times_out() {
    let (url, _, _) = serve(vec![(200, OK.into(), 1500)]);
    let t = std::time::Instant::now();
    let e = client(&url, 0.3, 0).complete(&req()).unwrap_err();
    assert!(matches!(e, ClientError::Transport { .. }), "{e}");
    assert!(t.elapsed() < Duration::from_millis(1400));
}
