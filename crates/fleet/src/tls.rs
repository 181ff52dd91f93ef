//! The fleet database link's TLS: the `sslmode` and `sslrootcert` a connection string asks for (libpq's names,
//! read here because the `postgres` crate knows only three of libpq's six modes and no `sslrootcert`), how a
//! connection then goes ([`Link`]), and the rustls client that checks the server's certificate against the site's
//! CA and the host name against the certificate (libpq's `verify-full`).
//!
//! The connector is `tokio-postgres-rustls` (jbg's, maintained): it is built on the rustls 0.23, tokio-rustls
//! 0.26 and sha2 the workspace already has, uses ring as crates/rpc does, and gives SCRAM its channel binding
//! (`tls-server-end-point`), so a password exchange cannot be relayed by a man in the middle either.
//!
//! Modes: `verify-full` (the default), and `require` and `verify-ca` taken as `verify-full` (hangwatch verifies
//! whatever it encrypts); `disable`, `allow` and `prefer` may leave the link unencrypted and are refused before
//! anything connects unless the site says `insecure_history = true` ([`crate::resolve`]). Over an unencrypted
//! link no password is ever sent. A Unix socket is not the network (and PostgreSQL has no TLS there): it is used
//! as it is.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use postgres::config::Host;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::{ClientConfig, RootCertStore};
use tokio_postgres_rustls::MakeRustlsConnect;

/// libpq's `sslmode` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Allow,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    /// The mode libpq calls `name`.
    pub fn from_name(name: &str) -> Option<SslMode> {
        Some(match name {
            "disable" => SslMode::Disable,
            "allow" => SslMode::Allow,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Allow => "allow",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    /// Whether a link in this mode may end up unencrypted (what only `insecure_history` allows).
    pub fn may_be_plain(self) -> bool {
        matches!(self, SslMode::Disable | SslMode::Allow | SslMode::Prefer)
    }
}

impl std::fmt::Display for SslMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The TLS parameters a connection string carries.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsParams {
    /// `sslmode` as written (`None`: not given); an unknown value is kept for the error that names it.
    pub sslmode: Option<String>,
    /// `sslrootcert`: a PEM file of the CA certificates to trust.
    pub sslrootcert: Option<PathBuf>,
}

impl TlsParams {
    /// The mode asked for: `default` when none is; an error naming the value libpq would not know either.
    pub fn mode(&self, default: SslMode) -> Result<SslMode, TlsError> {
        match &self.sslmode {
            None => Ok(default),
            Some(name) => SslMode::from_name(name).ok_or_else(|| TlsError::UnknownMode {
                value: name.clone(),
            }),
        }
    }
}

/// How a connection goes, decided from its settings before connecting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    /// Unix sockets only: not the network, no TLS there; the password may be sent.
    Local,
    /// TLS, the certificate checked against the CA and the host name against the certificate.
    Verified,
    /// Unencrypted (`sslmode=disable`, allowed by the site): no password is sent.
    Plain,
    /// `allow` or `prefer` (allowed by the site): verified TLS when the server offers TLS, else unencrypted
    /// without a password.
    Opportunistic,
}

impl Link {
    /// The link for `mode` to `hosts`.
    pub fn of(mode: SslMode, hosts: &[Host]) -> Link {
        if !hosts.is_empty() && hosts.iter().all(|h| matches!(h, Host::Unix(_))) {
            return Link::Local;
        }
        match mode {
            SslMode::Disable => Link::Plain,
            SslMode::Allow | SslMode::Prefer => Link::Opportunistic,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => Link::Verified,
        }
    }
}

/// Why the TLS settings could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("sslmode={value} is not a mode libpq knows: use verify-full (the default; leave sslmode out), or disable/prefer where the site allows an unencrypted link (insecure_history = true)")]
    UnknownMode { value: String },
    #[error("cannot read the fleet database's CA file {path} (history_ca, --history-ca or the URL's sslrootcert): give a readable PEM file of the CA that signed the server's certificate")]
    ReadCa {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the fleet database's CA file {path} holds no PEM certificate (-----BEGIN CERTIFICATE-----): give the CA that signed the server's certificate, in PEM")]
    NoCertificate { path: PathBuf },
    #[error("the fleet database's CA file {path} holds a certificate rustls cannot use as a root: give the CA that signed the server's certificate, in PEM")]
    BadCertificate {
        path: PathBuf,
        #[source]
        source: rustls::Error,
    },
    #[error("cannot set up TLS for the fleet database")]
    Setup {
        #[source]
        source: rustls::Error,
    },
}

/// The connection string without `sslmode` and `sslrootcert` (what the `postgres` crate parses), and those two.
/// Both forms libpq takes: a URL (`postgresql://...?sslmode=verify-full`) and `key=value` words. A string this
/// cannot read is returned as it is, for the `postgres` crate to name what is wrong with it.
pub fn split(conninfo: &str) -> (String, TlsParams) {
    let split = if conninfo.starts_with("postgresql://") || conninfo.starts_with("postgres://") {
        Some(split_url(conninfo))
    } else {
        split_words(conninfo)
    };
    split.unwrap_or_else(|| (conninfo.to_string(), TlsParams::default()))
}

/// `conninfo` (without TLS parameters, as [`split`] leaves it) with `sslmode` and, when given, `sslrootcert`.
pub fn join(conninfo: &str, mode: SslMode, ca: Option<&Path>) -> String {
    let is_url = conninfo.starts_with("postgresql://") || conninfo.starts_with("postgres://");
    let mut out = conninfo.to_string();
    if is_url {
        let mut sep = if conninfo.contains('?') { '&' } else { '?' };
        out.push(sep);
        out.push_str("sslmode=");
        out.push_str(mode.as_str());
        sep = '&';
        if let Some(ca) = ca {
            out.push(sep);
            out.push_str("sslrootcert=");
            out.push_str(&percent_encode(&ca.to_string_lossy()));
        }
    } else {
        if !out.trim().is_empty() {
            out.push(' ');
        }
        out.push_str("sslmode=");
        out.push_str(mode.as_str());
        if let Some(ca) = ca {
            let quoted = ca
                .to_string_lossy()
                .replace('\\', "\\\\")
                .replace('\'', "\\'");
            out.push_str(&format!(" sslrootcert='{quoted}'"));
        }
    }
    out
}

fn split_url(url: &str) -> (String, TlsParams) {
    let mut params = TlsParams::default();
    let Some((base, query)) = url.split_once('?') else {
        return (url.to_string(), params);
    };
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match percent_decode(key).as_str() {
            "sslmode" => params.sslmode = Some(percent_decode(value)),
            "sslrootcert" => params.sslrootcert = Some(PathBuf::from(percent_decode(value))),
            _ => kept.push(pair),
        }
    }
    let out = if kept.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    (out, params)
}

