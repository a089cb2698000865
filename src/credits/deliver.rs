//! Alert sinks: every billing alert becomes a line on stderr at once, is kept
//! for the `--json` summary, and, with `--alert-webhook`, is POSTed as JSON in
//! the background.
//!
//! Webhook delivery never blocks the caller (workers raise alerts in the middle
//! of a run) and is bounded in time (a dead receiver must not hold the process
//! open); [`Alerter::flush`] gives in-flight deliveries a grace period before
//! the process exits.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::{StatusCode, Url};
use tokio_util::task::TaskTracker;

use super::{format_line, Alert};

/// How long one webhook attempt may take, connection included.
pub const WEBHOOK_TIMEOUT: Duration = Duration::from_secs(5);
/// Attempts per alert before giving up on the webhook.
pub const WEBHOOK_TRIES: u32 = 3;
/// How long the run waits at its end for webhook deliveries still under
/// way ([`Alerter::flush`]).
pub const WEBHOOK_GRACE: Duration = Duration::from_secs(5);
/// Pause before the second attempt; doubled before each later one, plus up to
/// 50% jitter so a fleet of runs does not retry in lockstep.
const WEBHOOK_BACKOFF: Duration = Duration::from_millis(250);

type Print = Arc<dyn Fn(&str) + Send + Sync>;

/// Checks an `--alert-webhook` value: an absolute http(s) URL with a host.
/// Meant as the CLI's value parser so a typo fails at start, not at the
/// first alert.
pub fn check_webhook_url(s: &str) -> Result<(), String> {
    parse_webhook(s).map(|_| ())
}

fn parse_webhook(s: &str) -> Result<Url, String> {
    // The error text never echoes the URL: it may carry a token.
    let url =
        Url::parse(s.trim()).map_err(|e| format!("alert webhook is not a valid URL ({e})"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err("alert webhook must be an http:// or https:// URL".to_string());
    }
    match url.host_str() {
        Some(h) if !h.is_empty() => {}
        _ => return Err("alert webhook URL has no host".to_string()),
    }
    Ok(url)
}

/// Scheme, host and port only. Webhook URLs routinely carry a secret in
/// their path or query (and sometimes in userinfo), so this is the only form
/// of the URL that is ever printed.
fn origin(url: &Url) -> String {
    let host = url.host_str().unwrap_or("?");
    match url.port() {
        Some(p) => format!("{}://{host}:{p}", url.scheme()),
        None => format!("{}://{host}", url.scheme()),
    }
}

struct Webhook {
    url: Url,
    origin: String,
    client: reqwest::Client,
}

/// Sends billing alerts to stderr, the summary and an optional webhook.
pub struct Alerter {
    job: String,
    /// The input file and the machine, so a page names what and where.
    input: String,
    host: String,
    webhook: Option<Webhook>,
    print: Print,
    fired: Mutex<Vec<Alert>>,
    /// The deliveries in flight: a task dropped by a runtime shutdown
    /// leaves it too, so `flush` can never wait on a ghost.
    deliveries: TaskTracker,
}

impl fmt::Debug for Alerter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Alerter")
            .field("job", &self.job)
            .field("webhook", &self.webhook.as_ref().map(|w| &w.origin))
            .field("pending", &self.deliveries.len())
            .finish_non_exhaustive()
    }
}

