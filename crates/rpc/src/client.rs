//! The agent's end of the connection: TLS with the job's key (crate::tls) under gRPC, the token on every call,
//! the message size bound, and a deadline helper for unary calls.

use std::time::Duration;

use hyper_util::rt::TokioIo;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::pb::coordinator_client::CoordinatorClient;
use crate::tls::LinkKey;
use crate::{JobSecret, SendToken, MAX_MESSAGE_BYTES};

/// A coordinator client that sends the job token on every call.
pub type Client = CoordinatorClient<InterceptedService<Channel, SendToken>>;

/// The coordinator could not be reached.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("coordinator address {addr:?} is not a valid address (expected HOST:PORT)")]
    Address {
        addr: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("could not connect to the coordinator at {addr}")]
    Connect {
        addr: String,
        #[source]
        source: tonic::transport::Error,
    },
    /// Something answered, but it did not prove that it holds this job's key: nothing was sent to it.
    #[error(
        "the listener at {addr} did not prove that it holds this job's key (key {key_id}; {reason}): it is not \
         this job's coordinator (one started with another token file or job id, or another program on that port); \
         nothing was sent to it"
    )]
    NotTheJobs {
        addr: String,
        key_id: String,
        reason: String,
    },
}

/// Why one dial failed, as the connector reports it to the channel (and [`connect`] reads it back).
#[derive(Debug, thiserror::Error)]
enum DialError {
    #[error("{0:?} is not HOST:PORT")]
    Address(String),
    #[error("TCP connection failed")]
    Tcp(#[source] std::io::Error),
    /// The peer spoke, but not TLS with the job's key.
    #[error("TLS handshake failed: {0}")]
    NotTheKey(rustls::Error),
    /// The connection broke during the handshake (closed, reset): the coordinator may be busy; try again.
    #[error("the connection closed during the TLS handshake")]
    Broken(#[source] std::io::Error),
}

/// Connects to the coordinator at `addr` (`HOST:PORT`) within `timeout`, TCP and TLS handshake included.
pub async fn connect(
    addr: &str,
    secret: &JobSecret,
    timeout: Duration,
) -> Result<Client, ConnectError> {
    let host_port = addr.strip_prefix("http://").unwrap_or(addr).to_string();
    // The channel speaks HTTP/2 over the stream the connector returns; the scheme only tells it not to add TLS.
    let endpoint = Endpoint::from_shared(format!("http://{host_port}"))
        .map_err(|source| ConnectError::Address {
            addr: addr.into(),
            source,
        })?
        .connect_timeout(timeout)
        // A dead coordinator (or a cut link) shows up as a failed ping, not as a stream that never ends.
        .http2_keep_alive_interval(Duration::from_secs(5))
        .keep_alive_timeout(Duration::from_secs(10))
        .keep_alive_while_idle(true);
    let tls = tokio_rustls::TlsConnector::from(secret.key().client_config());
    let dial = tower::service_fn(move |uri: Uri| {
        let tls = tls.clone();
        async move {
            let authority = uri
                .authority()
                .map(|a| a.as_str().to_string())
                .ok_or_else(|| DialError::Address(uri.to_string()))?;
            let tcp = tokio::net::TcpStream::connect(&authority)
                .await
                .map_err(DialError::Tcp)?;
            let _ = tcp.set_nodelay(true);
            let stream = tls
                .connect(LinkKey::server_name(), tcp)
                .await
                .map_err(handshake_error)?;
            Ok::<_, DialError>(TokioIo::new(stream))
        }
    });
    let channel = endpoint
        .connect_with_connector(dial)
        .await
        .map_err(|source| match find_dial_error(&source) {
            Some(DialError::NotTheKey(reason)) => ConnectError::NotTheJobs {
                addr: addr.into(),
                key_id: secret.key().id(),
                reason: reason.to_string(),
            },
            _ => ConnectError::Connect {
                addr: addr.into(),
                source,
            },
        })?;
    Ok(
        CoordinatorClient::with_interceptor(channel, SendToken::new(secret.token()))
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES),
    )
}

/// A TLS error from the peer's answers means "not the job's key"; a closed or reset connection does not.
fn handshake_error(e: std::io::Error) -> DialError {
    match crate::tls::tls_error(&e) {
        Some(tls) => DialError::NotTheKey(tls.clone()),
        None => DialError::Broken(e),
    }
}

fn find_dial_error<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a DialError> {
    let mut next = Some(e);
    while let Some(e) = next {
        if let Some(dial) = e.downcast_ref::<DialError>() {
            return Some(dial);
        }
        next = e.source();
    }
    None
}

/// A request that the server abandons (and the client gives up on) after `deadline` (the `grpc-timeout` header).
pub fn with_deadline<T>(message: T, deadline: Duration) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(deadline);
    request
}