/// libpq's `key = value` words: a value is bare (up to white space) or in single quotes, `\` escaping the next
/// character in both. `None` for a string that is not that shape.
fn split_words(conninfo: &str) -> Option<(String, TlsParams)> {
    let mut params = TlsParams::default();
    let mut kept: Vec<&str> = Vec::new();
    let bytes = conninfo.as_bytes();
    let mut i = 0;
    loop {
        while i < bytes.len() && bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        if i == bytes.len() {
            break;
        }
        let start = i;
        while i < bytes.len() && bytes[i] != b'=' && !bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        let key = &conninfo[start..i];
        while i < bytes.len() && bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        if i == bytes.len() || bytes[i] != b'=' || key.is_empty() {
            return None;
        }
        i += 1;
        while i < bytes.len() && bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        let mut value = Vec::new();
        let quoted = bytes.get(i) == Some(&b'\'');
        if quoted {
            i += 1;
        }
        loop {
            match bytes.get(i) {
                None if quoted => return None,
                None => break,
                Some(b'\'') if quoted => {
                    i += 1;
                    break;
                }
                Some(c) if !quoted && c.is_ascii_whitespace() => break,
                Some(b'\\') => {
                    value.push(*bytes.get(i + 1)?);
                    i += 2;
                }
                Some(c) => {
                    value.push(*c);
                    i += 1;
                }
            }
        }
        let value = String::from_utf8_lossy(&value).into_owned();
        match key {
            "sslmode" => params.sslmode = Some(value),
            "sslrootcert" => params.sslrootcert = Some(PathBuf::from(value)),
            _ => kept.push(&conninfo[start..i]),
        }
    }
    Some((kept.join(" "), params))
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b'/' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The CA certificates in the PEM file `path`.
pub fn read_ca(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = std::fs::read(path).map_err(|source| TlsError::ReadCa {
        path: path.to_path_buf(),
        source,
    })?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
        .filter_map(Result::ok)
        .collect();
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            path: path.to_path_buf(),
        });
    }
    Ok(certs)
}