impl Alerter {
    /// An alerter for run `job`, posting to `webhook` if given, printing
    /// through `print`.
    ///
    /// `print` receives whole lines without a trailing newline; the runner
    /// passes a closure that prints above the progress bar (or `eprintln!`).
    /// An unusable webhook URL is reported once through `print` and webhook
    /// delivery is disabled; alerts still reach stderr and the summary.
    pub fn new(
        job: String,
        webhook: Option<String>,
        print: Box<dyn Fn(&str) + Send + Sync>,
    ) -> Self {
        let print: Print = Arc::from(print);
        let webhook = webhook.and_then(|raw| {
            let url = match parse_webhook(&raw) {
                Ok(u) => u,
                Err(e) => {
                    print(&format!("batchrun: {e}; webhook alerts are disabled"));
                    return None;
                }
            };
            let client = reqwest::Client::builder()
                .timeout(WEBHOOK_TIMEOUT)
                .connect_timeout(WEBHOOK_TIMEOUT)
                .user_agent(concat!("batchrun/", env!("CARGO_PKG_VERSION")))
                .build();
            match client {
                Ok(client) => Some(Webhook {
                    origin: origin(&url),
                    url,
                    client,
                }),
                Err(_) => {
                    print(
                        "batchrun: could not set up the HTTP client; webhook alerts are disabled",
                    );
                    None
                }
            }
        });
        Alerter {
            job,
            input: String::new(),
            host: crate::sys::host_name(),
            webhook,
            print,
            fired: Mutex::new(Vec::new()),
            deliveries: TaskTracker::new(),
        }
    }

    /// Names the job's input file in the webhook's alerts: a job hash alone
    /// tells whoever is paged neither what ran nor where.
    /// The path is made absolute: a cron job's working directory says
    /// nothing to the person reading the page.
    pub fn for_input(mut self, input: &std::path::Path) -> Self {
        let full = std::fs::canonicalize(input).unwrap_or_else(|_| input.to_path_buf());
        self.input = full.display().to_string();
        self
    }

    /// Raises `alert`: prints its line at once, records it for
    /// [`Alerter::fired`], and starts webhook delivery in the background.
    ///
    /// Never blocks and never fails: a webhook that is down after
    /// [`WEBHOOK_TRIES`] attempts costs one stderr line, not the run. Must be
    /// called inside a tokio runtime for the webhook to be used; outside one the
    /// delivery is skipped with a line saying so.
    pub fn send(&self, alert: &Alert) {
        (self.print)(&format_line(alert));
        // A poisoned lock only means another thread panicked mid-push; the
        // list itself is still sound, and losing alerts would be worse.
        self.fired
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(alert.clone());

        let Some(hook) = &self.webhook else { return };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            (self.print)(&format!(
                "batchrun: alert webhook to {} skipped: no async runtime",
                hook.origin
            ));
            return;
        };
        let body = serde_json::json!({
            "kind": alert.kind,
            "id": alert.id,
            "message": alert.message,
            "remaining": alert.remaining,
            "max": alert.max,
            "renewal": alert.renewal,
            "job": self.job,
            "input": self.input,
            "host": self.host,
            // Slack- and Mattermost-style receivers display `text` as is.
            "text": format!("{} ({} on {})", format_line(alert), self.input, self.host),
        });
        let client = hook.client.clone();
        let url = hook.url.clone();
        let origin = hook.origin.clone();
        let print = Arc::clone(&self.print);
        self.deliveries.spawn_on(
            async move {
                if let Err(why) = deliver(&client, url, &body).await {
                    print(&format!(
                        "batchrun: alert webhook to {origin} failed: {why}; \
                         the alert is still on stderr and in the summary"
                    ));
                }
            },
            &rt,
        );
    }

    /// Every alert sent so far, oldest first, for the `--json` summary.
    pub fn fired(&self) -> Vec<Alert> {
        self.fired.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Number of webhook deliveries still in flight.
    pub fn pending(&self) -> usize {
        self.deliveries.len()
    }

    /// Waits until in-flight webhook deliveries finish, or `grace` passes,
    /// whichever is first. Returns at once when nothing is pending. Call it
    /// before the process exits; deliveries still running afterwards are
    /// abandoned with the runtime, and one line says how many and to where
    /// (the webhook's origin only). Returns how many were abandoned.
    pub async fn flush(&self, grace: Duration) -> usize {
        if self.deliveries.is_empty() {
            return 0;
        }
        // Closed only while waiting: an alert after a flush is still sent.
        self.deliveries.close();
        let _ = tokio::time::timeout(grace, self.deliveries.wait()).await;
        self.deliveries.reopen();
        let left = self.deliveries.len();
        if let (Some(hook), 1..) = (&self.webhook, left) {
            // Each still waits on a receiver that took the POST and never
            // answered: without this line they vanished unsaid.
            (self.print)(&format!(
                "batchrun: {left} alert(s) not delivered to the webhook at {}: no answer \
                 within {}s of the run's end; they are on stderr and in the summary",
                hook.origin,
                grace.as_secs_f64()
            ));
        }
        left
    }
}

