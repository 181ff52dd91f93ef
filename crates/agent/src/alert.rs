//! Alerts: a webhook (plain-HTTP POST of the verdict JSON) and/or a command that gets the verdict on stdin.
//! Both run in a detached thread under a deadline: an alert that hangs must not hold the job's teardown.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::process::{Command, Stdio};
use std::time::Duration;

use hangwatch_model::Verdict;

/// Where alerts go.
#[derive(Debug, Clone, Default)]
pub struct AlertConfig {
    /// `http://host[:port]/path`.
    pub webhook: Option<String>,
    /// Run with `sh -c`; the verdict JSON on stdin, `HANGWATCH_KIND` and `HANGWATCH_SUMMARY` in the environment.
    pub command: Option<String>,
    pub timeout: Duration,
}

/// A parsed `http://` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpUrl {
    pub host: String,
    pub port: u16,
    pub path: String,
}

/// Parses the webhook URL; only plain HTTP is spoken (put a relay in front of HTTPS endpoints).
pub fn parse_webhook(url: &str) -> Result<HttpUrl, String> {
    let rest = url.strip_prefix("http://").ok_or_else(|| {
        format!("webhook `{url}` must start with http:// (for HTTPS, point it at a local relay or use --alert-command with curl)")
    })?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) => (
            h,
            p.parse()
                .map_err(|_| format!("bad port in webhook `{url}`"))?,
        ),
        None => (authority, 80),
    };
    if host.is_empty() {
        return Err(format!("webhook `{url}` has no host"));
    }
    Ok(HttpUrl {
        host: host.to_string(),
        port,
        path: path.to_string(),
    })
}

/// Sends the alert in the background. Returns at once.
pub fn send(config: &AlertConfig, verdict: &Verdict) {
    let body = serde_json::to_vec(verdict).unwrap_or_default();
    if let Some(url) = config.webhook.clone() {
        let body = body.clone();
        let timeout = config.timeout;
        let _ = std::thread::Builder::new()
            .name("hw-webhook".into())
            .spawn(move || {
                if let Err(e) = post(&url, &body, timeout) {
                    tracing::warn!(url, error = %e, "webhook alert failed");
                }
            });
    }
    if let Some(command) = config.command.clone() {
        let kind = verdict.kind.as_str().to_string();
        let summary = verdict.summary.clone();
        let _ = std::thread::Builder::new()
            .name("hw-alert-cmd".into())
            .spawn(move || {
                let child = Command::new("sh")
                    .arg("-c")
                    .arg(&command)
                    .env("HANGWATCH_KIND", kind)
                    .env("HANGWATCH_SUMMARY", summary)
                    .stdin(Stdio::piped())
                    .stdout(Stdio::null())
                    .spawn();
                match child {
                    Ok(mut child) => {
                        if let Some(mut stdin) = child.stdin.take() {
                            let _ = stdin.write_all(&body);
                        }
                        let _ = child.wait();
                    }
                    Err(e) => tracing::warn!(command, error = %e, "alert command failed to start"),
                }
            });
    }
}

/// One HTTP/1.1 POST; returns the status code.
pub fn post(url: &str, body: &[u8], timeout: Duration) -> Result<u16, String> {
    let u = parse_webhook(url)?;
    let addr = (u.host.as_str(), u.port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {}: {e}", u.host))?
        .next()
        .ok_or_else(|| format!("no address for {}", u.host))?;
    let mut stream = TcpStream::connect_timeout(&addr, timeout)
        .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
    let _ = stream.set_read_timeout(Some(timeout));
    let _ = stream.set_write_timeout(Some(timeout));
    let head = format!(
        "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nUser-Agent: hangwatch/{}\r\nConnection: close\r\n\r\n",
        u.path,
        u.host,
        body.len(),
        env!("CARGO_PKG_VERSION")
    );
    stream
        .write_all(head.as_bytes())
        .and_then(|_| stream.write_all(body))
        .map_err(|e| format!("sending to {addr} failed: {e}"))?;
    let mut response = Vec::new();
    let _ = stream.take(4096).read_to_end(&mut response);
    let status_line = String::from_utf8_lossy(&response);
    let code = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| "no HTTP status in the response".to_string())?;
    if (200..300).contains(&code) {
        Ok(code)
    } else {
        Err(format!("webhook answered HTTP {code}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_http_urls_and_refuses_https() {
        assert_eq!(
            parse_webhook("http://alerts.local:8080/hook/x"),
            Ok(HttpUrl {
                host: "alerts.local".into(),
                port: 8080,
                path: "/hook/x".into()
            })
        );
        assert_eq!(
            parse_webhook("http://h").map(|u| (u.port, u.path)),
            Ok((80, "/".into()))
        );
        assert!(parse_webhook("https://h/x")
            .unwrap_err()
            .contains("--alert-command"));
    }

    #[test]
    fn posts_to_a_real_listener() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let mut buf = vec![0u8; 8192];
            let mut got = Vec::new();
            while !String::from_utf8_lossy(&got).contains("\"kind\"") {
                let n = conn.read(&mut buf).unwrap();
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
            conn.write_all(b"HTTP/1.1 204 No Content\r\n\r\n").unwrap();
            String::from_utf8_lossy(&got).into_owned()
        });
        let code = post(
            &format!("http://127.0.0.1:{port}/hook"),
            br#"{"kind":"stopped"}"#,
            Duration::from_secs(5),
        )
        .unwrap();
        assert_eq!(code, 204);
        let request = server.join().unwrap();
        assert!(request.starts_with("POST /hook HTTP/1.1"), "{request}");
        assert!(request.contains("Content-Type: application/json"));
    }
}
