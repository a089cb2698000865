//! The fleet tests' Redis: a `redis-server` of each test's own, or the one
//! `BATCHRUN_TEST_REDIS_URL` names; and a proxy that cuts it off.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A Redis for one test: its own `redis-server`, or the one
/// `BATCHRUN_TEST_REDIS_URL` names.
pub struct Redis {
    child: Option<Child>,
    /// `redis://127.0.0.1:PORT/0`.
    pub url: String,
}

impl Redis {
    /// Starts a `redis-server` without persistence on a free port (retrying
    /// on a port taken in between), or uses `BATCHRUN_TEST_REDIS_URL`.
    pub fn start() -> Redis {
        if which("redis-server") {
            for _ in 0..5 {
                if let Some(r) = Redis::spawn() {
                    return r;
                }
            }
            panic!("redis-server would not start on a free port");
        }
        match std::env::var("BATCHRUN_TEST_REDIS_URL") {
            Ok(url) if !url.is_empty() => Redis { child: None, url },
            _ => panic!(
                "the fleet tests need Redis: put redis-server on PATH, or set \
                 BATCHRUN_TEST_REDIS_URL=redis://HOST:PORT/DB"
            ),
        }
    }

    fn spawn() -> Option<Redis> {
        let port = free_port();
        let mut child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        let url = format!("redis://127.0.0.1:{port}/0");
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return None;
            }
            if redis::Client::open(url.as_str())
                .and_then(|c| c.get_connection())
                .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
                .is_ok()
            {
                return Some(Redis {
                    child: Some(child),
                    url,
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        None
    }

    /// Makes Redis forget a fleet as a restart or an operator would:
    /// `flushall` forgets everything, anything else deletes `key` alone.
    pub fn forget(&self, how: &str, key: &str) {
        let mut c = self.conn();
        match how {
            "flushall" => redis::cmd("FLUSHALL").query::<()>(&mut c).unwrap(),
            _ => redis::cmd("DEL").arg(key).query::<()>(&mut c).unwrap(),
        }
    }

    /// A synchronous connection, to look at the keys.
    pub fn conn(&self) -> redis::Connection {
        redis::Client::open(self.url.as_str())
            .unwrap()
            .get_connection()
            .expect("connect to the test Redis")
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        if let Some(c) = &mut self.child {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub fn which(bin: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(bin).is_file()))
        .unwrap_or(false)
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A fleet name no other test (nor an earlier run on a shared Redis) uses.
pub fn fleet_name(tag: &str) -> String {
    format!(
        "it-{tag}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    )
}

/// A TCP proxy in front of Redis that the test can cut and restore: to the
/// processes behind it, Redis is down, then back.
pub struct Proxy {
    port: u16,
    upstream: String,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Proxy {
    pub async fn start(upstream: &str) -> Proxy {
        let u = reqwest::Url::parse(upstream).unwrap();
        let upstream = format!("{}:{}", u.host_str().unwrap(), u.port().unwrap_or(6379));
        let mut p = Proxy {
            port: free_port(),
            upstream,
            task: None,
        };
        p.resume().await;
        p
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    pub async fn resume(&mut self) {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", self.port))
            .await
            .expect("bind the proxy");
        let upstream = self.upstream.clone();
        self.task = Some(tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            loop {
                let Ok((mut down, _)) = listener.accept().await else {
                    return;
                };
                let upstream = upstream.clone();
                conns.spawn(async move {
                    if let Ok(mut up) = tokio::net::TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
                    }
                });
            }
        }));
    }

    /// Closes the listener and every connection through it.
    pub async fn cut(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
            let _ = t.await;
        }
    }
}
