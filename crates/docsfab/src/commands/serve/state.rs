//! What the handlers of `docsfab serve` share: the job service (`crate::app::jobs`), and what
//! the HTTP layer itself needs to end its long requests.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::app::jobs::service::Service;

pub struct Shared {
    pub service: Arc<Service>,
    /// Cancelled when the HTTP server stops: ends the event streams and body reads.
    pub stopping: CancellationToken,
    /// How long a request body may take to arrive.
    pub body_timeout: Duration,
}