/// Posts `body` with bounded retries. The error is safe to print: it never
/// includes the URL.
async fn deliver(
    client: &reqwest::Client,
    url: Url,
    body: &serde_json::Value,
) -> Result<(), String> {
    let mut why = String::new();
    for attempt in 0..WEBHOOK_TRIES {
        if attempt > 0 {
            let base = WEBHOOK_BACKOFF * 2u32.pow(attempt - 1);
            tokio::time::sleep(base + base.mul_f64(fastrand::f64() * 0.5)).await;
        }
        match client.post(url.clone()).json(body).send().await {
            Ok(resp) if resp.status().is_success() => return Ok(()),
            Ok(resp) => {
                let status = resp.status();
                why = format!("HTTP {}", status.as_u16());
                if !retryable(status) {
                    // The receiver understood and refused; asking again
                    // would get the same answer.
                    return Err(why);
                }
            }
            // reqwest's own Display includes the full URL, token and all;
            // only the category is printed.
            Err(e) if e.is_timeout() => {
                why = format!("no answer within {}s", WEBHOOK_TIMEOUT.as_secs());
            }
            Err(e) if e.is_connect() => why = "could not connect".to_string(),
            Err(_) => why = "request failed".to_string(),
        }
    }
    Err(format!("{why} (after {WEBHOOK_TRIES} tries)"))
}

