//! The link's TLS: one Ed25519 key pair per job, derived from the token file and the job id, and TLS 1.3 in which
//! each end proves that it holds that key before the other sends or obeys anything (docs/multi-node.md, "The
//! link").
//!
//! There is no certificate authority and no certificate: both ends present the job's public key as a raw public
//! key (RFC 7250) and accept a peer only when its key is that same key and its handshake signature checks out
//! with it. Whoever lacks the token or the job id derives another key and fails the handshake; a recorded session
//! replayed later fails too (TLS 1.3's fresh key exchange). The bearer token still travels on every call, inside
//! the encrypted link, so that the two checks are independent.

use std::sync::Arc;

use ring::hkdf;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::AlwaysResolvesClientRawPublicKeys;
use rustls::crypto::{verify_tls13_signature_with_raw_key, CryptoProvider};
use rustls::pki_types::{
    CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, SubjectPublicKeyInfoDer,
    UnixTime,
};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::AlwaysResolvesServerRawPublicKeys;
use rustls::sign::CertifiedKey;
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, DistinguishedName, ServerConfig,
    SignatureScheme,
};

use crate::JobToken;

/// The name an agent asks for in its handshake. Never checked: the peer is known by its key, not by a name.
pub const LINK_SERVER_NAME: &str = "hangwatch-coordinator";

/// Separates this use of the token from any other (a later link version derives another key).
const KEY_SALT: &[u8] = b"hangwatch agent-coordinator link v1";

/// PKCS#8 v1 wrapping of an Ed25519 private key (RFC 8410, section 7): this prefix, then the 32-byte seed.
/// Written out because the key comes from a derivation, and neither ring nor rustls builds PKCS#8 from a seed.
const ED25519_PKCS8_PREFIX: [u8; 16] = [
    0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20,
];

/// The link key could not be set up (a bug or a broken build, never the user's input).
#[derive(Debug, thiserror::Error)]
pub enum LinkKeyError {
    #[error("cannot derive the job's link key")]
    Derive,
    #[error("cannot set up TLS for the link")]
    Tls(#[source] rustls::Error),
}

/// The job's link key and the TLS configurations built on it. Cheap to clone.
#[derive(Clone)]
pub struct LinkKey {
    /// The public key as a SubjectPublicKeyInfo: what a peer must present.
    public: Arc<[u8]>,
    client: Arc<ClientConfig>,
    server: Arc<ServerConfig>,
}

impl std::fmt::Debug for LinkKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LinkKey({})", self.id())
    }
}

impl LinkKey {
    /// The key of job `job_id` under `token`: HKDF-SHA256 over the token, with the job id as context, gives the
    /// Ed25519 seed. The same inputs give the same key on every node; any other token or job id, another key.
    pub fn derive(token: &JobToken, job_id: &str) -> Result<Self, LinkKeyError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, KEY_SALT).extract(token.secret().as_bytes());
        let info = [job_id.as_bytes()];
        let okm = prk
            .expand(&info, SeedLen)
            .map_err(|_| LinkKeyError::Derive)?;
        let mut pkcs8 = ED25519_PKCS8_PREFIX.to_vec();
        pkcs8.extend_from_slice(&[0; 32]);
        okm.fill(&mut pkcs8[ED25519_PKCS8_PREFIX.len()..])
            .map_err(|_| LinkKeyError::Derive)?;
        let private = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(pkcs8));
        let signing = provider
            .key_provider
            .load_private_key(private)
            .map_err(LinkKeyError::Tls)?;
        let public = signing.public_key().ok_or(LinkKeyError::Derive)?;
        let public: Arc<[u8]> = public.as_ref().into();
        let certified = Arc::new(CertifiedKey::new(
            vec![CertificateDer::from(public.to_vec())],
            signing,
        ));
        let verifier = Arc::new(SameKey {
            public: Arc::clone(&public),
            provider: Arc::clone(&provider),
        });
        let mut client = ClientConfig::builder_with_provider(Arc::clone(&provider))
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(LinkKeyError::Tls)?
            .dangerous()
            .with_custom_certificate_verifier(verifier.clone())
            .with_client_cert_resolver(Arc::new(AlwaysResolvesClientRawPublicKeys::new(
                Arc::clone(&certified),
            )));
        client.alpn_protocols = vec![b"h2".to_vec()];
        // Each connection proves the key afresh: no session tickets that a copy of the traffic could resume.
        client.resumption = rustls::client::Resumption::disabled();
        let mut server = ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(LinkKeyError::Tls)?
            .with_client_cert_verifier(verifier)
            .with_cert_resolver(Arc::new(AlwaysResolvesServerRawPublicKeys::new(certified)));
        server.alpn_protocols = vec![b"h2".to_vec()];
        server.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
        server.send_tls13_tickets = 0;
        Ok(Self {
            public,
            client: Arc::new(client),
            server: Arc::new(server),
        })
    }

    /// A short public name of the key (the first bytes of the public key, in hex), safe to print: two ends that
    /// print different ids were given different token files or job ids.
    pub fn id(&self) -> String {
        let key = &self.public[self.public.len().saturating_sub(32)..];
        key.iter().take(4).map(|b| format!("{b:02x}")).collect()
    }

    /// What an agent dials with.
    pub fn client_config(&self) -> Arc<ClientConfig> {
        Arc::clone(&self.client)
    }

    /// What the coordinator accepts with.
    pub fn server_config(&self) -> Arc<ServerConfig> {
        Arc::clone(&self.server)
    }

    /// The name an agent sends in its handshake.
    pub fn server_name() -> ServerName<'static> {
        ServerName::try_from(LINK_SERVER_NAME).unwrap_or_else(|_| {
            // A constant DNS name: always valid.
            ServerName::IpAddress(std::net::Ipv4Addr::LOCALHOST.into())
        })
    }
}