/// The rustls connector that trusts the certificates in `ca` (a PEM file), or webpki-roots' (Mozilla's) when
/// `None`, and checks the host name (rustls always does: verify-full).
pub fn connector(ca: Option<&Path>) -> Result<MakeRustlsConnect, TlsError> {
    let mut roots = RootCertStore::empty();
    match ca {
        Some(path) => {
            for cert in read_ca(path)? {
                roots.add(cert).map_err(|source| TlsError::BadCertificate {
                    path: path.to_path_buf(),
                    source,
                })?;
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|source| TlsError::Setup { source })?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(MakeRustlsConnect::new(config))
}

/// What went wrong in a TLS handshake, when rustls says: the certificate error among an error's causes.
pub fn rustls_cause<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = next {
        if let Some(found) = e.downcast_ref::<rustls::Error>() {
            return Some(found);
        }
        let inner = e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<rustls::Error>());
        if inner.is_some() {
            return inner;
        }
        next = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_parameters_are_taken_out_of_a_url_and_put_back() {
        let (rest, params) = split(
            "postgresql://hw@db:5432/fleet?connect_timeout=3&sslmode=prefer&sslrootcert=%2Fetc%2Fca%20x.pem",
        );
        assert_eq!(rest, "postgresql://hw@db:5432/fleet?connect_timeout=3");
        assert_eq!(params.sslmode.as_deref(), Some("prefer"));
        assert_eq!(params.sslrootcert, Some(PathBuf::from("/etc/ca x.pem")));
        let joined = join(&rest, SslMode::VerifyFull, Some(Path::new("/etc/ca x.pem")));
        assert_eq!(
            joined,
            "postgresql://hw@db:5432/fleet?connect_timeout=3&sslmode=verify-full&sslrootcert=/etc/ca%20x.pem"
        );
        let (again, params) = split(&joined);
        assert_eq!(again, rest);
        assert_eq!(params.mode(SslMode::Disable).unwrap(), SslMode::VerifyFull);
        assert_eq!(params.sslrootcert, Some(PathBuf::from("/etc/ca x.pem")));
        let (rest, params) = split("postgres://db/fleet?sslmode=disable");
        assert_eq!(rest, "postgres://db/fleet");
        assert_eq!(
            join(&rest, SslMode::Disable, None),
            "postgres://db/fleet?sslmode=disable"
        );
        assert_eq!(params.mode(SslMode::VerifyFull).unwrap(), SslMode::Disable);
    }

    #[test]
    fn tls_parameters_are_taken_out_of_key_value_words() {
        let (rest, params) = split(
            "host=db  sslmode = 'verify-ca' user=hw sslrootcert='/etc/it\\'s ca.pem' dbname=f",
        );
        assert_eq!(rest, "host=db user=hw dbname=f");
        assert_eq!(params.sslmode.as_deref(), Some("verify-ca"));
        assert_eq!(params.sslrootcert, Some(PathBuf::from("/etc/it's ca.pem")));
        let joined = join(
            &rest,
            SslMode::VerifyFull,
            Some(Path::new("/etc/it's ca.pem")),
        );
        assert_eq!(split(&joined).1.sslrootcert, params.sslrootcert);
        assert_eq!(split(&joined).0, rest);
        assert_eq!(join("", SslMode::Prefer, None), "sslmode=prefer");
        let broken = "host=db user='unterminated";
        assert_eq!(split(broken).0, broken);
    }

    #[test]
    fn only_three_modes_may_leave_the_link_plain_and_a_socket_is_local() {
        let tcp = [Host::Tcp("db".into())];
        let unix = [Host::Unix("/run/postgresql".into())];
        for (name, plain, link) in [
            ("disable", true, Link::Plain),
            ("allow", true, Link::Opportunistic),
            ("prefer", true, Link::Opportunistic),
            ("require", false, Link::Verified),
            ("verify-ca", false, Link::Verified),
            ("verify-full", false, Link::Verified),
        ] {
            let mode = SslMode::from_name(name).expect("a mode");
            assert_eq!(mode.as_str(), name);
            assert_eq!(mode.may_be_plain(), plain, "{name}");
            assert_eq!(Link::of(mode, &tcp), link, "{name}");
            assert_eq!(Link::of(mode, &unix), Link::Local, "{name}");
        }
        let params = TlsParams {
            sslmode: Some("verify_full".into()),
            sslrootcert: None,
        };
        let err = params.mode(SslMode::VerifyFull).expect_err("unknown");
        assert!(
            err.to_string().contains("verify-full (the default"),
            "{err}"
        );
    }

    #[test]
    fn a_ca_file_without_a_certificate_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.pem");
        std::fs::write(&path, "not a certificate\n").unwrap();
        let err = read_ca(&path).expect_err("no certificate");
        assert!(
            err.to_string().contains("holds no PEM certificate"),
            "{err}"
        );
        let err = connector(Some(&dir.path().join("missing.pem")))
            .err()
            .expect("missing");
        assert!(err.to_string().contains("missing.pem"), "{err}");
        assert!(connector(None).is_ok(), "webpki-roots");
    }
}
