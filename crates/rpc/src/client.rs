//! The agent's end of the connection: a channel to the coordinator with the token on every call, the message
//! size bound, and a deadline helper for unary calls.

use std::time::Duration;

use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use crate::pb::coordinator_client::CoordinatorClient;
use crate::{JobToken, SendToken, MAX_MESSAGE_BYTES};

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
}

/// Connects to the coordinator at `addr` (`HOST:PORT`, or a full `http://` URI) within `timeout`.
/// `token: None` sends no token at all (for tests of the refusal).
pub async fn connect(
    addr: &str,
    token: Option<&JobToken>,
    timeout: Duration,
) -> Result<Client, ConnectError> {
    let uri = if addr.contains("://") {
        addr.to_string()
    } else {
        format!("http://{addr}")
    };
    let endpoint = Endpoint::from_shared(uri)
        .map_err(|source| ConnectError::Address {
            addr: addr.into(),
            source,
        })?
        .connect_timeout(timeout)
        .tcp_nodelay(true)
        // A dead coordinator (or a cut link) shows up as a failed ping, not as a stream that never ends.
        .http2_keep_alive_interval(Duration::from_secs(5))
        .keep_alive_timeout(Duration::from_secs(10))
        .keep_alive_while_idle(true);
    let channel = endpoint
        .connect()
        .await
        .map_err(|source| ConnectError::Connect {
            addr: addr.into(),
            source,
        })?;
    let send = token.map_or_else(SendToken::none, SendToken::new);
    Ok(CoordinatorClient::with_interceptor(channel, send)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES))
}

/// A request that the server abandons (and the client gives up on) after `deadline` (the `grpc-timeout` header).
pub fn with_deadline<T>(message: T, deadline: Duration) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(deadline);
    request
}