/// The TLS error inside an I/O error from tokio-rustls (the peer's answers were not TLS with the job's key), as
/// opposed to a connection that closed or broke.
pub(crate) fn tls_error(e: &std::io::Error) -> Option<&rustls::Error> {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
}

struct SeedLen;

impl hkdf::KeyType for SeedLen {
    fn len(&self) -> usize {
        32
    }
}

/// Accepts a peer (coordinator or agent) only when it presents the job's own public key and signs the handshake
/// with it.
#[derive(Debug)]
struct SameKey {
    public: Arc<[u8]>,
    provider: Arc<CryptoProvider>,
}

impl SameKey {
    fn check_key(&self, presented: &CertificateDer<'_>) -> Result<(), rustls::Error> {
        if presented.as_ref() == &*self.public {
            Ok(())
        } else {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::ApplicationVerificationFailure,
            ))
        }
    }

    fn check_signature(
        &self,
        message: &[u8],
        presented: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.check_key(presented)?;
        verify_tls13_signature_with_raw_key(
            message,
            &SubjectPublicKeyInfoDer::from(presented.as_ref()),
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }
}

/// The configs offer TLS 1.3 only; a 1.2 signature never reaches a verifier.
fn tls13_only() -> rustls::Error {
    rustls::Error::General("the link speaks TLS 1.3 only".into())
}

impl ServerCertVerifier for SameKey {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.check_key(end_entity)
            .map(|()| ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(tls13_only())
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.check_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        vec![SignatureScheme::ED25519]
    }

    fn requires_raw_public_keys(&self) -> bool {
        true
    }
}

impl ClientCertVerifier for SameKey {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.check_key(end_entity)
            .map(|()| ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(tls13_only())
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.check_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        vec![SignatureScheme::ED25519]
    }

    fn requires_raw_public_keys(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(token: &str, job: &str) -> LinkKey {
        LinkKey::derive(&JobToken::new(token).expect("token"), job).expect("key")
    }

    #[test]
    fn the_key_depends_on_the_token_and_on_the_job_and_on_nothing_else() {
        let token = "3f9a0c7e5b21d84c6e0f1a9b7d3c2e58";
        let a = key(token, "job-1");
        assert_eq!(
            a.public,
            key(&format!("{token}\n"), "job-1").public,
            "same inputs"
        );
        assert_ne!(a.public, key(token, "job-2").public, "another job");
        assert_ne!(
            a.public,
            key("3f9a0c7e5b21d84c6e0f1a9b7d3c2e59", "job-1").public,
            "another token"
        );
        assert_eq!(a.id().len(), 8);
        assert_eq!(format!("{a:?}"), format!("LinkKey({})", a.id()));
    }
}