fn retryable(status: StatusCode) -> bool {
    status.is_server_error()
        || status == StatusCode::REQUEST_TIMEOUT
        || status == StatusCode::TOO_MANY_REQUESTS
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::credits::{AlertKind, CreditSnapshot};
    use axum::extract::{RawQuery, State};
    use axum::http::StatusCode as AxumStatus;
    use axum::routing::post;
    use axum::{Json, Router};
    use serde_json::Value;
    use std::net::SocketAddr;
    use std::sync::atomic::AtomicU32;
    use std::sync::atomic::Ordering;
    use tokio::net::TcpListener;
    use tokio::sync::mpsc;
    use tokio::time::Instant;

    type Lines = Arc<Mutex<Vec<String>>>;
    type PrintFn = Box<dyn Fn(&str) + Send + Sync>;

    /// A `print` that records lines for assertions.
    fn capture() -> (Lines, PrintFn) {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&lines);
        (
            lines,
            Box::new(move |l: &str| sink.lock().unwrap().push(l.to_string())),
        )
    }

    fn lines(l: &Lines) -> Vec<String> {
        l.lock().unwrap().clone()
    }

    fn exhausted() -> Alert {
        Alert::exhausted(
            Some(CreditSnapshot {
                remaining: 0,
                used: 10_000,
                max: 10_000,
                renewal: Some(1_796_860_800),
            }),
            1,
        )
    }

    #[derive(Clone)]
    struct Hook {
        tx: mpsc::UnboundedSender<(Option<String>, Value)>,
        /// Answer 500 to this many requests before succeeding.
        fail_first: Arc<AtomicU32>,
    }

    async fn hook(
        State(h): State<Hook>,
        RawQuery(q): RawQuery,
        Json(v): Json<Value>,
    ) -> AxumStatus {
        let _ = h.tx.send((q, v));
        let failing = h
            .fail_first
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok();
        if failing {
            AxumStatus::INTERNAL_SERVER_ERROR
        } else {
            AxumStatus::NO_CONTENT
        }
    }

    async fn receiver(
        fail_first: u32,
    ) -> (SocketAddr, mpsc::UnboundedReceiver<(Option<String>, Value)>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let state = Hook {
            tx,
            fail_first: Arc::new(AtomicU32::new(fail_first)),
        };
        let app = Router::new().route("/hook", post(hook)).with_state(state);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        (addr, rx)
    }

    #[tokio::test]
    async fn webhook_receives_the_alert_as_json() {
        let (addr, mut rx) = receiver(0).await;
        let (out, print) = capture();
        let alerter = Alerter::new(
            "job-42".into(),
            Some(format!("http://{addr}/hook?token=s3cret")),
            print,
        );
        let alert = exhausted();
        alerter.send(&alert);
        // Printed before any delivery happened.
        assert_eq!(
            lines(&out),
            [format!("batchrun: ALERT [exhausted] {}", alert.message)]
        );

        alerter.flush(Duration::from_secs(10)).await;
        assert_eq!(alerter.pending(), 0);
        let (query, v) = rx
            .try_recv()
            .expect("webhook delivered before flush returned");
        assert_eq!(query.as_deref(), Some("token=s3cret"));
        assert_eq!(v["kind"], "exhausted");
        assert_eq!(v["id"], "exhausted");
        assert_eq!(v["message"], alert.message.as_str());
        assert_eq!(v["remaining"], 0);
        assert_eq!(v["max"], 10_000);
        assert_eq!(v["renewal"], 1_796_860_800u64);
        assert_eq!(v["job"], "job-42");
        assert_eq!(alerter.fired(), [alert]);
        assert_eq!(lines(&out).len(), 1, "no failure line: {:?}", lines(&out));
    }

    #[tokio::test]
    async fn unknown_numbers_are_null_in_the_json() {
        let (addr, mut rx) = receiver(0).await;
        let (_out, print) = capture();
        let alerter = Alerter::new("j".into(), Some(format!("http://{addr}/hook")), print);
        alerter.send(&Alert::new(
            AlertKind::Waiting,
            "waiting",
            "waiting for credits",
            None,
        ));
        alerter.flush(Duration::from_secs(10)).await;
        let (_, v) = rx.try_recv().unwrap();
        assert_eq!(v["kind"], "waiting");
        assert!(v["remaining"].is_null() && v["max"].is_null() && v["renewal"].is_null());
    }

    #[tokio::test]
    async fn webhook_retries_a_server_error() {
        let (addr, mut rx) = receiver(1).await;
        let (out, print) = capture();
        let alerter = Alerter::new("j".into(), Some(format!("http://{addr}/hook")), print);
        alerter.send(&exhausted());
        alerter.flush(Duration::from_secs(10)).await;
        assert!(rx.try_recv().is_ok());
        assert!(rx.try_recv().is_ok(), "second attempt after the 500");
        assert_eq!(lines(&out).len(), 1, "{:?}", lines(&out));
    }

    #[tokio::test(start_paused = true)]
    async fn closed_port_neither_blocks_send_nor_outlasts_its_retries() {
        let addr = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let (out, print) = capture();
        let alerter = Alerter::new(
            "j".into(),
            Some(format!("http://user:pw@{addr}/hook?token=s3cret")),
            print,
        );
        let start = Instant::now();
        alerter.send(&exhausted());
        alerter.send(&exhausted());
        assert_eq!(start.elapsed(), Duration::ZERO, "send must not wait");
        assert_eq!(alerter.pending(), 2);

        // Three tries of at most 5 s plus backoff fit well inside a minute.
        alerter.flush(Duration::from_secs(60)).await;
        assert_eq!(alerter.pending(), 0);
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{:?}",
            start.elapsed()
        );
        let out = lines(&out);
        assert_eq!(out.len(), 4, "{out:?}");
        for l in &out[2..] {
            assert!(
                l.starts_with(&format!(
                    "batchrun: alert webhook to http://{addr} failed: "
                )),
                "{l}"
            );
            assert!(l.contains("after 3 tries"), "{l}");
            assert!(
                !l.contains("s3cret") && !l.contains("pw") && !l.contains("/hook"),
                "{l}"
            );
        }
        assert_eq!(alerter.fired().len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn flush_gives_up_after_grace_on_a_hanging_receiver() {
        // Accepts connections and never answers.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = listener.accept().await {
                held.push(s);
            }
        });
        let (out, print) = capture();
        let alerter = Alerter::new("j".into(), Some(format!("http://{addr}/hook")), print);
        alerter.send(&exhausted());

        let start = Instant::now();
        assert_eq!(alerter.flush(Duration::from_secs(2)).await, 1);
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_secs(2) && waited < Duration::from_secs(3),
            "{waited:?}"
        );
        assert_eq!(alerter.pending(), 1, "still trying in the background");
        // Said, naming where, not dropped unsaid.
        assert_eq!(
            lines(&out)[1],
            format!(
                "batchrun: 1 alert(s) not delivered to the webhook at http://{addr}: no answer \
                 within 2s of the run's end; they are on stderr and in the summary"
            )
        );

        // Left alone, the delivery ends on its own once every try timed out.
        alerter.flush(Duration::from_secs(60)).await;
        assert_eq!(alerter.pending(), 0);
        let out = lines(&out);
        assert!(
            out[2].contains("failed: no answer within 5s (after 3 tries)"),
            "{out:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn flush_is_immediate_when_nothing_is_pending() {
        let (out, print) = capture();
        let alerter = Alerter::new("j".into(), None, print);
        let start = Instant::now();
        alerter.flush(Duration::from_secs(3600)).await;
        alerter.send(&exhausted());
        alerter.flush(Duration::from_secs(3600)).await;
        assert_eq!(start.elapsed(), Duration::ZERO);
        assert_eq!(lines(&out).len(), 1);
        assert_eq!(alerter.fired().len(), 1);
    }

    #[test]
    fn send_outside_a_runtime_skips_the_webhook_without_panicking() {
        let (out, print) = capture();
        let alerter = Alerter::new(
            "j".into(),
            Some("https://hooks.example.com/x?token=s3cret".into()),
            print,
        );
        alerter.send(&exhausted());
        let out = lines(&out);
        assert_eq!(out.len(), 2, "{out:?}");
        assert_eq!(
            out[1],
            "batchrun: alert webhook to https://hooks.example.com skipped: no async runtime"
        );
        assert_eq!(alerter.pending(), 0);
    }

    #[test]
    fn bad_webhook_url_disables_the_webhook_once() {
        let (out, print) = capture();
        let alerter = Alerter::new("j".into(), Some("ftp://x/?token=s3cret".into()), print);
        alerter.send(&exhausted());
        let out = lines(&out);
        assert_eq!(out.len(), 2, "{out:?}");
        assert!(out[0].contains("webhook alerts are disabled"), "{out:?}");
        assert!(!out[0].contains("s3cret"));
        assert!(out[1].starts_with("batchrun: ALERT [exhausted] "));
    }

    #[test]
    fn webhook_url_checks_and_redaction() {
        assert!(check_webhook_url("https://hooks.example.com/a/b?token=x").is_ok());
        assert!(check_webhook_url("http://127.0.0.1:9/x").is_ok());
        for bad in [
            "",
            "hooks.example.com/x",
            "ftp://h/x",
            "file:///tmp/x",
            "http://",
        ] {
            let e = check_webhook_url(bad);
            assert!(e.is_err(), "{bad}");
        }
        let u = Url::parse("https://user:pw@hooks.example.com:8443/t/s3cret?k=v#f").unwrap();
        assert_eq!(origin(&u), "https://hooks.example.com:8443");
        let u = Url::parse("https://hooks.example.com/t/s3cret").unwrap();
        assert_eq!(origin(&u), "https://hooks.example.com");
    }
}
